"""What a command line shows of mclib's log: every module logs to `logging.getLogger(__name__)`
(a child of the "mclib" logger) and configures nothing; a command (`python -m mclib`, the
lease's detached trainer, benchmarks/lease_step.py) shows the records for as long as it runs
(`console_logging`): INFO on stdout, WARNING and above on stderr, each as its bare message (no
level, no logger name).

A library user who configures nothing sees WARNING and above on stderr (Python's last-resort
handler); INFO (a chapter's progress, a slice's status) only where they ask for it."""

from __future__ import annotations

import contextlib
import logging
import sys

LOGGER = "mclib"


class _Stream(logging.StreamHandler):
    """A handler that writes to sys.stdout or sys.stderr as they are when a record comes (a
    test's capture, a notebook's streams), flushing each record."""

    def __init__(self, name: str, levels: tuple[int, int]):
        super().__init__()
        self._name, self._levels = name, levels
        self.setFormatter(logging.Formatter("%(message)s"))
        self.addFilter(lambda r: levels[0] <= r.levelno < levels[1])

    @property
    def stream(self):
        return getattr(sys, self._name)

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it; the stream is looked up at each record
        pass


@contextlib.contextmanager
def console_logging(level: int = logging.INFO):
    """Show mclib's records of `level` and above while the block runs: below WARNING on
    stdout, the rest on stderr; the logger is as it was afterwards."""
    logger = logging.getLogger(LOGGER)
    handlers = [
        _Stream("stdout", (level, logging.WARNING)),
        _Stream("stderr", (max(level, logging.WARNING), 10**9)),
    ]
    old = logger.level
    logger.setLevel(level)
    for h in handlers:
        logger.addHandler(h)
    try:
        yield logger
    finally:
        for h in handlers:
            logger.removeHandler(h)
        logger.setLevel(old)


@contextlib.contextmanager
def no_hf_progress_bars():
    """transformers' progress bars off while the block runs (a bar for each checkpoint loaded
    is noise in a chapter), as they were after: nothing set when mclib is imported."""
    from transformers.utils import logging as hf_logging  # noqa: PLC0415 - console stays light

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
