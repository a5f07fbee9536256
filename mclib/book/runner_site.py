"""The site: the book's non-notebook sources staged (`_stage`), the toc of this build
(`site_toc`), and Jupyter Book 1's build, warnings as errors (`_build_site`).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ..core.config import parse_yaml
from ..core.repo import REPO

log = logging.getLogger(__name__)

SITE_TOC = Path("_build") / "_toc.yml"


def _stage(out: Path) -> list[Path]:
    """Copy the book's non-notebook sources into `out` (a no-op when out is the repo)."""
    sources = [REPO / "_config.yml", REPO / "_toc.yml"] + sorted(
        p
        for p in (REPO / "book").rglob("*")
        if p.is_file()
        and p.suffix != ".ipynb"
        and "_executed" not in p.parts
        and "__pycache__" not in p.parts
    )  # book/_ext's extensions: their bytecode is no source
    staged = [out / p.relative_to(REPO) for p in sources]
    if out != REPO:
        for src, dst in zip(sources, staged):
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return staged


def site_toc(out: Path, executed: list[str], parts: list[list[Path]]) -> Path:
    """Write OUT/_build/_toc.yml: the chapters with an executed copy (`executed`), then each part
    of `parts` (its first page, the others as its sections)."""
    entry = lambda page: Path(page).relative_to(out).with_suffix("").as_posix()
    book = parse_yaml((REPO / "_toc.yml").read_text())
    book["chapters"] = [c for c in book["chapters"] if c["file"] in executed]
    for pages in parts:
        part = {"file": entry(pages[0])}
        if pages[1:]:
            part["sections"] = [{"file": entry(p)} for p in pages[1:]]
        book["chapters"].append(part)
    path = Path(out) / SITE_TOC
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    return path


# What a site of some chapters only may leave unresolved: links to the chapters not in it, and
# the landing page's numbers glued by the scorecard chapter when that is not in it.
PARTIAL_WARNINGS = ["myst.xref_missing", "mystnb.glue_ref"]


def partial_config(out: Path) -> Path:
    """Write OUT/_build/_config.partial.yml: _config.yml letting `PARTIAL_WARNINGS` through, its
    relative paths made absolute (jupyter-book reads them from the config file's folder)."""
    config = parse_yaml((Path(out) / "_config.yml").read_text())
    sphinx = config["sphinx"]
    sphinx["config"]["suppress_warnings"] = PARTIAL_WARNINGS
    sphinx["config"]["html_static_path"] = [str(Path(out) / p) for p in sphinx["config"]["html_static_path"]]
    sphinx["local_extensions"] = {k: str(Path(out) / v) for k, v in sphinx["local_extensions"].items()}
    path = Path(out) / "_build" / "_config.partial.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _build_site(out: Path, toc: Path, partial: bool = False) -> dict:
    """Jupyter Book 1 with every page re-read (--all), warnings as errors; partial (some chapters
    only): `partial_config`. Returns the site's record."""
    t0 = time.time()
    log_file = out / "_build" / "jupyter-book.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "_build" / "html", ignore_errors=True)  # no stale pages or images
    cmd = [
        sys.executable,
        "-c",
        "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
        "build",
        str(out),
        "--path-output",
        str(out),
        "--toc",
        str(toc),
        "-W",
        "-n",
        "--keep-going",
        "--all",
    ]
    if partial:
        cmd += ["--config", str(partial_config(out))]
    p = subprocess.run(cmd, capture_output=True, text=True)
    log_file.write_text(p.stdout + p.stderr)
    warnings = [l for l in (p.stdout + p.stderr).splitlines() if "WARNING" in l or "ERROR" in l]
    for w in warnings:
        log.warning(w)
    rec = {
        "status": "ok" if p.returncode == 0 else "failed",
        "duration_s": round(time.time() - t0, 1),
        "log": str(log_file),
        "warnings": len(warnings),
    }
    if p.returncode:
        rec["error"] = f"exit {p.returncode}, {len(warnings)} warnings/errors"
    return rec
