"""`python -m mclib export` (mclib/core/export.py): a run's metrics and loss curve in
TensorBoard event files and an offline W&B run, each read back with the tracker's own
reader and compared with metrics.csv; without the extra, one line naming it."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from mclib.__main__ import main
from mclib.book.plots_curves import loss_curve_image
from mclib.core import export
from mclib.core.runs import export_dir, load_metrics, run_profile

# found, not imported: wandb takes a second to import, and only the slow test needs it
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("tensorboard", "wandb")),
    reason="the extra 'track' (in the test extra) is not installed",
)


def _expected(run_dir) -> dict[str, pd.Series]:
    """metrics.csv column by column, indexed by step, empty cells left out."""
    m = load_metrics(run_dir).set_index("step")
    return {c: m[c].dropna() for c in m.columns}


def _png(data: bytes) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_tensorboard_event_files_hold_metrics_csv(smoke_run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, EventAccumulator

    dest = export.export_run(smoke_run, "tensorboard", tmp_path / "tb", image=loss_curve_image(smoke_run))
    events = EventAccumulator(str(dest), size_guidance={SCALARS: 0, IMAGES: 0})
    events.Reload()
    expected = _expected(smoke_run)
    assert set(events.Tags()["scalars"]) == set(expected) and "eval_L_mask" in expected
    for column, series in expected.items():
        got = events.Scalars(column)
        assert [e.step for e in got] == list(series.index), column  # eval_*: only the evaluated steps
        np.testing.assert_allclose(
            [e.value for e in got], series.values, rtol=1e-6, err_msg=column
        )  # float32
    [image] = events.Images(export.IMAGE_TAG)
    assert image.step == int(load_metrics(smoke_run).step.iloc[-1])
    assert np.array_equal(_png(image.encoded_image_string), loss_curve_image(smoke_run))
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.slow  # wandb's reader runs in a process of its own
def test_wandb_offline_run_holds_metrics_csv(smoke_run, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")  # the export is offline whatever the environment says
    monkeypatch.setenv("WANDB_API_KEY", "")
    dest = export.export_run(
        smoke_run, "wandb", tmp_path / "wb", project="mclib-test", image=loss_curve_image(smoke_run)
    )
    [run] = export.wandb_runs(dest)
    assert run.name.startswith("offline-run-")
    # wandb's own reader of the run's .wandb log (`wandb leet inspect`, wandb >= 0.31)
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    history = [r["history"] for r in records if r["type"] == "history"]
    assert [int(h["step"]["num"]) for h in history] == list(load_metrics(smoke_run).step)
    for column, series in _expected(smoke_run).items():
        got = pd.Series(
            {int(h["step"]["num"]): h["item"][column] for h in history if column in h["item"]}, dtype=float
        )
        assert list(got.index) == list(series.index), column
        np.testing.assert_array_equal(got.values, series.values, err_msg=column)  # JSON keeps the float64
    last = history[-1]["item"]
    assert last[f"{export.IMAGE_TAG}._type"] == "image-file"
    png = (run / "files" / last[f"{export.IMAGE_TAG}.path"]).read_bytes()
    assert np.array_equal(_png(png), loss_curve_image(smoke_run))
    [config] = [r["run"]["config"] for r in records if r["type"] == "run"]
    config = {k: v for k, v in config["update"].items() if k != "_wandb"}
    assert config == json.loads(json.dumps(run_profile(smoke_run).to_dict()))  # the run's profile.yaml


def test_the_cli_writes_into_the_run_folder_and_names_the_viewer(smoke_run, tmp_path, capsys):
    import shutil

    run = shutil.copytree(smoke_run, tmp_path / "smoke-seed1")
    assert main(["export", str(run), "--to", "tensorboard"]) == 0
    out = capsys.readouterr().out
    assert f"tensorboard --logdir {export_dir(run, 'tensorboard')}" in out
    assert list(export_dir(run, "tensorboard").glob("events.out.tfevents.*"))


def test_without_the_extra_one_line_names_it_and_nothing_is_written(smoke_run, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    assert main(["export", str(smoke_run), "--to", "wandb", "--out", str(tmp_path / "wb")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "optional extra 'track'" in err and "pip install -e '.[track]'" in err
    assert not (tmp_path / "wb").exists()
    with pytest.raises(SystemExit) as e:  # --to has its choices: argparse refuses another, naming it
        main(["export", str(smoke_run), "--to", "mlflow", "--out", str(tmp_path / "ml")])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --to: invalid choice: 'mlflow'" in last and "tensorboard" in last and "wandb" in last
    assert not (tmp_path / "ml").exists()
    with pytest.raises(export.ExportError, match="tracker 'mlflow' is not one of tensorboard, wandb"):
        export.export_run(smoke_run, "mlflow", tmp_path / "ml")  # from Python: the same refusal, one line
    assert not (tmp_path / "ml").exists()
    with pytest.raises(export.ExportError, match="is not a run folder"):
        export.export_run(tmp_path, "tensorboard", tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


def test_the_command_lines_trackers_are_the_exporters():
    from mclib.__main__ import TRACKERS

    assert TRACKERS == tuple(export.TRACKERS)
