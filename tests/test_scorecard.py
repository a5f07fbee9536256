"""Every kind of claim has a rule that can fail: a consistent value gets the positive
verdict, a contradicting one "differs", and one whose interval (± two standard errors)
reaches both bands "too close to tell"."""

import math

import pytest
from sources import literal_strings

from mclib.book import scorecard as S
from mclib.book import scorecard_rules as R
from mclib.book import scorecard_tables as T


def test_number_rule():
    assert R.number(0.30, 0.31) == "matches"  # within 10 % of the paper's value
    assert R.number(0.30, 0.45) == "differs"  # 50 % off: the old blanket tolerance is gone
    assert R.number(0.30, 0.45, se=0.05) == "differs"  # 0.15 > 2 x 0.05 + 0.03
    assert R.number(0.30, 0.45, se=0.07) == R.CLOSE  # 0.31-0.59 reaches 0.27-0.33 and beyond it
    assert R.number(0.30, 0.45, spread=0.07) == R.CLOSE  # seed spread widens the interval alike
    assert R.number(0.30, 0.31, se=0.005) == "matches"  # 0.30-0.32 inside 0.27-0.33
    assert R.number(0.30, 0.31, se=0.02) == R.CLOSE  # 0.27-0.35: agrees or not, it cannot tell
    assert R.number(0.30, None) == "differs" and R.number(None, 0.3) == "n/a"


def test_ratio_rule():
    assert R.ratio(1.10, 1.2) == "matches"  # E4's "no significant effect" (paper: 1.10)
    assert R.ratio(1.10, 4.4) == "differs"  # ablating raises L_mask 4.4x
    assert R.ratio(17.0, 11.0) == "differs" and R.ratio(17.0, 11.0, se=2.0) == R.CLOSE
    assert R.ratio(17.0, 16.0, se=0.5) == "matches"  # ln 16 ± 0.06 inside ln 17 ± ln 1.25
    assert R.ratio(1.0, 0.5) == "differs"  # symmetric on the log scale
    assert R.ratio(1.0, -1.0) == "differs" and R.ratio(None, 2.0) == "n/a"


def test_direction_rule():
    assert R.direction(0.05, 0.5, "below") == "same direction"
    assert R.direction(0.9, 0.5, "below") == "differs"  # the other side
    assert R.direction(0.46, 0.5, "below") == "differs"  # within the 10 % margin: too close to tell
    assert R.direction(0.40, 0.5, "below", se=0.04) == R.CLOSE  # 0.32-0.48 reaches below 0.45 and above it
    assert R.direction(0.40, 0.5, "below", se=0.02) == "same direction"  # 0.36-0.44, all below 0.45
    assert R.direction(0.48, 0.5, "below", se=0.01) == "differs"  # 0.46-0.50: none of it below 0.45
    assert R.direction(2.0, 1.0, "above") == "same direction" and R.direction(None, 1.0, "above") == "differs"
    with pytest.raises(ValueError):
        R.direction(0.1, 0.5, "below", paper=0.7)  # the row misstates the paper's claim
    with pytest.raises(ValueError):
        R.direction(0.1, 0.5, "under")


def test_ordering_rule():
    order = [["mlp", "token"], ["attention"], ["positional"]]
    assert R.ordering({"mlp": 10, "token": 20, "attention": 300, "positional": 900}, order) == "same order"
    assert R.ordering({"mlp": 10, "token": 20, "attention": 900, "positional": 300}, order) == "differs"
    assert R.ordering({"mlp": 10, "token": 20, "attention": 300, "positional": None}, order) == "same order"
    assert R.ordering({"mlp": 10, "token": 20, "attention": None, "positional": None}, order) == "differs"
    assert (
        R.ordering({"mlp": 10, "token": 20, "attention": 300, "positional": 320}, order) == "differs"
    )  # a tie
    assert R.ordering({"aligned": 200, "drop": 250}, [["aligned"], ["drop"]]) == "same order"
    assert R.ordering({"aligned": 260, "drop": 250}, [["aligned"], ["drop"]]) == "differs"
    assert (
        R.ordering({"aligned": 200, "drop": 250}, [["aligned"], ["drop"]], se=5) == "same order"
    )  # 40 > 25 + 10
    assert (
        R.ordering({"aligned": 200, "drop": 250}, [["aligned"], ["drop"]], se=20) == R.CLOSE
    )  # 50 ± 40 vs 25
    assert (
        R.ordering({"aligned": 240, "drop": 250}, [["aligned"], ["drop"]], se=5) == "differs"
    )  # 10 + 10 <= 25


def test_too_close_to_tell_the_issue_s_cases():
    """The rows the book wrote "unlike the paper" while their interval reached both bands
    (2026-11-27): E20's ratios below 1 (cut-off, no margin) and E16's BERT L / solver L above 1."""
    e20 = dict(kind="direction", reference=1.0, sense="below", margin=R.CUT)
    assert R.judge(ours=1.13, se=0.41, **e20) == R.CLOSE and R.judge(ours=1.79, se=0.82, **e20) == R.CLOSE
    assert (
        R.judge(ours=1.79, se=0.2, **e20) == "differs"
        and R.judge(ours=0.5, se=0.2, **e20) == "same direction"
    )
    e16 = dict(kind="direction", reference=1.0, sense="above")  # BERT − solver 0.0002 ± 0.0012 on L ≈ 0.01
    assert R.judge(ours=1.02, se=0.12, **e16) == R.CLOSE
    assert (
        R.judge(ours=1.02, se=0.01, **e16) == "differs"
        and R.judge(ours=1.5, se=0.1, **e16) == "same direction"
    )
    assert R.agreement(R.CLOSE) == "too close to tell" and R.CLOSE in R.VERDICTS


def test_too_close_is_counted_apart():
    rows = [
        {"id": "E20", "quantity": "a", "verdict": R.CLOSE, "reading": ""},
        {"id": "E20", "quantity": "b", "verdict": "same direction", "reading": ""},
        {"id": "E3", "quantity": "c", "verdict": "matches", "reading": ""},
        {"id": "E4", "quantity": "d", "verdict": "differs", "reading": "", "paper": 1.0, "ours": 3.0},
    ]
    t = T.tally(rows)
    assert (t["reproduced"], t["differ"], t["too close"], t["not tested"]) == (2, 1, 1, 0)
    h = T.headline(rows)
    assert "1 differs, 1 is too close to tell and 0 have nothing to test here" in h["landing_model"]
    assert h["landing_reproduced"] == "Reproduced in full: E3."  # E20 has a row that cannot tell
    assert "1 too close to tell" in T.setting_counts(rows, "the laptop edition")
    assert T.findings(rows).set_index("experiment").loc["E20", "too close to tell"] == 1
    assert "1 is too close to tell" in T.tally_text(rows, "here")


def test_by_construction_and_na(tmp_path):
    assert R.judge("by construction", paper=0.014, ours=0.009) == "cannot fail"
    row = S.record(
        tmp_path,
        "E4",
        "ablated / unablated L_mask",
        1.1,
        None,
        kind="ratio",
        na="no head is labelled 'other'",
    )
    assert row["verdict"] == "n/a" and "no head" in row["reading"]
    with pytest.raises(ValueError):
        R.judge("vibes", paper=1.0, ours=1.0)


def test_record_uses_the_kind(tmp_path):
    S.record(tmp_path, "E3", "r", 17.0, 4.4, kind="ratio")
    S.record(tmp_path, "E1", "d", ours=0.05, kind="direction", reference=0.5, sense="below")
    S.record(tmp_path, "E15", "o", kind="ordering", values={"a": 1, "b": 9}, order=[["b"], ["a"]])
    rows = S.load(tmp_path)
    assert [(r["id"], r["kind"], r["verdict"]) for r in rows] == [
        ("E1", "direction", "same direction"),
        ("E3", "ratio", "differs"),
        ("E15", "ordering", "differs"),
    ]
    assert all(set(r) - set(S.RULE_FIELDS) == set(S.FIELDS) for r in rows)
    # what each rule needs besides the numbers is kept, so a recorded row can be judged again as it was
    assert (rows[0]["reference"], rows[0]["sense"]) == (0.5, "below") and "margin" not in rows[0]
    assert (rows[2]["values"], rows[2]["order"]) == ({"a": 1, "b": 9}, [["b"], ["a"]])
    assert [R.row_verdict(r) for r in rows] == [r["verdict"] for r in rows]


def test_rules_table_states_every_rule():
    t = R.rules_table()
    assert list(t["kind"]) == list(R.RULES) and all(len(r) > 80 for r in t["rule"])
    assert t.set_index("kind").loc["ratio", "margin"] == "25%"
    assert "10 %" in t.set_index("kind").loc["number", "rule"]


def test_findings_table():
    rows = [
        {"id": "E4", "quantity": "q", "verdict": "differs", "reading": "4.4x", "paper": 1.1, "ours": 4.4},
        {"id": "E3", "quantity": "p", "verdict": "matches", "reading": "", "chapter": "03_heads"},
        {"id": "E8", "quantity": "all", "verdict": "cannot fail", "reading": ""},
    ]
    f = T.findings(rows)
    assert list(f["experiment"]) == ["E3", "E4", "E8"]
    assert (
        f.set_index("experiment").loc["E4", "why it differs"] == "not traced"
    )  # it differs, and nothing says why
    assert f.set_index("experiment").loc["E3", "why it differs"] == "—"
    assert f.set_index("experiment").loc["E8", "not tested"] == 1 and math.isclose(f["rows"].sum(), 3)
    assert (
        list(T.findings(rows, link="_executed/")["experiment"])[0]
        == '<a href="_executed/03_heads.html">E3</a>'
    )


def test_the_scorecard_order_and_links_do_not_depend_on_which_chapter_finished_first(tmp_path):
    """Chapters run side by side: 07_beyond may record its E1 row before 01_train records its own.
    The rows still stand in the book's order, and E1 links to 01_train."""
    S.record(tmp_path, "E2", "b", 1.0, 1.0, kind="ratio", chapter="02_copying")
    S.record(tmp_path, "E1", "over seeds", 1.0, 1.0, kind="ratio", chapter="07_beyond")
    S.record(tmp_path, "E1", "first", 1.0, 1.0, kind="ratio", chapter="01_train")
    S.record(tmp_path, "E1", "second", 1.0, 1.0, kind="ratio", chapter="01_train")
    rows = S.load(tmp_path)
    assert [(r["id"], r["quantity"]) for r in rows] == [
        ("E1", "first"),
        ("E1", "second"),
        ("E1", "over seeds"),
        ("E2", "b"),
    ]
    assert list(T.findings(rows[::-1], link="")["experiment"])[0] == '<a href="01_train.html">E1</a>'


def test_an_experiment_links_to_the_chapter_that_holds_its_differing_rows():
    """2026-11-28: E3 linked to chapter 02, where its rows agree, while its four differing rows
    are in chapter 03."""
    row = lambda chapter, verdict: {
        "id": "E3",
        "quantity": f"{chapter} {verdict}",
        "verdict": verdict,
        "reading": "",
        "chapter": chapter,
    }
    rows = [row("02_copying", "matches"), row("02_copying", "n/a")] + [row("03_heads", "differs")] * 4
    assert T.findings(rows, link="")["experiment"][0] == '<a href="03_heads.html">E3</a>'
    assert T.home([row("02_copying", "matches"), row("03_heads", "too close to tell")]) == "03_heads"
    assert (
        T.home([row("03_heads", "matches"), row("02_copying", "matches")]) == "02_copying"
    )  # the first in the book


def test_counts_agree_with_their_nouns_and_small_percentages_do_not_show_zero():
    t = {"reproduced": 1, "differ": 1, "too close": 1, "not tested": 1, "provisional": 1}
    assert T.counts_clause(t) == (
        "1 reproduced, 1 differs, 1 is too close to tell, 1 has nothing to test here and 1 "
        "is provisional (read at the end of a run cut short)"
    )
    assert T.counts_clause({**t, "differ": 2, "not tested": 3, "provisional": 0}).endswith(
        "2 differ, 1 is too close to tell and 3 have nothing to test here"
    )
    assert T.percent(0.0004) == "less than 0.05%" and T.percent(0.013) == "1.3%" and T.percent(0.0) == "0.0%"
    rows = [{"id": "E1", "quantity": "q", "verdict": "differs", "reading": ""}]
    assert T.setting_counts(rows, "on GPU leases").endswith(
        "0 provisional (read at the end of a run cut short), of 1 claim."
    )
    assert "1 differs," in T.setting_counts(rows, "on GPU leases")


def test_a_cause_is_kept_where_its_row_differs_or_cannot_tell_and_the_findings_name_it_once(tmp_path):
    why = "the small model copies less precisely"
    far = S.record(tmp_path, "E7", "ratio", paper=2.6, ours=58.6, kind="ratio", se=1.0, cause=why)
    near = S.record(tmp_path, "E7", "level", paper=2.6, ours=2.6, kind="ratio", se=0.01, cause=why)
    close = S.record(tmp_path, "E7", "other", paper=2.6, ours=3.0, kind="ratio", se=0.4, cause=why)
    assert (far["verdict"], far["cause"]) == (
        "differs",
        why,
    ) and "cause" not in near  # a cause of nothing is not kept
    assert (close["verdict"], close["cause"]) == (R.CLOSE, why)
    assert T.findings(S.load(tmp_path)).loc[0, "why it differs"] == why  # named once
    assert T.causes([{**far, "provisional": True}]) == "—"  # a provisional row leaves it open


def test_causes_worded_alike_but_for_their_numbers_are_said_once_with_how_many_rows_say_them():
    row = lambda cause: {"id": "E2", "verdict": R.CLOSE, "cause": cause}
    swings = "copying swings (steps 2,000-4,000 run from {} to {}x the paper's)"
    rows = [
        row(swings.format(0.48, 4.7)),
        row(swings.format(0.9, 4.6)),
        row(swings.format(2.3, 11)),
        row("the raw L_mask is 1.4x uniform's, higher"),
        row("the raw L_mask is 0.66x uniform's, lower"),
    ]
    assert T.causes(rows) == (
        f"{swings.format(0.48, 4.7)} (and 2 more rows alike, each with its own numbers in the "
        "scorecard); the raw L_mask is 1.4x uniform's, higher; the raw L_mask is 0.66x uniform's, "
        "lower"
    )  # other words: said apart
    assert T.causes(rows[:1] * 3) == swings.format(0.48, 4.7)  # the same cause: once, no count


def test_agreement_says_each_verdict_in_the_chapters_words():
    assert {v: R.agreement(v) for v in R.VERDICTS} == {
        "matches": "as in the paper",
        "same direction": "as in the paper",
        "same order": "as in the paper",
        "differs": "unlike the paper",
        R.CLOSE: "too close to tell",
        "n/a": "not tested here",
        "cannot fail": "true by construction",
        "holds": "holds here",
        "fails": "does not hold here",
    }
    assert not any(
        "paper" in R.agreement(v) for v in ("holds", "fails")
    )  # a finding of ours never names the paper
    with pytest.raises(ValueError, match="unknown verdict 'maybe'"):
        R.agreement("maybe")
    assert R.agreements({"under A": "matches", "under B": "same direction"}) == "as in the paper"
    assert (
        R.agreements({"under A": "matches", "under B": "differs"})
        == "as in the paper under A, unlike the paper under B"
    )


def test_record_refuses_a_reading_that_contradicts_its_verdict(tmp_path):
    row = dict(
        id="E16",
        quantity="BERT ‖X̂‖_* / solver ‖U‖_*",
        ours=1.06,
        kind="direction",
        reference=1.0,
        sense="above",
    )  # 1.06 is within the direction rule's 10 % margin: differs
    assert R.contradiction("larger, as in the paper", "differs") == "as in the paper"
    assert R.contradiction("larger, unlike the paper", "differs") is None
    with pytest.raises(ValueError, match="says 'as in the paper' but its verdict is 'differs'"):
        S.record(tmp_path, **row, reading="larger, as in the paper")
    assert S.record(tmp_path, **row, reading="larger, unlike the paper")["verdict"] == "differs"
    assert R.row_verdict({**row, "ours": 1.5}) == "same direction"


def test_no_chapter_types_its_own_agreement_with_the_paper():
    """A chapter's sentence takes "as in the paper" / "unlike the paper" from its row's
    verdict (`scorecard_rules.agreement`): no chapter module writes those words itself, nor the
    older wordings that decided by a test of their own."""
    import re
    from pathlib import Path

    typed = re.compile(
        r"as in the paper|unlike the paper|as the paper (says|describes|shows)|"
        r"not what the paper shows|the paper's claim .* holds|holds here|does not hold here",
        re.I,
    )
    book = Path(S.__file__).parent
    found = {
        p.name: [s for s in literal_strings(p) if typed.search(s)]
        for p in sorted(book.glob("*.py"))
        if p.name != "scorecard_rules.py"
    }
    assert len(found) > 10 and not any(found.values()), {k: v for k, v in found.items() if v}


def test_headline_counts_the_model_and_the_solvers_apart_and_names_a_reason():
    rows = [
        {
            "id": "E1",
            "quantity": "drop step",
            "paper": 15000.0,
            "ours": 9000.0,
            "reading": "early",
            "verdict": "differs",
        },
        {"id": "E1", "quantity": "plateau", "paper": 1.0, "ours": 1.0, "reading": "", "verdict": "matches"},
        {"id": "E4", "quantity": "ablation", "paper": 1.0, "ours": 1.0, "reading": "", "verdict": "matches"},
        {"id": "E9", "quantity": "heads", "paper": None, "ours": None, "reading": "", "verdict": "n/a"},
        {
            "id": "E17",
            "quantity": "λ = 0.001: L",
            "paper": 0.01,
            "ours": 0.05,
            "reading": "",
            "verdict": "differs",
        },
    ]
    h = T.headline(rows)
    assert (
        h["landing_model"].startswith("Of the 4 claims about the model, 2 reproduced")
        and "1 differs, 0 are too close to tell and 1 has" in h["landing_model"]
    )
    assert (
        h["landing_solvers"].startswith("Of the 1 claim about the classical solvers alone (E17")
        and "0 reproduced" in h["landing_solvers"]
    )
    assert h["landing_reproduced"] == "Reproduced in full: E4."
    assert (
        h["landing_differs"]
        == "With claims that differ (how many): E1 (1), E17 (1); the table below says why."
    )
    assert T.headline(rows[1:3])["landing_differs"].startswith("No claim differs")


def test_departures_text_names_every_key():
    from mclib.core.config import load_profile, profile_path
    from mclib.core.paper import profile as paper_profile
    from mclib.core.recipe import deviations

    cpu = load_profile(profile_path("cpu"))
    text = T.departures_text(cpu)
    keys = [d["key"] for d in deviations(cpu, paper_profile())]
    assert f"in {len(keys)} keys" in text and all(k in text for k in keys) and "data.n 5 (paper: 7)" in text
    assert T.departures_text(paper_profile()).endswith("in nothing.")


def test_finding_rule_holds_fails_or_is_too_close_to_tell():
    """The interval ours ± 2 s.e. inside the band beyond the reference: holds; outside it: fails;
    reaching both: too close to tell (2026-11-29: F2 at +0.218 ± 0.114 read "fails")."""
    assert R.finding(0.6, 0.0, "above", se=0.1) == "holds"  # 0.6 > 2 x 0.1
    assert R.finding(0.15, 0.0, "above", se=0.1) == R.CLOSE  # within two standard errors
    assert R.finding(0.218, 0.0, "above", se=0.114) == R.CLOSE
    assert R.finding(-0.15, 0.0, "above", se=0.1) == R.CLOSE  # the other side, within two s.e.
    assert R.finding(-0.6, 0.0, "above", se=0.1) == "fails"  # the other side, beyond two s.e.
    assert R.finding(-0.2, 0.0, "above", se=0.1) == "fails"  # the interval touches the reference only
    assert R.finding(0.5, 1.0, "below") == "holds" and R.finding(0.95, 1.0, "below") == "fails"  # 10 % margin
    assert R.finding(0.95, 0.9, "above", margin=R.CUT) == "holds"
    assert R.finding(0.9, 0.9, "above", margin=R.CUT) == "fails"
    assert R.finding(0.92, 0.9, "above", se=0.02, margin=R.CUT) == R.CLOSE
    assert R.finding(None, 0.0, "above") == "fails"
    with pytest.raises(ValueError):
        R.finding(0.1, 0.0, "over")
    with pytest.raises(ValueError, match="no paper's value"):
        R.judge("finding", paper=1.0, ours=2.0, reference=0.0, sense="above")


def test_a_finding_of_ours_never_reads_as_the_paper_s(tmp_path):
    row = dict(
        id="B1", quantity="lead", ours=0.95, kind="finding", reference=0.9, sense="above", margin=R.CUT
    )
    with pytest.raises(ValueError, match="says 'as in the paper' but its verdict is 'holds'"):
        S.record(tmp_path, **row, reading="it leads, as in the paper")
    assert S.record(tmp_path, **row, reading="it leads, which holds here")["verdict"] == "holds"
    with pytest.raises(ValueError, match="says 'holds here' but its verdict is 'fails'"):
        S.record(tmp_path, **{**row, "ours": 0.5}, reading="it leads, which holds here")


def test_findings_of_ours_are_counted_apart_from_the_paper_s_claims(tmp_path):
    """A finding of ours that holds is no reproduced claim of the paper: the landing counts,
    the findings table and the paper's rows leave it out; it is counted on its own."""
    S.record(tmp_path, "E4", "ablation", 1.0, 1.0, kind="ratio")  # matches
    S.record(
        tmp_path, "B1", "lead", None, 0.95, kind="finding", reference=0.9, sense="above", margin=R.CUT
    )  # holds
    S.record(
        tmp_path, "F2", "collapse", None, -0.2, kind="finding", reference=0.0, sense="above", se=0.05
    )  # fails
    S.record(
        tmp_path, "F5", "LLMs", None, None, kind="finding", reference=0.0, sense="above", na="no LLM"
    )  # n/a
    rows = S.load(tmp_path)
    assert [r["id"] for r in T.paper_rows(rows)] == ["E4"] and [r["id"] for r in T.own_rows(rows)] == [
        "B1",
        "F2",
        "F5",
    ]
    h = T.headline(rows)
    assert h["landing_model"].startswith("Of the 1 claim about the model, 1 reproduced")
    assert h["landing_reproduced"] == "Reproduced in full: E4."
    assert h["landing_differs"].startswith("No claim differs")  # F2 fails, but is not the paper's
    # 2026-11-28: "1 hold, 1 do not and 1 have nothing to test here"
    assert h["landing_own"] == (
        "Beyond the paper, 3 findings of our own and of the 2025 follow-up, counted apart: "
        "1 holds, 1 does not, 0 are too close to tell and 1 has nothing to test here."
    )
    assert list(T.findings(rows)["experiment"]) == ["E4"]


def test_verdicts_text_counts_every_verdict_from_the_verdicts():
    assert T.verdicts_text(["differs"] * 12) == "all 12 rows unlike the paper"
    assert T.verdicts_text(["matches"]) == "the one row as in the paper"
    assert T.verdicts_text(["differs", "matches", R.CLOSE, "same direction"]) == (
        "of the 4 rows, 2 as in the paper, 1 unlike the paper and 1 too close to tell"
    )
    assert (
        T.verdicts_text(["n/a", "differs"], "head")
        == "of the 2 heads, 1 unlike the paper and 1 not tested here"
    )
    assert (
        T.verdicts_text([]) == "no rows"
        and T.plural(1, "seed") == "1 seed"
        and T.plural(3, "seed") == "3 seeds"
    )


def test_the_provisional_rows_are_split_by_what_they_say_so_far():
    late = "reads step 16,591 of a run cut short of its 50,000"
    rows = (
        [{"id": "E3", "quantity": f"a{i}", "verdict": "matches", "provisional": late} for i in range(3)]
        + [{"id": "E5", "quantity": f"b{i}", "verdict": "differs", "provisional": late} for i in range(2)]
        + [
            {"id": "E5", "quantity": "c", "verdict": R.CLOSE, "provisional": late},
            {"id": "E1", "quantity": "d", "verdict": "differs", "provisional": None},
            {"id": "F1", "quantity": "e", "kind": "finding", "verdict": "holds", "provisional": late},
        ]
    )
    assert T.provisional_split(rows) == {"provisional": 6, "agree": 3, "differ": 2, "too close": 1}
    assert T.provisional_text(rows) == "6 provisional: 3 agree, 2 differ, 1 too close to tell so far"
    assert T.provisional_text(rows[:5]) == "5 provisional: 3 agree, 2 differ so far"
    assert T.provisional_text(rows[6:7]) == "0 provisional"
    assert "6 provisional: 3 agree, 2 differ, 1 too close to tell so far" in T.setting_counts(
        rows, "the paper's own setting"
    )
