"""The book's part "The paper's own setting" (mclib.lease.part): the chapters a GPU
lease executed, shown as they ran, each saying where its numbers come from."""

import json

import nbformat
import yaml

from mclib.book.runner_site import site_toc
from mclib.chapters.registry import specs as chapter_specs
from mclib.lease import part, slices

SPECS = (
    chapter_specs()
)  # what the toc's chapters declare (mclib.book.spec), as the command line hands it down


def _notebook():
    return nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell(
                "# 03 · Row and column heads\n\n(heads-e10)=\n## E10\n\nSee {ref}`heads-e10` "
                "and {ref}`the figure <fig-e10>`; {download}`metrics <../../runs/x/metrics.csv>`.\n\n"
                ":::{glue:figure} fig_e10\n:name: fig-e10\n:::\n\nSee [the scorecard](99_scorecard) "
                "and [above](#heads-e10)."
            ),
            nbformat.v4.new_code_cell(
                "1 + 1",
                outputs=[
                    nbformat.v4.new_output(
                        "display_data",
                        data={
                            "text/markdown": "{download}`checkpoint <../../runs/x/c.zip>`",
                            "application/papermill.record/text/markdown": (
                                "{download}`m <../../runs/x/m.csv>`"
                            ),
                        },
                    )
                ],
            ),
        ]
    )


def test_an_executed_chapter_is_adapted_to_sit_beside_the_laptop_one():
    nb = part.adapt(_notebook(), "A", ":::{note}\nfrom slice A\n:::")
    title, note, body = nb.cells[0].source, nb.cells[1].source, nb.cells[0].source
    assert title.startswith("# 03 · Row and column heads (the paper's setting)")
    assert note == ":::{note}\nfrom slice A\n:::"
    assert "(paper-a-heads-e10)=" in body and "{ref}`paper-a-heads-e10`" in body
    assert "{ref}`the figure <paper-a-fig-e10>`" in body
    assert "{download}" not in body and "metrics (not offered: it stayed on the GPU machine)" in body
    assert ":name: paper-a-fig-e10" in body and "[above](#paper-a-heads-e10)" in body
    assert "[the scorecard](../99_scorecard)" in body  # the laptop edition's, one folder up
    data = nb.cells[2].outputs[0]["data"]
    assert data["text/markdown"] == "checkpoint (not offered: it stayed on the GPU machine)"
    assert (
        data["application/papermill.record/text/markdown"] == "m (not offered: it stayed on the GPU machine)"
    )


def _results(tmp_path, done=("A",)):
    root = tmp_path / "results"
    root.mkdir()
    plan = {
        "profile": "smoke",
        "precision": "fp32",
        "step_ms": 5.0,
        "lease_s": 900,
        "start_s": 120,
        "slices": [
            {"name": "A", "what": "the book's run", "seeds": [1], "train_s": 10, "chapters": ["03_heads"]},
            {"name": "B", "what": "seed 2", "seeds": [2], "expected_steps": 100},
        ],
    }
    (root / "paper-slices.yaml").write_text(yaml.safe_dump(plan))
    for name in done:
        folder = root / f"smoke-{name}-NVIDIA-H100-2026-12-01"
        (folder / "book").mkdir(parents=True)
        nbformat.write(_notebook(), folder / "book" / "03_heads.ipynb")
        (folder / slices.STATE).write_text(
            json.dumps(
                {
                    "slice": name,
                    "device": "NVIDIA H100",
                    "date": "2026-12-01",
                    "git": "abc1234",
                    "precision": "tf32",
                    "profile": "smoke",
                    "ends": {
                        "1": {"ended": "cut", "step": 21000, "drop": 13000, "steps": 50000, "until": "steps"}
                    },
                }
            )
        )
    return root / "paper-slices.yaml"


def test_the_part_says_where_each_chapter_ran_and_which_slices_are_missing(tmp_path):
    ledger = _results(tmp_path)
    index, page = part.stage(tmp_path / "out", ledger, specs=SPECS)
    text = index.read_text()
    assert (
        "| A | the book's run | NVIDIA H100, 2026-12-01, revision `abc1234`, tf32 | [03_heads](A_03_heads) | "
        "seed 1: was cut at step 21,000 of 50,000 by its wall-clock deadline |"
    ) in text
    assert "| B | seed 2 | not run yet | | |" in text and "still missing: slice B" in text
    note = nbformat.read(page, as_version=4).cells[1].source
    assert (
        "slice A (the book's run), on NVIDIA H100 on 2026-12-01, revision `abc1234`, precision tf32" in note
    )
    assert "seed 1: was cut at step 21,000 of 50,000 by its wall-clock deadline" in note
    assert "still missing: slice B" in note
    toc = yaml.safe_load(site_toc(tmp_path / "out", ["book/_executed/01_train"], [[index, page]]).read_text())
    assert [c["file"] for c in toc["chapters"]] == ["book/_executed/01_train", "book/_executed/paper/index"]
    assert toc["chapters"][1]["sections"] == [{"file": "book/_executed/paper/A_03_heads"}]


def test_with_no_slice_done_the_part_is_one_page_that_says_so(tmp_path):
    ledger = _results(tmp_path, done=())
    (index,) = part.stage(tmp_path / "out", ledger, specs=SPECS)
    assert "still missing: slices A, B" in index.read_text()
    toc = yaml.safe_load(site_toc(tmp_path / "out", [], [[index]]).read_text())
    assert toc["chapters"] == [{"file": "book/_executed/paper/index"}]


def test_an_e15_slice_says_how_its_group_s_run_ended():
    record = {
        "ends": {"1": {"ended": "stopped", "step": 16000, "drop": 13228, "steps": 50000, "until": "steps"}},
        "freeze_ends": {
            "mlp": {
                "group": "mlp",
                "ended": "converged",
                "steps": 2900,
                "drop": 310,
                "main_drop": 13228,
                "cap": 14000,
            },
            "token": None,
        },
    }
    assert part.runs_text(record) == (
        "seed 1: stopped early at step 16,000; E15 mlp: dropped at step 310 and "
        "converged at step 2,900; E15 token: no checkpoint"
    )


def test_what_happened_on_the_lease_beyond_the_two_commands_is_on_every_page():
    s = slices.Slice(name="A", what="seed 1", seeds=[1])
    record = {
        "device": "GPU",
        "date": "2026-11-26",
        "git": "abc1234",
        "precision": "tf32",
        "ends": {},
        "lease_note": "Executed in three finish calls.",
    }
    assert "On the lease: Executed in three finish calls." in part.provenance(
        record, s, "every slice is done"
    )
    del record["lease_note"]
    assert "On the lease" not in part.provenance(record, s, "every slice is done")


def test_staging_the_part_twice_writes_the_same_bytes(tmp_path):
    """The site is rebuilt only when its inputs change (mclib.book.runner's site key): the
    provenance cell once took a random id, so every build of the book rebuilt the site."""
    import hashlib

    def staged():
        return {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in part.stage(tmp_path, slices.LEDGER, specs=SPECS)
        }

    first = staged()
    assert first and staged() == first


def test_restate_sets_today_s_verdict_beside_the_lease_s_words():
    """2026-11-27: the paper part kept a lease's sentences whose verdicts today's rules re-judged
    (A_03 E4 "as in the paper (ratio rule)", A_07 B1 "which does not hold here") and its wording
    slips ("The run is was cut", "a such head", "1 heads", "Over 1 seeds")."""
    from ast import literal_eval

    import nbformat

    from mclib.lease import part

    def glued(name, text):
        return nbformat.v4.new_output(
            "display_data",
            data={part.GLUED: repr(text)},
            metadata={"scrapbook": {"name": name, "mime_prefix": ""}},
        )

    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell(
                "# 03\n\nOver {glue:text}`n_seeds` seeds of this profile (seeds {glue:text}`seed_list`), x"
            ),
            nbformat.v4.new_code_cell(
                outputs=[
                    glued("e4_text", "x: as in the paper (ratio rule)"),
                    glued("n_seeds", 1),
                    glued("end_text", "The run is was cut at step 9"),
                    nbformat.v4.new_output(
                        "display_data",
                        data={"text/html": "<td>a such head (above)</td><td>1 heads; 1.1</td>"},
                    ),
                ]
            ),
        ]
    )
    nb = part.adapt(nb, "A", ":::{note}\nslice A\n:::")
    rows = [
        {
            "chapter": "03_heads",
            "id": "E4",
            "quantity": q,
            "was": "matches",
            "verdict": "n/a",
            "na": "2 heads",
        }
        for q in ("a", "b")
    ]
    done = part.restate(nb, "03_heads", rows, specs=SPECS)
    out = {
        o["metadata"]["scrapbook"]["name"]: o["data"][part.GLUED]
        for o in nb.cells[2].outputs
        if "metadata" in o and "scrapbook" in o["metadata"]
    }
    e4 = literal_eval(out["e4_text"])
    assert e4.startswith(
        "x: as in the paper (ratio rule) [re-judged by today's rules, this sentence's verdict struck: "
        "E4, 2 rows now not tested here (2 heads), where the lease said as in the paper]"
    )
    assert literal_eval(out["end_text"]).startswith(
        "Training was cut short of the profile's length: the run was cut"
    )
    html = nb.cells[2].outputs[-1]["data"]["text/html"]
    assert "such a head" in html and ">1 head;" in html
    assert "Over the one seed of this profile (seed {glue:text}`seed_list`)" in nb.cells[0].source
    assert "e4_text" in done and "Set right on this page" in nb.cells[1].source
    # a sentence whose rows were not re-judged stays the lease's
    nb2 = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(outputs=[glued("e4_text", "x: as in the paper")])]
    )
    assert part.restate(nb2, "03_heads", [{**rows[0], "was": "n/a"}], specs=SPECS) == []


def test_rejudged_beside_names_the_headline_row_where_only_a_reason_changed():
    from mclib.lease import part

    rows = [
        {"id": "E8", "quantity": "last layer patched", "paper": 0.063, "ours": 0.862, "verdict": "differs"},
        {
            "id": "E8",
            "quantity": "every layer patched",
            "verdict": "cannot fail",
            "was": "cannot fail",
            "rejudged": "the paper's value moved to the last-layer rows",
        },
    ]
    said = part.rejudged_beside(rows)
    assert "every layer patched: the paper's value moved" in said
    assert "its first row, last layer patched: 0.862 against the paper's 0.063, unlike the paper" in said
    assert part.rejudged_beside(rows[:1]) == ""


def test_a_leases_wording_slips_and_its_downloads_sentence_are_set_right():
    import nbformat

    from mclib.lease import part

    lease_said = (
        "No measure leaves its plateau band for good before the loss does (the loss itself stays in its band "
        "until the drop, the drop is at step 14,678; checkpoints at most 4,000 steps apart); no plateau band "
        "(fewer than 3 checkpoints between steps 2,000 and 11,742) for share_L0, L_mask"
    )
    fixed = lease_said
    for pattern, right in part.SLIPS:
        fixed = pattern.sub(right, fixed)
    assert (
        "stays in its band" not in fixed
        and "the loss itself has no band to leave, the drop is at step 14,678" in fixed
    )
    kept = lease_said.replace(", L_mask", "")  # the loss has a band: the lease's words stand
    for pattern, right in part.SLIPS:
        kept = pattern.sub(right, kept)
    assert kept == lease_said.replace(", L_mask", "")
    files = (
        "This run's files, to download: {download}`metrics.csv "
        "(one row per step) <../../runs/x/metrics.csv>`, the "
        "final checkpoint ... in "
        "`slice-work/runs/paper-seed1/checkpoints`; to offer them, set ... or upload each "
        "folder to a model hub."
    )
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# 01"), nbformat.v4.new_markdown_cell(files)]
    )
    out = part.adapt(nb, "A", "note")
    assert out.cells[-1].source == part.FILES_HERE and "slice-work" not in out.cells[-1].source
