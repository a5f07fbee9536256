"""The product names revisions and dates, never the tracker's issue numbers or the work sessions
that made it: a clone cannot look either up. Every tracked text file is read (code, tests,
notebooks, profiles, sweeps, docs, the README); another project's issue (`pytorch/pytorch#178080`),
pytest's `scope="session"`, a process session (`start_new_session`) and the SESSION of solver
results are not history and pass."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = (".py", ".md", ".yaml", ".yml", ".ipynb", ".sh", ".cff", ".toml", ".txt", ".cfg")

ISSUE = re.compile(r"(?<![\w/#])issues?\s+#?\d+|(?<![\w/])#\d{1,3}\b(?!\w)", re.IGNORECASE)
SESSION = re.compile(
    r"\bsessions\b|\b(?:this|that|the|a|one|each|every|next|previous|earlier|later|work|"
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\w+(?:st|nd|rd|th))"
    r"\s+session\b|\bsession\s+\d|\bsession of\b",
    re.IGNORECASE,
)
NOT_HISTORY = re.compile(
    r"scope=\"session\"|start_new_session|new process session|\bSESSION\b|"
    r"[\w.-]+/[\w.-]+#\d+"
)


def offences(text: str) -> list[str]:
    """The phrases of `text` that name an issue number or a work session."""
    found = []
    for line in text.splitlines():
        line = NOT_HISTORY.sub("", line)
        found += [m.group(0) for m in ISSUE.finditer(line)] + [m.group(0) for m in SESSION.finditer(line)]
    return found


@pytest.mark.parametrize(
    "text, bad",
    [
        ("E2 at the paper's step (issue 48)", ["issue 48"]),
        ("Issue 6, item 2: bf16", ["Issue 6"]),
        ("trained over two sessions", ["sessions"]),
        ("the twenty-first session timed it", ["first session"]),
        ("measured this session", ["this session"]),
        ("see #37 for the plan", ["#37"]),
        ("pytorch/pytorch#178080 returns a wrong shape", []),
        ('@pytest.fixture(scope="session")', []),
        ("start_new_session=True", []),
        ("solves = SESSION if solves is None", []),
        ("revision 9842a40 (2026-11-26) removed it", []),
        ("an issue of the paper's Fig. 2", []),
    ],
)
def test_the_rule_finds_history_words_and_passes_the_rest(text, bad):
    assert offences(text) == bad


def test_no_tracked_file_names_an_issue_number_or_a_work_session():
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    found = []
    for name in files.decode().split("\0"):
        path = ROOT / name
        if name.endswith(TEXT) and path.is_file() and name != "tests/test_history_words.py":
            for phrase in offences(path.read_text(errors="replace")):
                found.append(f"{name}: {phrase!r}")
    assert not found, "\n".join(found[:40])
