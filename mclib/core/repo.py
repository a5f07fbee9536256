"""The repository this code runs from: its root, its git revision, and the hash of mclib's
sources. Below everything that reads them (the book's runner and chapters, the GPU lease's
slices and results), so that none of those imports another for a constant."""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"


def short_sha(*parts) -> str:
    """16 hex digits of SHA-256 over `parts` (bytes as they are, anything else as sorted JSON)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else json.dumps(p, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def mclib_sha() -> str:
    """The hash of every mclib source file, by path and content: a chapter may import any module."""
    files = sorted((REPO / "mclib").rglob("*.py"))
    return short_sha(*[f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes() for f in files])


def git_revision() -> str:
    try:
        git = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True,
                                        check=True).stdout.strip()
        # dirty = a tracked file changed (as `git describe --dirty`); untracked files such
        # as a virtualenv in the clone do not make the revision's code different
        return git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain",
                                                                      "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
