"""What tests read from the project's source files: the string literals a module writes, and
a script outside the package (benchmarks/, scripts/) imported by its path. Not a test module:
tests import it."""

import ast
import importlib.util
from pathlib import Path


def load_script(path: Path):
    """The script at `path` (e.g. benchmarks/lease_step.py) imported as a module named after it."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def literal_strings(path: Path) -> list[str]:
    """Every string literal of a Python file outside docstrings, f-strings' literal parts
    included (comments and docstrings may name anything; code may not)."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


# A measurement budget the smoke model's variants never reach (seconds each, a minute or two together):
# for the tests that read what ran, not what fitted. A budget of 60 s skipped variants on 2 cores
# shared with two default books (2026-11-29), where those tests then read rows that never ran.
PLENTY_S = 600


def lease_step_args(
    budget_s, variants: str, ledger: Path, out: Path, *, batch: int = 2, steps: int = 2, extra=()
) -> list[str]:
    """benchmarks/lease_step.py's command line for a measurement of the smoke model on the CPU:
    `variants` comma-separated, `steps` timed and checked steps a variant, `extra` more options."""
    return [
        "--budget-s", str(budget_s), "--profile", "smoke", "--batch", str(batch),
        "--steps", str(steps), "--check-steps", str(steps), "--variants", variants,
        "--ledger", str(ledger), "--out", str(out), *extra,
    ]  # fmt: skip
