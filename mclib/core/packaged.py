"""The files mclib ships inside the package and reads at run time, found through
`importlib.resources`, so that an installed wheel finds them as a source checkout does.

    mclib/profiles/  the profiles (`profile_file("cpu")`); in a checkout a link to params/
    mclib/data/      the tables the library reads (`data_file("rounding.csv")`); in a checkout
                     a link to docs/data/, where the scripts that make them write them

In a checkout each path is returned resolved, so it names params/ or docs/data/ as before
(messages and the book quote those paths); in a wheel the files are copies inside mclib/
(pyproject.toml's package-data lists them). What needs the whole checkout (the book's
notebooks, the GPU lease's ledger, git) is in mclib.core.repo.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

# The tables under mclib/data/ that the library reads (the rest of docs/data/ is the docs'):
# every one listed in pyproject.toml's package-data; tests/test_package.py checks the two agree.
DATA_FILES = ("tf32_study.csv", "rounding.csv", "width_depth.csv", "attention_bias.csv",
              "attention_bias_measures.csv")


def _packaged(*parts: str) -> Path:
    # mclib is a plain folder on disk (pip installs it so; nothing runs it from a zip), so the
    # Traversable that importlib.resources gives is a Path
    return Path(str(resources.files("mclib").joinpath(*parts))).resolve()


def profile_file(name: str) -> Path:
    """The shipped profile `name` ("cpu" -> mclib/profiles/cpu.yaml, params/cpu.yaml in a
    checkout); it may not exist: the caller says so, naming the path."""
    return _packaged("profiles", f"{name}.yaml")


def profile_names() -> list[str]:
    """The shipped profiles' names, sorted."""
    return sorted(p.stem for p in _packaged("profiles").glob("*.yaml"))


def data_file(name: str) -> Path:
    """The shipped table `name` (one of DATA_FILES): mclib/data/NAME, docs/data/NAME in a checkout."""
    if name not in DATA_FILES:
        raise ValueError(f"{name!r} is not one of mclib's data files ({', '.join(DATA_FILES)})")
    return _packaged("data", name)
