"""Chapter 99 (mclib/chapters/ch99_scorecard.py): the counts the closing sentence glues, the
coloured table, on synthetic rows and on a smoke run's scorecard."""

import copy

from mclib.book import scorecard, scorecard_rules, scorecard_tables
from mclib.chapters import ch99_scorecard as chapter
from mclib.core.ending import RunEnd
from mclib.core.paper import profile as paper_profile


def _rows(tmp_path):
    scorecard.record(tmp_path, "E1", "a", 1.0, 1.0, reading="equal")  # matches
    scorecard.record(tmp_path, "E2", "b", 1.0, 3.0, reading="far")  # differs
    scorecard.record(
        tmp_path, "E3", "c", None, 0.2, kind="direction", reference=0.5, sense="below"
    )  # same direction
    scorecard.record(tmp_path, "E4", "d", None, None, na="nothing to test")  # n/a
    scorecard.record(
        tmp_path,
        "E20",
        "e",
        None,
        1.13,
        se=0.41,
        kind="direction",
        reference=1.0,
        sense="below",
        margin=scorecard_rules.CUT,
    )  # too close to tell
    return scorecard.load(tmp_path)


def test_counts_and_table(ch, tmp_path):
    rows = _rows(tmp_path)
    glued = chapter.glued(ch, rows)
    assert {k: glued[k] for k in chapter.COUNTED} == {
        "n_match": 1,
        "n_same": 1,
        "n_order": 0,
        "n_differ": 1,
        "n_close": 1,
        "n_na": 1,
        "n_cannot": 0,
    }
    assert glued["n_rows"] == 5 and glued["task_note"] == scorecard_tables.task_note(ch.cfg)
    assert glued["fig_scorecard"].axes
    html = chapter.scorecard_shown(rows).to_html()
    assert "The scorecard: 5 claims of the paper." in html and "font-weight: bold" in html
    assert chapter.glued(ch, [])["n_rows"] == 0  # an empty scorecard still reads


def test_findings_of_ours_are_shown_and_counted_apart(ch, tmp_path):
    rows = _rows(tmp_path)
    scorecard.record(
        tmp_path,
        "B1",
        "lead",
        None,
        0.95,
        kind="finding",
        reference=0.9,
        sense="above",
        margin=scorecard_rules.CUT,
    )  # holds
    scorecard.record(
        tmp_path, "F1", "spread", None, 0.3, kind="finding", reference=0.0, sense="below"
    )  # fails
    rows = scorecard.load(tmp_path)
    glued = chapter.glued(ch, rows)
    # the paper's counts are those of the four rows of the paper, as without the findings
    assert {k: glued[k] for k in chapter.COUNTED} == {
        "n_match": 1,
        "n_same": 1,
        "n_order": 0,
        "n_differ": 1,
        "n_close": 1,
        "n_na": 1,
        "n_cannot": 0,
    } and glued["n_rows"] == 5
    assert {k: glued[k] for k in chapter.COUNTED_OWN} == {
        "n_own_holds": 1,
        "n_own_fails": 1,
        "n_own_close": 0,
        "n_own_na": 0,
    }
    assert glued["n_own"] == 2 and glued["landing_model"].startswith(
        "Of the 5 claims about the model, 2 reproduced"
    )
    assert "The scorecard: 5 claims of the paper." in chapter.scorecard_shown(rows).to_html()
    own = chapter.own_shown(rows)
    assert list(own.data["id"]) == ["B1", "F1"] and "paper" not in own.data.columns
    assert "2 findings tested here" in own.to_html()


def test_the_page_reads_the_run_s_scorecard(ch, tmp_path):
    other = copy.copy(ch)
    other.run_dir = tmp_path
    rows = _rows(tmp_path)
    assert chapter.rows(other) == rows
    assert "<caption>Findings, profile smoke" in chapter.findings_shown(other, rows).to_html()
    shown = chapter.departures_shown(ch)
    departs = {k: (a, b) for k, a, b in shown.data[["key", "profile", "paper"]].itertuples(index=False)}
    # smoke keeps the paper's task (n 7, rank 2, p_mask 0.3) and shrinks its model and recipe
    assert not any(k.startswith("data.") for k in departs) and all(a != b for a, b in departs.values())
    assert {
        "model.layers": (2, 4),
        "model.heads": (2, 8),
        "model.hidden": (16, 768),
        "model.intermediate": (32, 3072),
        "train.steps": (60, 50_000),
        "train.batch": (32, 256),
        "train.lr": (1e-3, 1e-4),
    }.items() <= departs.items()
    assert ">model.hidden</td>" in shown.to_html() and ">768</td>" in shown.to_html()
    paper = copy.copy(ch)
    paper.cfg = paper_profile()
    paper.end = RunEnd(ended="steps", step=50_000, drop=None, steps=50_000, until="steps")
    assert chapter.departures_shown(
        paper
    ).data.empty  # the paper, trained its 50 000 steps, departs from nothing
    paper.end = RunEnd(ended="cut", step=21_000, drop=13_000, steps=50_000, until="steps")
    (row,) = chapter.departures_shown(paper).data.to_dict("records")  # a lease's deadline cut it: a departure
    assert row == {
        "key": "where training ended",
        "paper": "after its 50,000 steps",
        "profile": "cut at step 21,000 (was cut at step 21,000 of 50,000 by its wall-clock deadline)",
    }
    assert chapter.rules_shown().to_html().count("<tr>") == len(scorecard_rules.RULES) + 1


def _landing_box(glue: dict) -> str:
    """The landing page's box (book/index.md) as a reader sees it, each glue replaced by its text."""
    import re

    from mclib.book.runner import REPO

    index = (REPO / "book" / "index.md").read_text()
    box = index[
        index.index("```{admonition} What this build found") : index.index(
            "**What reproduced and what did not"
        )
    ]
    box = re.sub(r"\{glue:text\}`_executed/99_scorecard\.ipynb::(\w+):s`", lambda m: glue[m.group(1)], box)
    return re.sub(r"\]\([^)]*\)", "]", box.split("\n", 2)[2].rsplit("```", 1)[0])  # links read as their words


def test_the_landing_box_is_short_agrees_in_number_and_says_each_lead_once():
    """2026-11-28: the box was ~690 words, opened a paragraph "The paper's own setting: The paper's
    own setting", and said "1 do not and 1 have nothing to test here"."""
    from mclib.core.config import load_profile, profile_path

    verdicts = ["matches"] * 41 + ["differs"] * 23 + ["too close to tell"] * 20 + ["n/a"] * 12
    rows = [
        {"id": f"E{1 + i % 20}", "quantity": f"q{i}", "verdict": v, "reading": "", "chapter": "01_train"}
        for i, v in enumerate(verdicts)
    ]
    rows += [
        {"id": f"F{i}", "quantity": "f", "kind": "finding", "verdict": v, "reading": ""}
        for i, v in enumerate(["holds"] * 5 + ["fails", "too close to tell", "n/a"])
    ]
    theirs = [{**r, "provisional": True} if i % 3 else r for i, r in enumerate(rows)]
    glue = {
        **scorecard_tables.headline(rows),
        "landing_paper": chapter.landing_paper(theirs),
        "departures_count": scorecard_tables.departures_count(load_profile(profile_path("cpu"))),
    }
    box = _landing_box(glue)
    words = [w for w in box.split() if w != "-"]  # the bullets are no words
    assert len(words) <= 250, len(words)
    assert box.count("paper's own setting") == 1  # the lead, said once
    assert "5 hold, 1 does not, 1 is too close to tell and 1 has nothing to test here" in box
    assert "do not and 1 have" not in box
    assert "not run for this book yet" in _landing_box({**glue, "landing_paper": chapter.landing_paper([])})


def test_the_closing_counts_agree_with_their_numbers():
    """2026-11-28: "1 keep its order"."""
    counts = {**{k: 1 for k in chapter.COUNTED}, "n_differ": 2, "n_provisional": 0}
    text = chapter.counts_text(counts, [*chapter.COUNTED, "n_provisional"])
    assert text.startswith(
        "1 matches the paper's number, 1 points the way the paper says, 1 keeps the paper's order, "
        "2 differ, 1 is too close to tell"
    ) and text.endswith("and 0 are provisional")
    own = chapter.counts_text(
        {"n_own_holds": 5, "n_own_fails": 1, "n_own_close": 2, "n_own_na": 1}, chapter.COUNTED_OWN
    )
    assert own == "5 hold, 1 does not, 2 are too close to tell and 1 has nothing to test here"
