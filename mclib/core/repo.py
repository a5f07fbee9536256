"""The repository this code runs from: its root (site-packages in an installed wheel, where what
needs the checkout says so: `require_checkout`), its git revision ("unknown" in a wheel), the hash
of mclib's sources. Below everything that reads them, so none imports another for a constant."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # mclib/
REPO = PACKAGE.parent  # the checkout; in an installed wheel, site-packages (then `is_checkout()` is False)
RESULTS = REPO / "results"


class CheckoutError(RuntimeError):
    """What needs the source checkout was asked of an installed mclib; the message is one line."""


def is_checkout() -> bool:
    """Whether mclib runs from its source checkout (_toc.yml and pyproject.toml beside it), not a wheel."""
    return (REPO / "_toc.yml").is_file() and (REPO / "pyproject.toml").is_file()


def require_checkout(what: str) -> None:
    """A one-line CheckoutError where mclib is not its source checkout: `what` (the book, the GPU
    lease's ledger, ...) reads files only the checkout has."""
    if not is_checkout():
        raise CheckoutError(
            f"{what} needs a source checkout of mclib (git clone it, then `pip install -e .` "
            f"there); this mclib is installed at {PACKAGE}"
        )


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


KIT_RECORD = "revision.json"  # in a GPU lease's kit (scripts/wheelhouse.py --kit): the tree it was built from
KIT_ENV = "MCLIB_KIT"  # the kit's folder (scripts/lease.sh sets it); default REPO/.kit


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _git_own_revision() -> str | None:
    """git's short HEAD, "-dirty" where a tracked file changed, or None where git has no answer for
    this folder itself (no git, or a folder without .git inside another repository)."""
    try:
        if Path(_git("rev-parse", "--show-toplevel")).resolve() != REPO.resolve():
            return None
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        return _git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def kit_record() -> dict | None:
    """The kit's record of the tree it was built from ({"git", "mclib", "built"}), or None."""
    kit = REPO / os.environ.get(KIT_ENV, ".kit")  # a relative path is the tree's
    try:
        return json.loads((kit / KIT_RECORD).read_text())
    except (OSError, ValueError):
        return None


def git_revision() -> str:
    """The revision of the code that runs: git's where this folder is its own work tree, else the
    kit's record where its mclib hash matches this tree's, else "unknown"."""
    own = _git_own_revision()
    if own is not None:
        return own
    kit = kit_record()
    if kit and kit.get("git") and kit.get("mclib") == mclib_sha():
        return str(kit["git"])
    return "unknown"


def revisions_of_mclib(sha: str, commits: int = 400) -> list[str]:
    """The commits among HEAD's last `commits` (first parent, newest first) whose mclib/ sources hash
    to `sha`, in one unbroken run; empty where none. Reads git objects, checks nothing out."""
    try:
        revs = _git("rev-list", "--first-parent", f"--max-count={commits}", "HEAD").split()
    except (OSError, subprocess.CalledProcessError):
        return []
    found: list[str] = []
    for rev in revs:
        if tree_mclib_sha(rev) == sha:
            found.append(_git("rev-parse", "--short", rev))
        elif found:
            break
    return found


def commit(rev: str) -> str | None:
    """`rev` (a "-dirty" suffix dropped) as a short commit id of this repository, or None where it is
    not one."""
    try:
        return (
            _git("rev-parse", "--short", "--verify", "--quiet", f"{rev.removesuffix('-dirty')}^{{commit}}")
            or None
        )
    except (OSError, subprocess.CalledProcessError):
        return None


def tree_mclib_sha(rev: str) -> str:
    """`mclib_sha` of commit `rev`'s tree, read from git's objects."""
    listing = [line.split("\t", 1) for line in _git("ls-tree", "-r", rev, "--", "mclib").splitlines()]
    files = sorted((path, meta.split()[2]) for meta, path in listing if path.endswith(".py"))
    blobs = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "--batch"],
        capture_output=True,
        check=True,
        input="".join(f"{blob}\n" for _, blob in files).encode(),
    ).stdout
    parts, at = [], 0
    for path, _ in files:  # each object: "<sha> blob <size>\n<bytes>\n"
        body = blobs.index(b"\n", at) + 1
        size = int(blobs[at:body].split()[2])
        parts.append(path.encode() + b"\0" + blobs[body : body + size])
        at = body + size + 1
    return short_sha(*parts)
