"""Executing one chapter with papermill: the executed copy with this machine's paths made relative
(`machine_paths`), the kernel's stderr in a log beside it, and the key that says whether the
last build's copy can be reused (`_key`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path

from ..core.checkpoints import saved_steps
from ..core.repo import REPO, short_sha
from ..core.runs import METRICS

# papermill's bar over a chapter's cells, without tqdm's rate and remaining time, which a cell
# that trains for half an hour makes meaningless (the training has its own line: `_report_training`)
CELL_BAR = {"bar_format": "{desc}: {n_fmt}/{total_fmt} cells [{elapsed}]"}


# --- hashes -------------------------------------------------------------------------


def _file_sha(path: Path) -> str | None:
    return short_sha(path.read_bytes()) if path.is_file() else None


def run_state(run_dir: Path) -> str:

    return short_sha(saved_steps(run_dir), _file_sha(run_dir / METRICS))


# --- one chapter --------------------------------------------------------------------


def declared_reads(template: Path) -> list[str]:
    """The run-folder files a chapter reads besides the run, from its notebook metadata
    ("mclib": {"reads": [...]}), e.g. the scorecard page's scorecard.json."""
    meta = json.loads(template.read_text()).get("metadata", {}).get("mclib", {})
    return list(meta.get("reads", []))


def _key(template: Path, params: dict, profile: dict, run_dir: Path, src: str) -> str:
    extra = [(name, _file_sha(run_dir / name)) for name in declared_reads(template)]
    return short_sha(_file_sha(template), params, profile, src, run_state(run_dir), extra or None)


# Importing the model imports transformers, which imports tqdm.auto; in a kernel without
# ipywidgets that warns on stderr at import time, before a chapter's first line runs. The kernels
# the book starts ignore it (PYTHONWARNINGS, set while one starts); importing mclib filters nothing.
QUIET_KERNEL = "ignore:IProgress not found"


@contextlib.contextmanager
def _kernel_warnings(option: str):
    """PYTHONWARNINGS with `option` added while the block starts a kernel, as it was after."""
    old = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [old, option]))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = old


@contextlib.contextmanager
def _kernel_stderr_to(log: Path):
    """Point file descriptor 2, which the kernel inherits, at `log`, while our own sys.stderr
    stays on the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(log, "wb") as f:
        os.dup2(f.fileno(), 2)
    old = sys.stderr
    with contextlib.suppress(AttributeError, OSError, ValueError):  # e.g. pytest's capture has no fd
        if sys.stderr.fileno() == 2:
            sys.stderr = open(saved, "w", buffering=1, closefd=False)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = old
        os.dup2(saved, 2)
        os.close(saved)


def _why(e: BaseException) -> str:
    """One line: the cell's exception for a cell error, else the exception's first line."""
    if hasattr(e, "ename"):  # PapermillExecutionError
        return f"{e.ename}: {e.evalue}"[:200]
    lines = [l for l in str(e).splitlines() if l.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:200]


def machine_paths(out: Path, run_dir: Path) -> dict[str, str]:
    """{absolute path of this machine: what a notebook says instead}: the run folder relative
    to `out`, `out` and the repository ".", sys.prefix "<python>", the home folder "~"."""
    return {
        str(Path(run_dir).resolve()): os.path.relpath(Path(run_dir).resolve(), Path(out).resolve()),
        str(Path(out).resolve()): ".",
        str(REPO): ".",
        sys.prefix: "<python>",
        str(Path.home()): "~",
    }


def relative_paths(text: str, paths: dict[str, str]) -> str:
    """`text` with each absolute path of `paths` (longest first) replaced, "ABS/x" by "REL/x"
    ("x" where REL is "."); a path that merely starts like one ("/tmp/out2") is left."""

    for absolute in sorted((p for p in paths if len(p) > 1), key=len, reverse=True):
        rel = paths[absolute]
        text = re.sub(
            re.escape(absolute) + r"(/|(?![\w.\-]))",
            lambda m: ("" if rel == "." else rel + "/") if m.group(1) else rel,
            text,
        )
    return text


def _relative_everywhere(node, paths: dict[str, str]):
    """`relative_paths` on every string of a notebook but image data (base64 can spell a path)."""
    if isinstance(node, str):
        return relative_paths(node, paths)
    if isinstance(node, list):
        return [_relative_everywhere(v, paths) for v in node]
    if isinstance(node, dict):
        for k, v in node.items():
            if not k.startswith("image/"):
                node[k] = _relative_everywhere(v, paths)
    return node


def _execute(
    template: Path,
    output: Path,
    params: dict,
    timeout: float | None,
    progress: bool,
    *,
    paths: dict[str, str] | None = None,
) -> None:
    """Run `template` into `output` with papermill, every path of `paths` then written relative;
    an error output raises."""
    import nbformat  # noqa: PLC0415 - Jupyter's, only when a chapter executes
    import papermill as pm  # noqa: PLC0415 - heavy, only when a chapter executes

    with _kernel_stderr_to(output.with_suffix(".kernel.log")), _kernel_warnings(QUIET_KERNEL):
        pm.execute_notebook(
            template,
            output,
            parameters=params,
            cwd=REPO,  # cwd: `import mclib` works uninstalled
            execution_timeout=timeout,
            progress_bar=progress and CELL_BAR,
        )
    nb = _relative_everywhere(nbformat.read(output, as_version=4), paths or {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "error":  # belt and braces: papermill should have raised
                raise RuntimeError(f"cell output {out.ename}: {out.evalue}")
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")  # the reader sees the settings table, not the raw paths
    nbformat.write(nb, output)
