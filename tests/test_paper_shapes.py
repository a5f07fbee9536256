"""The whole book at the paper's shapes: params/paper.yaml's model and task
(4 layers x 8 heads, hidden 768, intermediate 3072, 7x7 rank 2) trained a few steps, every
chapter executed, and the checkpoint policy and the site's downloads as a GPU run would
have them. Minutes on a CPU (docs/performance.md, "The paper book at full shape")."""

from __future__ import annotations

import json

import pytest
import yaml

from mclib.__main__ import main
from mclib.book.runner import chapters
from mclib.core.checkpoints import resumable_steps, saved_steps
from mclib.core.paper import profile as paper_profile
from mclib.core.paper import shapes_profile
from mclib.core.runs import run_profile


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper-shapes")
    path = out / "paper-shapes.yaml"
    path.write_text(yaml.safe_dump(shapes_profile().to_dict(), sort_keys=False))
    assert main(["book", "--profile", str(path), "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.slow
def test_the_profile_is_the_papers_model_and_task():
    p, paper = shapes_profile(), paper_profile()
    assert (p.model, p.data) == (paper.model, paper.data)
    assert (p.train.lr, p.train.precision, p.checkpoints.keep) == (
        paper.train.lr,
        paper.train.precision,
        "analysis",
    )


@pytest.mark.slow
def test_every_chapter_executes_at_the_papers_shapes(book):
    manifest = json.loads((book / "book" / "_executed" / "manifest.json").read_text())
    names = [r["name"] for r in manifest["notebooks"]]
    assert names == [t.stem for t in chapters()]
    assert all(r["status"] == "executed" and r["complete"] for r in manifest["notebooks"]), manifest[
        "notebooks"
    ]
    assert manifest["site"]["status"] == "ok" and (book / "_build" / "html" / "index.html").is_file()
    run = book / "runs" / "paper-shapes-seed1"
    assert run_profile(run).model.hidden == 768 and run_profile(run).train.device in ("cpu", "cuda")


@pytest.mark.slow
def test_the_checkpoint_policy_holds_at_the_papers_shapes(book):
    runs = book / "runs"
    main_run = runs / "paper-shapes-seed1"
    assert resumable_steps(main_run) == saved_steps(main_run)[-1:]  # Adam's state only in the newest
    for other in [
        runs / "paper-shapes-seed2",
        runs / "paper-shapes-seed3",
        *sorted((main_run / "freeze").iterdir()),
    ]:
        assert len(saved_steps(other)) == 1, other  # the newest checkpoint alone
    html = book / "_build" / "html"
    zips = [f for f in html.rglob("*.zip")]
    assert not zips, zips  # 120 MB checkpoints stay out of the site
    assert list(html.rglob("metrics.csv"))  # metrics.csv is always a download
