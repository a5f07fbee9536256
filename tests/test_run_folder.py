"""mclib/core/runs.py owns the run folder: every name inside one is defined there, its
docstring's diagram shows them all, and no other module or script writes one itself."""

import re
from pathlib import Path

from sources import literal_strings

from mclib.core import runs

ROOT = Path(__file__).resolve().parents[1]
# runs.py's names of files and folders inside a run folder (its upper-case string constants)
NAMES = {k: v for k, v in vars(runs).items() if k.isupper() and isinstance(v, str)}


def test_the_diagram_shows_every_name_runs_defines():
    assert {
        "PROFILE",
        "METRICS",
        "CHECKPOINTS",
        "MODEL_FILE",
        "STATE_FILE",
        "END",
        "LOCK",
        "LOSS_CURVE",
        "SWEEP_MARKER",
        "SCORECARD",
        "FREEZE",
        "FREEZE_SOURCE",
    } <= set(NAMES)
    missing = [v for v in NAMES.values() if v not in runs.__doc__]
    assert not missing, f"runs.py's diagram does not show {missing}"
    assert runs.checkpoint_zip_path("r", 40).name in runs.__doc__.replace("004000", "000040")
    assert runs.freeze_dir("r", "mlp") == Path("r") / runs.FREEZE / "mlp"


def test_no_other_module_or_script_names_a_file_of_the_run_folder():
    """A file name of the run folder typed as a string anywhere but runs.py (docstrings and
    comments aside) would be a second definition of the layout."""
    names = [v for v in NAMES.values() if "." in v] + ["checkpoint_step_"]
    # a name counts where it stands alone or after a path separator ("runs/x/.lock"), not inside
    # another name ("requirements.lock")
    typed = re.compile("|".join(r"(?<![\w-])" + re.escape(n) for n in names))
    files = [
        p
        for p in sorted((ROOT / "mclib").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
        if p != Path(runs.__file__)
    ]
    found = {str(p.relative_to(ROOT)): [s for s in literal_strings(p) if typed.search(s)] for p in files}
    assert len(found) > 40 and not any(found.values()), {k: v for k, v in found.items() if v}


def test_the_files_a_chapter_declares_it_reads_are_runs_names():
    """A notebook's metadata names the run-folder files it reads besides the run
    (`runner_execute.declared_reads`, e.g. the scorecard page: scorecard.json); JSON cannot import
    runs.py, so this holds them to its names."""
    from mclib.book import runner, runner_execute

    declared = {n for t in runner.chapters() for n in runner_execute.declared_reads(t)}
    assert declared and declared <= set(NAMES.values()), declared - set(NAMES.values())
