"""Fixtures shared by the test modules. The library is imported inside the fixtures, not
here, so that pytest (and, with `-n 2`, pytest-xdist's controller) starts without loading
torch and transformers; the workers import them with their first test module."""

import logging
import os
import pathlib
import sys

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `python -m pytest -m "not slow" -n 2`: two workers on two cores, each on one thread (and
    # every process a test starts too), so that they do not fight for the cores.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"

# Tolerances for comparing TWO DIFFERENT float32 paths through the same model: sdpa against
# mclib's eager attention (any hook on a pattern or z switches to it), a forward in float64
# by hand against the float32 model, compiled against eager, nnsight's ablation against
# ours, one batch against chunks. They share every weight, but not the kernels or the
# order of the sums (q·k over 8 dims, softmax and pattern·v over 49 keys, MLP over 32),
# and x86 CPUs pick other kernels: MKL's and oneDNN's on an Intel Xeon with AMX are not
# those on an AMD EPYC with AVX512. A last-bit difference (float32 eps 1.2e-7) grows
# through each LayerNorm and softmax; how much depends on how large the logits are.
# A computation that is the same on both sides is compared with torch.equal instead.
#
# The test models built with init_std 0.3-0.5 (sharp attention): predictions of O(1)
# differed between the two paths by at most 3.0e-6 on the Intel machine that runs CI and by
# 1e-5 on an AMD EPYC (sdpa vs eager); any intervention those tests check moves them by
# more than 1e-2.
TWO_PATHS = dict(rtol=0, atol=1e-4)
# Models at BERT's init std 0.02 (the smoke checkpoints, tiny models with the default):
# near-uniform attention, the paths differed by at most 4e-7 on the Intel machine. There a
# head ablated, or the wrong head, moves predictions by only ~1e-4, so the tolerance stays
# well below that.
TWO_PATHS_SMALL = dict(rtol=0, atol=2e-5)
# A loss (L_mask, a mean of squared errors over hundreds of entries) from two such paths:
# relative differences of at most 2.5e-7 on the Intel machine; an intervention the tests
# check moves it by more than 1e-3 relative.
TWO_PATHS_REL = 1e-5


@pytest.fixture(autouse=True)
def _no_figure_left_open():
    """Every pyplot figure a test opened (a library function returns its figure open for the
    notebook to show) is closed after it, so that a worker does not pile them up."""
    yield
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


@pytest.fixture
def logged(caplog):
    """What mclib logged, as a command shows it (mclib.core.console: a record a line): INFO
    (`logged.out()`) and WARNING and above (`logged.err()`), each since its last call, like
    capsys' readouterr().out and .err."""
    caplog.set_level(logging.INFO, logger="mclib")
    seen = {"out": 0, "err": 0}

    def read(stream: str) -> str:
        mine = [
            r
            for r in caplog.records
            if r.name.startswith("mclib")
            and (r.levelno >= logging.WARNING) == (stream == "err")
            and r.levelno >= logging.INFO
        ]
        text = "".join(r.getMessage() + "\n" for r in mine[seen[stream] :])
        seen[stream] = len(mine)
        return text

    class Logged:
        out = staticmethod(lambda: read("out"))
        err = staticmethod(lambda: read("err"))

    return Logged()


@pytest.fixture(scope="session")
def smoke_profile():
    from mclib.core.config import load_profile, profile_path

    return load_profile(profile_path("smoke"))


@pytest.fixture
def slice_trained(tmp_path, smoke_profile):
    """A lease's work folder after its trainer ended by itself: slice A's profile (the smoke
    profile) written there, and a `mclib.lease.slices.STATE` naming a process that has exited.
    Called with the state's other fields (chapters, budget_s, ...); returns the folder."""
    import json
    import subprocess

    import yaml

    from mclib.core.runs import write_atomic
    from mclib.lease import slices

    def write(**state) -> pathlib.Path:
        work = tmp_path / "work"
        work.mkdir()
        ppath = work / "slice-A.yaml"
        ppath.write_text(yaml.safe_dump(smoke_profile.to_dict(), sort_keys=False))
        ended = subprocess.Popen([sys.executable, "-c", "pass"])
        ended.wait()
        record = {
            "slice": "A",
            "pid": ended.pid,
            "profile": str(ppath),
            "seeds": [1],
            "git": "abc1234",
            **state,
        }
        write_atomic(work / slices.STATE, json.dumps(record))
        return work

    return write


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, smoke_profile):
    """A trained smoke run (seconds): checkpoints at the profile's pre/transition/post steps."""
    from mclib.core.train import train

    run_dir = tmp_path_factory.mktemp("smoke_run")
    train(smoke_profile, run_dir, progress=False)
    return run_dir


@pytest.fixture(scope="module")
def short(smoke_profile):
    """30 steps, a checkpoint every 10, metrics flushed every 5 (the resume and damage tests)."""
    return smoke_profile.replace(
        **{
            "train.steps": 30,
            "train.save_every": 10,
            "train.log_every": 5,
            "train.eval_every": 5,
            "checkpoints.pre": 10,
            "checkpoints.transition": [20],
            "checkpoints.post": 30,
        }
    )


@pytest.fixture(scope="module")
def whole(short, tmp_path_factory):
    """`short` trained straight through, once per test module (tests copy it before changing it)."""
    from mclib.core.train import train

    return train(short, tmp_path_factory.mktemp("whole"), progress=False)


@pytest.fixture(scope="module")
def ch(smoke_run, smoke_profile):
    """The smoke run opened as a chapter (`open_chapter`), one per test module, so that a
    module's checkpoints load once and no module sees another's cached models."""
    from mclib.book.chapter import open_chapter

    return open_chapter("smoke", smoke_profile.seed, smoke_run, "cpu")


@pytest.fixture
def gen():
    import torch

    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The smoke book, built once per test run (tests/test_book.py, test_book_browser.py):
    OUT/book/_executed/, OUT/_build/html/, OUT/runs/smoke-seed1/."""
    from mclib.__main__ import main

    out = tmp_path_factory.mktemp("book")
    assert main(["book", "--profile", "smoke", "--out", str(out)]) == 0
    return out


@pytest.fixture
def flip_verdicts(monkeypatch):
    """A function that turns every scorecard verdict from then on: a positive one (matches,
    same direction, same order) or one too close to tell becomes "differs" and "differs" its
    kind's positive verdict
    (`scorecard_rules.judge`, through which `record` and `row_verdict` judge: both modules'
    names for it are turned). A sentence generated from its row's verdict turns with it; one
    that decides by a test of its own does not."""
    from mclib.book import scorecard, scorecard_rules

    judge = scorecard_rules.judge

    def flipped(kind: str = "number", **kw) -> str:
        v = judge(kind, **kw)
        if v == "differs":
            return scorecard_rules.POSITIVE[kind]
        return "differs" if v in ("matches", "same direction", "same order", scorecard_rules.CLOSE) else v

    def flip():
        for module in (
            scorecard,
            scorecard_rules,
        ):  # record looks judge up in scorecard, row_verdict in scorecard_rules
            monkeypatch.setattr(module, "judge", flipped)

    return flip
