"""Chapter 01_train's module (mclib/chapters/ch01_train.py): E1's rows, why training ended,
where the checkpoints sit, the drop's shape, the glue the page uses, the downloads."""

import os
import shutil
import zipfile
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from book_pages import glue_names, sentences_turn
from book_pages import recorded_verdict as _verdict

from mclib.book import scorecard
from mclib.book.chapter import checkpoint_zip, open_chapter
from mclib.chapters import ch01_train as C
from mclib.chapters import train_sentences as S
from mclib.core.ending import RunEnd
from mclib.core.placement import CheckpointSteps


def test_training_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "mclib.analyses.rounding.study", lambda *a, **k: {}
    )  # the rules apart from the rounding spread
    from mclib.core.config import load_profile, profile_path

    paper, cpu = load_profile(profile_path("paper")), load_profile(profile_path("cpu"))
    pre = {"L_mask": 0.2222, "L_obs": 2e-4, "L_mask_se": 0.002, "L_obs_se": 1e-5}
    rows = C.training_rows(2000, pre, (0.004, 0.0002), paper)
    v = {r["quantity"]: _verdict(tmp_path, r) for r in rows}
    assert len(rows) == 5
    assert v["pre-shift L_mask / E[X²]"] == "matches" and v["pre-shift L_obs / E[X²]"] == "same direction"
    assert v["drop step"] == "differs"  # 2 000 against the paper's 15 000
    assert _verdict(tmp_path, C.training_rows(14000, pre, (0.004, 0.0002), paper)[-2]) == "matches"
    assert _verdict(tmp_path, C.training_rows(None, pre, (0.004, 0.0002), paper)[-2]) == "differs"
    tf32 = paper.replace(**{"train.precision": "tf32", "train.steps": 60000})  # neither moves the drop
    assert _verdict(tmp_path, C.training_rows(14000, pre, (0.004, 0.0002), tf32)[-2]) == "matches"
    other = C.training_rows(14000, {**pre, "L_mask": 0.111}, (0.004, 0.0002), cpu)[-2]  # another task: n/a
    assert _verdict(tmp_path, other) == "n/a" and "data.rank" in other["na"]
    from mclib.analyses.sharpness import Shape

    sudden = C.training_rows(14000, pre, (0.004, 0.0002), paper, Shape(100, 13000, 14000, 14500, 0.01))[-1]
    assert sudden["ours"] == pytest.approx(12900 / 1500) and _verdict(tmp_path, sudden) == "same direction"
    slow = C.training_rows(14000, pre, (0.004, 0.0002), paper, Shape(100, 1000, 14000, 20000, 0.01))[-1]
    assert _verdict(tmp_path, slow) == "differs"  # a short plateau, a long fall: not sudden
    assert _verdict(tmp_path, rows[-1]) == "differs" and rows[-1]["ours"] == 0  # no shape: no drop counts 0
    far = C.training_rows(14000, pre, (0.004, 0.0002), paper, final_mask=(0.2222 / 17.5, 1e-4))
    assert (
        far[4]["quantity"].startswith("pre-shift L_mask / final L_mask")
        and _verdict(tmp_path, far[4]) == "matches"
    )
    short = C.training_rows(14000, pre, (0.004, 0.0002), paper, final_mask=(0.2222 / 5, 1e-4))
    assert _verdict(tmp_path, short[4]) == "differs"  # the drop goes 5x, not the paper's 17x
    off = C.training_rows(4200, {**pre, "L_obs": 0.05}, (0.004, 0.0002), paper)
    assert _verdict(tmp_path, off[1]) == "differs" and off[1]["reading"].startswith("does not copy")


def test_window_se_is_the_standard_error_of_the_window_mean():
    m = pd.DataFrame({"step": np.arange(1, 101), "L": np.arange(100.0), "L_obs": 1.0, "L_mask": 2.0})
    se = C.window_se(m, 100, window=10)
    assert se["L_se"] == pytest.approx(np.arange(90.0, 100).std(ddof=1) / np.sqrt(10))
    assert se["L_obs_se"] == 0 and np.isnan(C.window_se(m, 1, window=10)["L_se"])  # one step: no error


def _curve(stages):
    """L_mask along steps 1..N: the copying level, then log-linear pieces [(until, level)]."""
    steps, level, out = np.arange(1, stages[-1][0] + 1), 1 / 9, []
    start, value = 0, level
    for until, target in stages:
        n = until - start
        out.append(np.exp(np.linspace(np.log(value), np.log(target), n)))
        start, value = until, target
    return pd.DataFrame({"step": steps, "L_mask": np.concatenate(out)})


def test_drop_shape_tells_one_stretch_from_two_stages():
    one = _curve([(1000, 1 / 9), (2000, 0.01), (4000, 0.01)])
    shape = C.drop_shape(one, 1300, 1000, 2000)
    assert shape.shoulder is None and C.shape_text(shape).endswith("falling in one stretch.")
    two = _curve([(1000, 1 / 9), (1500, 0.04), (2500, 0.036), (3000, 0.01), (4000, 0.01)])
    shape = C.drop_shape(two, 1250, 1000, 3000)
    a, b, level = shape.shoulder
    assert 1500 <= a and b <= 2600 and level == pytest.approx(0.038, rel=0.1)
    text = C.shape_text(shape)
    assert (
        "two stages, with a shoulder near L_mask = 0.03" in text
        and "crossed the drop's threshold (0.5 E[X²]) at step 1,250" in text
    )
    assert "before falling again, to a mean of 0.01 over steps 3,601 to 4,000" in text
    assert C.shape_text(None) == "There is no drop to describe."


def test_a_shoulder_falls_again_only_where_the_run_s_end_lies_below_it():
    """2026-11-28 (Zen 3): a shoulder near 0.00889 "before falling again" where the run ended at
    22 000 with a final mean of 0.0091, above it."""
    shape = S.DropShape(10000, 10785, 17000, (14000, 16000, 0.00889), (19801, 22000, 0.0091))
    text = C.shape_text(shape)
    assert "falling again" not in text and "two stages" not in text
    assert text.endswith(
        "had not fallen below that level when the run ended: over steps 19,801 to 22,000, where the "
        "run ended, its mean was 0.0091, not below it."
    )
    below = C.shape_text(S.DropShape(10000, 10785, 17000, (14000, 16000, 0.00889), (19801, 22000, 0.004)))
    assert "before falling again, to a mean of 0.004" in below


def _fake(ended, step=14000, slope=None, place="drop"):
    end = RunEnd(ended, step, 10985, 14000, "converged", 2000, *(slope or (None, None)))
    steps = CheckpointSteps(
        place=place,
        pre=3000,
        transition=[9500, 10500],
        post=step,
        note="placed from the run's drop at step 10,985",
        drop=10985,
        left_plateau=9766,
        near_final=12125,
    )
    return SimpleNamespace(end=end, steps=steps)


def test_end_sentence_says_whether_the_rule_or_the_cap_ended_training():
    assert C.end_sentence(_fake("cap", slope=(-0.119, 0.035))) == (
        "Training ended at the cap, before the profile's rule "
        "fired: the run reached the cap of 14,000 steps while "
        "L_mask still changed by -11.9% ± 3.5% per 1,000 steps over its last 2,000."
    )
    assert C.end_sentence(_fake("converged", 12000)).startswith("Training ended by the profile's rule")
    assert "12,000" in C.end_sentence(_fake("converged", 12000))
    assert C.end_sentence(_fake("unfinished", 500)) == "The run is unfinished at step 500 of 14,000."
    # slice A's page on the H100 read "The run is was cut at step 16,591 ..." (2026-11-26)
    assert C.end_sentence(_fake("cut", 9000)) == (
        "Training was cut short of the profile's length: the run was cut "
        "at step 9,000 of 14,000 by its wall-clock deadline."
    )


def test_checkpoint_text_says_where_and_why():
    text = C.checkpoint_text(_fake("cap"))
    assert "placed from this run's drop at step 10,985" in text and "Pre-shift, step 3,000" in text
    assert "steps 9,500, 10,500" in text and "from step 9,766" in text and "to step 12,125" in text
    fixed = _fake("steps")
    fixed.steps.place, fixed.steps.note = (
        "fixed",
        "the run did not drop, so the profile's fixed steps stand in",
    )
    assert C.checkpoint_text(fixed).startswith(
        "The run did not drop, so the profile's fixed steps stand in: pre-shift at step 3,000"
    )
    # a run cut short of its length: its post-shift step is where it was cut, not the end of training
    assert "Post-shift, step 14,000: the end of training." in text
    cut = C.checkpoint_text(_fake("cut", 9000))
    assert (
        "Post-shift, step 9,000: where training was cut, short of its 14,000 steps" in cut
        and "end of training" not in cut
    )


def test_drop_story_both_ways():
    on = {"for L_mask": "matches", "for L_obs": "same direction"}
    off = {"for L_mask": "differs", "for L_obs": "same direction"}
    assert C.drop_story(900, on, 1000) == (
        "dropped at step 900 of the 1,000 it trained",
        "a plateau where the model copies, then a sudden drop, as in the paper",
    )
    assert C.drop_story(900, off, 1000)[1] == (
        "a drop, but the pre-shift checkpoint is not on the paper's copying "
        "plateau (unlike the paper for L_mask, as in the paper for L_obs)"
    )
    assert C.drop_story(None, on, 60)[0] == "did not drop within the 60 steps it trained"
    assert C.drop_story(None, off, 60)[1].startswith(
        "neither the paper's copying plateau (unlike the paper for L_mask"
    )


def test_the_story_turns_with_e1_s_rows(ch, flip_verdicts):
    """The story's comparison with the paper is the verdict of E1's pre-shift rows."""
    readings = lambda: (C.findings(ch), C.e1_rows(ch))
    sentences_turn(readings, flip_verdicts, {"story": list(C.PLATEAU_ROWS.values())})


@pytest.fixture
def book_run(smoke_run, tmp_path):
    """The smoke run where the book puts it: OUT/runs/smoke-seed1 beside OUT/book/_executed."""
    run = shutil.copytree(smoke_run, tmp_path / "runs" / "smoke-seed1")
    (tmp_path / "book" / "_executed").mkdir(parents=True)
    return run


def test_the_page_s_glue_comes_from_the_module(book_run, smoke_profile):
    ch = open_chapter("smoke", smoke_profile.seed, book_run, "cpu")
    rows = C.e1_rows(ch)
    found = {**C.findings(ch), **C.paper_glue(rows), "fig_loss": None, "downloads": None}
    assert glue_names("01_train.ipynb") <= set(found), glue_names("01_train.ipynb") - set(found)
    assert found["end_text"].startswith(
        "Training ended after the profile's fixed length: the run trained its 60 steps. "
        "Over its last 60 steps L_mask changed by "
    )
    assert found["drop_text"] == "did not drop within the 60 steps it trained"
    assert found["shape_text"] == "There is no drop to describe."
    assert found["checkpoints_text"].startswith(
        "The profile's fixed steps (checkpoints.place: fixed): pre-shift at step 20"
    )
    assert found["drop_factor"] == pytest.approx(found["pre_L_mask"] / found["final_L_mask"])
    html = C.scorecard_table(ch, rows).to_html()
    assert "drop step" in html and len(scorecard.load(book_run)) == 6


def test_downloads_link_the_run_s_files_and_zip_the_checkpoint_once(book_run, smoke_profile):
    ch = open_chapter("smoke", smoke_profile.seed, book_run, "cpu")
    text = C.downloads(ch)
    assert "{download}`metrics.csv (one row per step) <../../runs/smoke-seed1/metrics.csv>`" in text
    assert "<../../runs/smoke-seed1/checkpoint_step_000060.zip>`" in text
    path = book_run / "checkpoint_step_000060.zip"
    with zipfile.ZipFile(path) as z:
        assert {"step_000060/model.safetensors", "step_000060/config.json"} <= set(z.namelist())
    stamp = path.stat().st_mtime_ns
    assert (
        checkpoint_zip(book_run, 60) == path == checkpoint_zip(book_run) and path.stat().st_mtime_ns == stamp
    )  # zipped once
    assert not list(book_run.glob(".tmp-*"))
    shutil.rmtree(book_run.parent.parent / "book")  # not where the book puts runs: the files' places, no link
    assert C.downloads(ch).startswith("This run's files, to download: metrics.csv (one row per step): ")
    assert "{download}" not in C.downloads(ch) and "smoke-seed1/metrics.csv" in C.downloads(ch)


def test_the_end_rate_is_given_once():
    """end_sentence gives the rate where the run recorded it; slope_sentence then says only how it is read."""
    import pandas as pd

    from mclib.core.config import profile_from_dict

    cfg = profile_from_dict({"train": {"until": "converged", "patience": 2000, "min_improvement": 0.05}})
    step = np.arange(1, 4001)
    metrics = pd.DataFrame({"step": step, "L_mask": 0.05 * 0.9 ** (step / 1000)})
    ch = SimpleNamespace(cfg=cfg, metrics=metrics, end=_fake("cap", 4000, slope=(-0.1, 0.001)).end)
    assert "-10.0% ± 0.1% per 1,000 steps" in C.end_sentence(ch)
    assert C.slope_sentence(ch) == (
        "The rate is a fit of log L_mask to 10 block means, ± one standard error; the rule "
        "ends a run once the fall is under 5% per 1,000 steps even at the rate minus 2 errors."
    )
    ch.end = _fake("steps", 4000).end  # no rate recorded: the sentence computes it
    assert C.slope_sentence(ch).startswith(
        "Over its last 2,000 steps L_mask changed by -10.0% ± 0.0% per 1 000 steps"
    )


def test_the_analysis_checkpoints_are_one_download_each_a_folder_with_its_model_card(
    book_run, smoke_profile, tmp_path
):
    import hashlib
    import json
    import re

    from huggingface_hub import ModelCard

    from mclib.core.checkpoints import load_checkpoint
    from mclib.core.data import make_batch
    from mclib.core.model import MatrixBert
    from mclib.core.runs import checkpoint_series_path, load_metrics

    ch = open_chapter("smoke", smoke_profile.seed, book_run, "cpu")
    text = C.downloads(ch)
    assert "<../../runs/smoke-seed1/checkpoint_series.zip>`" in text and "steps 20, 30, 40, 60" in text
    path = checkpoint_series_path(book_run)
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "unzipped")
    assert names == {
        f"smoke-seed1/step_{s:06d}/{f}"
        for s in (20, 30, 40, 60)
        for f in ("config.json", "model.safetensors", "README.md")
    }  # no train_state.pt
    assert not list(book_run.glob(".tmp-*"))
    folder = tmp_path / "unzipped" / "smoke-seed1"
    card = (folder / "step_000030" / "README.md").read_text()
    row = load_metrics(book_run).set_index("step").loc[30]
    assert "Step 30 of the run smoke-seed1 (transition: around the drop)" in " ".join(card.split())
    assert (
        f"| {row.L:.4g} | {row.L_obs:.4g} | {row.L_mask:.4g} |" in card and f"{row.eval_L_mask:.4g}" in card
    )
    assert (book_run / "profile.yaml").read_text().strip() in card and "CITATION.cff" in card
    assert "pre-shift: on the copying plateau" in (folder / "step_000020" / "README.md").read_text()
    # the header (huggingface_hub's ModelCard): profile, seed,
    # step, the weights' sha256, L_mask on fresh matrices
    data = ModelCard.load(folder / "step_000030" / "README.md").data
    assert data.mclib["profile"] == "smoke" and data.mclib["seed"] == 1 and data.mclib["step"] == 30
    weights = (folder / "step_000030" / "model.safetensors").read_bytes()
    assert data.mclib["weights_sha256"] == {"model.safetensors": hashlib.sha256(weights).hexdigest()}
    [result] = data.eval_results
    assert result.metric_name == "L_mask" and result.metric_value == row.eval_L_mask
    assert data.library_name == "transformers" and card.startswith("---\n")
    assert json.loads((folder / "step_000030" / "config.json").read_text())["model_type"] == "matrix-bert"
    # the card's own loading code, run as written in the unzipped folder
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    batch = make_batch(torch.rand(4, 7, 7), torch.rand(4, 7, 7) < 0.3)
    scope = {"x": batch.x, "mask": batch.mask}
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        exec(code, scope)
    finally:
        os.chdir(cwd)
    assert isinstance(scope["model"], MatrixBert)
    with torch.no_grad():
        torch.testing.assert_close(
            scope["pred"], load_checkpoint(book_run, 30, device="cpu")(batch.tokens).logits
        )


def test_a_run_saved_before_matrix_bert_zips_configs_that_automodel_loads_whole(
    book_run, smoke_profile, tmp_path
):
    """A run whose checkpoints say model_type bert (saved before 2026-11-29): the series zip
    holds their configs in today's format (matrix-bert), so the card's AutoModel loads the
    whole MatrixBert, read-out included."""
    import json

    from transformers import AutoModel

    from mclib.core.checkpoints import load_checkpoint, saved_steps
    from mclib.core.model import MatrixBert
    from mclib.core.runs import checkpoint_dir, checkpoint_series_path

    for step in saved_steps(book_run):
        config = checkpoint_dir(book_run, step) / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "bert"}))
    C.downloads(open_chapter("smoke", smoke_profile.seed, book_run, "cpu"))
    with zipfile.ZipFile(checkpoint_series_path(book_run)) as z:
        z.extractall(tmp_path / "unzipped")
    folder = tmp_path / "unzipped" / "smoke-seed1" / "step_000060"
    assert json.loads((folder / "config.json").read_text())["model_type"] == "matrix-bert"
    model = AutoModel.from_pretrained(folder)
    tokens = torch.randint(1, 2002, (3, 49))
    assert type(model) is MatrixBert
    with torch.no_grad():  # two model objects: the last bit may differ (test_model.py's round trip)
        torch.testing.assert_close(
            model(tokens).logits,
            load_checkpoint(book_run, 60, device="cpu")(tokens).logits,
            rtol=0,
            atol=1e-6,
        )


def test_large_analysis_checkpoints_say_where_they_are_and_how_to_offer_them(
    book_run, smoke_profile, monkeypatch
):
    from mclib.book import chapter
    from mclib.core.runs import checkpoint_series_path

    ch = open_chapter("smoke", smoke_profile.seed, book_run, "cpu")
    monkeypatch.setattr(chapter, "CHECKPOINT_DOWNLOAD_MB", 0.001)  # as if it were the paper profile's
    [line] = chapter.checkpoint_series_links(ch)
    assert "MB together, are not copied into the site" in line and "`smoke-seed1/checkpoints`" in line
    assert "analysis.download_checkpoint: true" in line and "upload each folder to a model hub" in line
    assert "the analysis checkpoints (steps 20, 30, 40, 60)" in C.downloads(ch)
    assert not checkpoint_series_path(book_run).exists()  # nothing zipped
    monkeypatch.setattr(ch, "cfg", ch.cfg.replace(**{"analysis.download_checkpoint": True}))
    assert (
        "{download}" in chapter.checkpoint_series_links(ch)[0] and checkpoint_series_path(book_run).is_file()
    )


def test_a_gpt_run_s_model_card_loads_it_as_written(tmp_path):
    """E19's decoder (model.kind: gpt) has its own class and forward: the card says which."""
    import re

    from mclib.book import chapter
    from mclib.core.checkpoints import load_checkpoint
    from mclib.core.config import load_profile, profile_path
    from mclib.core.data import make_batch
    from mclib.core.ending import run_end
    from mclib.core.placement import checkpoint_steps
    from mclib.core.runs import load_metrics, run_profile
    from mclib.core.train import train

    p = load_profile(profile_path("gpt")).replace(
        **{
            "train.steps": 20,
            "train.save_every": 10,
            "train.eval_every": 10,
            "train.log_every": 10,
            "train.until": "steps",
            "checkpoints": {"pre": 10, "transition": [], "post": 20},
        }
    )
    run = tmp_path / "gpt-seed1"
    train(p, run, progress=False)
    ch = chapter.Chapter(
        cfg=run_profile(run),
        run_dir=run,
        device=torch.device("cpu"),
        metrics=load_metrics(run),
        drop=None,
        steps=checkpoint_steps(run),
        end=run_end(run),
    )
    card = chapter.model_card(ch, 20)
    assert card.split("\n---\n", 1)[1].lstrip().startswith("# MatrixGPT: gpt profile, seed 1, step 20")
    batch = make_batch(torch.rand(4, 5, 5), torch.rand(4, 5, 5) < 0.3)
    scope = {"x": batch.x, "mask": batch.mask}
    cwd = os.getcwd()
    os.chdir(run / "checkpoints")
    try:
        exec(re.search(r"```python\n(.*?)```", card, re.S).group(1), scope)
    finally:
        os.chdir(cwd)
    with torch.no_grad():
        torch.testing.assert_close(scope["pred"], load_checkpoint(run, 20, device="cpu")(batch))
