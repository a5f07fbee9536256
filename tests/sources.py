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
