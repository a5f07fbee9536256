"""The tree passes ruff's linter and formatter as pyproject.toml configures them (line length
110, import order, unused names, imports at module top where the library is concerned)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess:
    found = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(found).exists():
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return subprocess.run([found, *args], cwd=ROOT, capture_output=True, text=True)


def test_the_tree_passes_the_linter():
    r = _ruff("check", ".", "--output-format", "concise")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_tree_is_formatted():
    r = _ruff("format", "--check", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
