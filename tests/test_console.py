"""What mclib shows on a console: its modules log and configure nothing; a command shows
INFO on stdout and warnings on stderr while it runs (mclib.core.console)."""

import json
import logging
import subprocess
import sys
from pathlib import Path

from mclib.core.console import console_logging, no_hf_progress_bars

REPO = Path(__file__).resolve().parents[1]


def test_a_command_shows_info_on_stdout_and_warnings_on_stderr_and_leaves_the_logger_as_it_was(capsys):
    log = logging.getLogger("mclib.core.somewhere")
    before = (logging.getLogger("mclib").level, list(logging.getLogger("mclib").handlers))
    with console_logging():
        log.debug("not shown")
        log.info("a line")
        log.warning("mclib: a warning")
    log.warning("after the command")  # pytest's own handlers take it; no console line
    out, err = capsys.readouterr()
    assert out == "a line\n" and err == "mclib: a warning\n"
    assert (logging.getLogger("mclib").level, list(logging.getLogger("mclib").handlers)) == before


def test_importing_mclib_changes_no_global_setting():
    """No filter of warnings, no handler of logging, transformers' progress bars as they were."""
    code = """
import json, logging, warnings
import matplotlib.pyplot, pandas, seaborn, sympy, torch, transformers  # the libraries' own filters first
from transformers.utils import logging as hf
before = [list(warnings.filters), logging.getLogger().handlers[:], hf.is_progress_bar_enabled(),
          logging.getLogger("mclib").handlers[:], logging.getLogger("mclib").level]
import mclib.core.train, mclib.core.gpt, mclib.book.runner, mclib.book.chapter
import mclib.lease.slices_run, mclib.chapters
after = [list(warnings.filters), logging.getLogger().handlers[:], hf.is_progress_bar_enabled(),
         logging.getLogger("mclib").handlers[:], logging.getLogger("mclib").level]
print(json.dumps([a == b for a, b in zip(before, after)]))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [True] * 5


def test_transformers_progress_bars_are_off_only_while_a_checkpoint_loads():
    from transformers.utils import logging as hf

    assert hf.is_progress_bar_enabled()
    with no_hf_progress_bars():
        assert not hf.is_progress_bar_enabled()
    assert hf.is_progress_bar_enabled()
