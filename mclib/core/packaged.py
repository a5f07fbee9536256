"""The files mclib ships inside the package, found through `importlib.resources` (as in a checkout,
so in an installed wheel):

    mclib/profiles/  the profiles (`profile_file("cpu")`); in a checkout a link to params/
    mclib/data/      the tables the library reads (`data_file("rounding.csv")`); in a checkout a link
                     to docs/data/

In a checkout each path is returned resolved, naming params/ or docs/data/ (which messages and
the book quote); in a wheel the files are copies inside mclib/ (pyproject.toml's package-data).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .repo import short_sha

# The tables under mclib/data/ that the library reads (the rest of docs/data/ is the docs'):
# every one listed in pyproject.toml's package-data; tests/test_package.py checks the two agree.
DATA_FILES = (
    "tf32_study.csv",
    "rounding.csv",
    "width_depth.csv",
    "attention_bias.csv",
    "attention_bias_measures.csv",
)


def _packaged(*parts: str) -> Path:
    # mclib is a plain folder on disk (pip installs it so; nothing runs it from a zip), so the
    # Traversable that importlib.resources gives is a Path
    return Path(str(resources.files("mclib").joinpath(*parts))).resolve()


def profile_file(name: str) -> Path:
    """The shipped profile `name` (mclib/profiles/NAME.yaml); it may not exist: the caller says so."""
    return _packaged("profiles", f"{name}.yaml")


def profile_names() -> list[str]:
    """The shipped profiles' names, sorted."""
    return sorted(p.stem for p in _packaged("profiles").glob("*.yaml"))


def data_file(name: str) -> Path:
    """The shipped table `name` (one of DATA_FILES): mclib/data/NAME, docs/data/NAME in a checkout."""
    if name not in DATA_FILES:
        raise ValueError(f"{name!r} is not one of mclib's data files ({', '.join(DATA_FILES)})")
    return _packaged("data", name)


def data_sha() -> str:
    """The hash of the shipped tables (DATA_FILES), by name and content; a missing one hashes as
    missing. The book's chapters read them, so a chapter is executed again when one changes."""
    parts = []
    for name in DATA_FILES:
        path = data_file(name)
        parts.append(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"(missing)"))
    return short_sha(*parts)
