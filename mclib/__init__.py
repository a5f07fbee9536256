"""mclib: the library behind the book "Abrupt Learning in Transformers: matrix completion".

Five rooms, one folder each; an arrow only points down the list (tests/test_layers.py), and
the command line (mclib/__main__.py) sits above them all:

    chapters/  one module per chapter, which its notebook only calls
               (book/NN_name.ipynb <-> mclib/chapters/chNN_name.py)
    lease/     the paper's own setting trained and analysed in slices on a lent GPU
    book/      the machinery the chapters share: the runner (papermill + Jupyter Book), the
               chapter protocol, the scorecard, the figures
    analyses/  one module per kind of measurement on a trained model (attention hooks,
               interventions, evaluation, heads, probes, embeddings, progress, baselines, freezing)
    core/      profiles, data, model, the training step and loop, run folders, Dask jobs, sweeps,
               the paper's numbers

Each folder's __init__.py lists its modules. The protocol of every experiment (E1-E20)
is docs/protocol.md.

The names below are the public API, the ones README's examples use; each is imported from its
module when first used (`mclib.evaluate`, `from mclib import hooks`), so `import mclib` stays
cheap: no torch until a name that needs it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

# name -> the module that defines it
_API = {
    "load_profile": "mclib.core.config",
    "profile_path": "mclib.core.config",
    "train": "mclib.core.train",
    "run_profile": "mclib.core.runs",
    "load_metrics": "mclib.core.runs",
    "saved_steps": "mclib.core.checkpoints",
    "load_checkpoint": "mclib.core.checkpoints",
    "find_drop": "mclib.core.metrics",
    "hooks": "mclib.core.hooks",
    "run_with_cache": "mclib.core.hooks",
    "evaluate": "mclib.analyses.evaluate",
    "load_for_interp": "mclib.analyses.interp",
    "nnsight_model": "mclib.analyses.interp",  # the extra `interp`
}
__all__ = ["__version__", *_API]


def _version() -> str:
    """pyproject.toml's version where mclib runs from its source tree (an editable install's
    metadata is as old as its last `pip install -e`), else the installed distribution's
    (importlib.metadata), else "0+unknown"."""
    import tomllib  # noqa: PLC0415 - `import mclib` stays cheap
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - ditto (about 30 ms)

    try:
        with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
            project = tomllib.load(f)["project"]
        if project["name"] == "mclib":
            return project["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    try:
        return version("mclib")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str):
    if name == "__version__":
        value = _version()
    elif name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
    else:
        raise AttributeError(f"module 'mclib' has no attribute {name!r}")
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
