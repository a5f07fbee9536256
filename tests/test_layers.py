"""The layers of mclib import downward only: core knows nothing of analyses or the book,
analyses know nothing of the book (mclib/core/__init__.py, mclib/analyses/__init__.py), and
the GPU lease's room sits between the book's machinery and the chapters
(mclib/lease/__init__.py, mclib/chapters/__init__.py): it executes chapters through the
book's runner and judges by its scorecard, and the chapters read its results and declare
the rules it re-judges by, in their specs (mclib.book.spec), which the rooms above hand down.

Every module's imports are read with `ast`, lazy imports inside functions included, and so
are the imports made at run time by name (`importlib.import_module`, `importlib.util.find_spec`,
`__import__`, of a string or an f-string's literal start, relative ones resolved), so an arrow
that runs upward fails here, naming the file, the line and the import; no room names a module
of a higher room as a string of code (a name kept to import later: `"mclib.chapters.ch"`), and
no room below the chapters names a chapter module in its code at all (the machinery is handed
the chapters' specs; it finds no chapter); and no file reaches itself through imports
(benchmarks/layout.py's circles)."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

MCLIB = Path(__file__).resolve().parents[1] / "mclib"
# bottom to top, one folder each: "book" is the machinery the chapters share (runner, chapter
# protocol, scorecard, plots, ...), "chapters" the book's chapter modules and their parts
# (mclib/chapters/chNN_name.py, followup.py, chapter 07's last section, ...)
LAYERS = ("core", "analyses", "book", "lease", "chapters")
# a chapter module named in a string of code: `import_module("mclib.chapters.ch01_train")`
NAMED_CHAPTER = re.compile(r"mclib\.chapters\.(ch\d\d_\w+|followup)\b")
# a string of code that is a module's dotted name, or its start (an f-string's literal part)
MODULE_PATH = re.compile(r"mclib(\.\w*)+")
# the calls that import a module named at run time
DYNAMIC = ("import_module", "find_spec", "__import__")


def _module(path: Path, root: Path) -> list[str]:
    """mclib/core/model.py -> ["mclib", "core", "model"]; a package's __init__ is the package."""
    parts = ["mclib", *path.relative_to(root).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports(path: Path, root: Path = MCLIB) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in the file, lazy ones included."""
    me = _module(path, root)
    package = me if path.name == "__init__.py" else me[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from ..analyses.attention import IMPL` names the module; `from .. import book` names
            # book; `from ..chapters import ch01_train` names the module imported from the package
            module = layer_of(stem) and stem.count(".") >= 2
            names = [stem] if module else [f"{stem}.{a.name}" for a in node.names]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Call) and _called(node.func) in DYNAMIC and node.args:
            name = _literal_start(node.args[0])
            if name and name.startswith("."):  # import_module(".x", __package__)
                level = len(name) - len(name.lstrip("."))
                name = ".".join(package[: len(package) - level + 1] + [name.lstrip(".")]).rstrip(".")
            if name:
                found.append((node.lineno, name))
    return found


def _called(func: ast.expr) -> str | None:
    """`importlib.util.find_spec` -> "find_spec", `import_module` -> "import_module"."""
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _literal_start(node: ast.expr) -> str | None:
    """A string's value, or an f-string's literal start (f"mclib.chapters.ch{stem}" -> "mclib.chapters.ch");
    None where the name is computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return node.values[0].value
    return None


def layer_of(dotted: str) -> str | None:
    """ "mclib.analyses.attention" -> "analyses", "mclib.chapters.ch01_train" -> "chapters"; None
    for anything outside the layers (mclib/__main__.py, the command line, sits above them all)."""
    parts = dotted.split(".")
    if len(parts) < 2 or parts[0] != "mclib" or parts[1] not in LAYERS:
        return None
    return parts[1]


def upward_imports(root: Path = MCLIB) -> list[str]:
    """'FILE:LINE imports NAME (LAYER -> LAYER)' for every import of a higher layer."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        here = layer_of(".".join(_module(path, root)))
        if here is None:
            continue
        for line, name in imports(path, root):
            there = layer_of(name)
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {name} ({here} -> {there})")
    return sorted(set(bad))


def _code_strings(tree: ast.AST):
    """(line, value) of every string of code in the tree, an f-string's literal parts included;
    docstrings are not code."""
    docstrings = {
        id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def modules_named_above(root: Path = MCLIB) -> list[str]:
    """'FILE:LINE names NAME (LAYER -> LAYER)' for every string of code that is, whole, the dotted
    name of a module of a higher room or its start: a name kept to import it later, which
    `imports` cannot follow (`MOD = "mclib.chapters.ch"`, then `import_module(MOD + stem)`)."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        here = layer_of(".".join(_module(path, root)))
        if here is None:
            continue
        for line, value in _code_strings(ast.parse(path.read_text(), filename=str(path))):
            there = layer_of(value.rstrip(".")) if MODULE_PATH.fullmatch(value) else None
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{path.relative_to(root.parent)}:{line} names {value} ({here} -> {there})")
    return sorted(set(bad))


def chapters_named_below(root: Path = MCLIB) -> list[str]:
    """'FILE:LINE names NAME (LAYER)' for every string of code (a docstring is not code) in a
    room below the chapters that names a chapter module: an import by name that `imports`
    cannot see, such as importlib.import_module("mclib.chapters.ch01_train")."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        here = layer_of(".".join(_module(path, root)))
        if here is None or here == "chapters":
            continue
        for line, value in _code_strings(ast.parse(path.read_text(), filename=str(path))):
            for m in NAMED_CHAPTER.finditer(value):
                bad.append(f"{path.relative_to(root.parent)}:{line} names {m.group(0)} ({here})")
    return sorted(set(bad))


def test_no_layer_imports_a_higher_one():
    bad = upward_imports()
    assert not bad, f"imports that run upward ({' < '.join(LAYERS)}):\n" + "\n".join(bad)


def test_no_room_below_the_chapters_names_a_chapter_module():
    bad = chapters_named_below()
    assert not bad, "chapter modules named below mclib/chapters (take the specs handed down):\n" + "\n".join(
        bad
    )


def test_no_room_keeps_the_name_of_a_higher_room_s_module():
    bad = modules_named_above()
    assert not bad, f"modules of a higher room named to import later ({' < '.join(LAYERS)}):\n" + "\n".join(
        bad
    )


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            "from ..analyses.attention import IMPL",
            "mclib/core/x.py:1 imports mclib.analyses.attention (core -> analyses)",
        ),
        ("import mclib.book.plots_base", "mclib/core/x.py:1 imports mclib.book.plots_base (core -> book)"),
        ("def f():\n    from .. import book", "mclib/core/x.py:2 imports mclib.book (core -> book)"),
    ],
)
def test_the_reader_sees_upward_imports_relative_absolute_and_lazy(tmp_path, source, expected):
    root = tmp_path / "mclib"
    (root / "core").mkdir(parents=True)
    (root / "core" / "x.py").write_text(source + "\n")
    (root / "analyses").mkdir()
    (root / "analyses" / "y.py").write_text("from ..core import x\nfrom ..book.scorecard import record\n")
    assert expected in upward_imports(root)
    assert "mclib/analyses/y.py:2 imports mclib.book.scorecard (analyses -> book)" in upward_imports(root)
    assert not any("y.py:1" in b for b in upward_imports(root))  # downward is fine


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A mclib in tmp_path of these files (path inside mclib -> source); its root."""
    root = tmp_path / "mclib"
    for name, source in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    return root


def test_the_lease_room_sits_between_the_book_s_machinery_and_its_chapters(tmp_path):
    root = _tree(
        tmp_path,
        {
            "lease/x.py": "from ..book import scorecard\nfrom ..chapters import ch01_train\n"
            "def f():\n    from ..chapters.followup import g\nimport mclib.chapters.heads_readings\n",
            "book/runner.py": "from ..lease import part\n",
            "chapters/ch99_scorecard.py": "from ..lease import reference\n"
            "from ..book.runner import declared\n"
            "from .heads_readings import e4_rows\n",
        },
    )
    assert upward_imports(root) == [
        "mclib/book/runner.py:1 imports mclib.lease.part (book -> lease)",
        "mclib/lease/x.py:2 imports mclib.chapters.ch01_train (lease -> chapters)",
        "mclib/lease/x.py:4 imports mclib.chapters.followup (lease -> chapters)",
        "mclib/lease/x.py:5 imports mclib.chapters.heads_readings (lease -> chapters)",
    ]


def test_the_lease_room_names_no_chapter_module_even_by_a_string(tmp_path):
    root = _tree(
        tmp_path,
        {
            "lease/x.py": '"""Re-judged by mclib.chapters.ch03_heads.rejudged (a docstring: fine)."""\n'
            "import importlib\n"
            "def f():\n    return importlib.import_module('mclib.chapters.ch03_heads')\n",
            "chapters/ch07_beyond.py": "import importlib\n"
            "F = importlib.import_module('mclib.chapters.followup')\n",
        },
    )
    assert chapters_named_below(root) == ["mclib/lease/x.py:4 names mclib.chapters.ch03_heads (lease)"]
    assert upward_imports(root) == [
        "mclib/lease/x.py:4 imports mclib.chapters.ch03_heads (lease -> chapters)"
    ]


def test_a_lower_room_imports_no_higher_one_at_run_time_by_name(tmp_path):
    """The runner finding chapters by the naming rule (what it did before the specs) is an
    upward import made at run time; so are find_spec, __import__ and a relative name, inside a
    function or not. A room importing its own or a lower room's module by name is fine, and
    so is a message that mentions a higher module in words."""
    root = _tree(
        tmp_path,
        {
            "book/runner.py": "import importlib\nimport importlib.util\ndef g(stem):\n"
            "    if importlib.util.find_spec(f'mclib.chapters.ch{stem}'):\n"
            "        return importlib.import_module(f'mclib.chapters.ch{stem}')\n",
            "book/y.py": "from importlib import import_module\n"
            "M = import_module('..lease.part', __package__)\n"
            "T = __import__('mclib.lease.reference')\nsaid = 'hand mclib.chapters.registry.specs() down'\n",
            "core/z.py": "import importlib\nMOD = 'mclib.analyses.'\n"
            "def h(name):\n    return importlib.import_module(MOD + name)\n",
            "chapters/registry.py": "import importlib\ndef load(stem):\n"
            "    return importlib.import_module(f'{__package__}.ch{stem}')\n"
            "R = importlib.import_module('mclib.book.runner')\n",
        },
    )
    assert upward_imports(root) == [
        "mclib/book/runner.py:4 imports mclib.chapters.ch (book -> chapters)",
        "mclib/book/runner.py:5 imports mclib.chapters.ch (book -> chapters)",
        "mclib/book/y.py:2 imports mclib.lease.part (book -> lease)",
        "mclib/book/y.py:3 imports mclib.lease.reference (book -> lease)",
    ]
    assert modules_named_above(root) == [
        "mclib/book/runner.py:4 names mclib.chapters.ch (book -> chapters)",
        "mclib/book/runner.py:5 names mclib.chapters.ch (book -> chapters)",
        "mclib/book/y.py:3 names mclib.lease.reference (book -> lease)",
        "mclib/core/z.py:2 names mclib.analyses. (core -> analyses)",
    ]


def _layout():
    """benchmarks/layout.py, the project's import-graph measure: the circles this test fails on
    are the ones it reports."""
    spec = importlib.util.spec_from_file_location("layout", MCLIB.parent / "benchmarks" / "layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_circle_among_files():
    """No module reaches itself through imports (lazy ones included): a change to one file
    reaches only the files above it."""
    layout = _layout()
    found = layout.circles(layout.file_arrows(MCLIB.parent))
    assert not found, "circles among files (each reaches the others through imports):\n" + "\n".join(
        ", ".join(c) for c in found
    )


def test_the_measure_sees_a_circle_through_a_lazy_import(tmp_path):
    layout = _layout()
    (tmp_path / "mclib" / "book").mkdir(parents=True)
    (tmp_path / "mclib" / "book" / "a.py").write_text("from . import b\n")
    (tmp_path / "mclib" / "book" / "b.py").write_text("def f():\n    from .c import g\n")
    (tmp_path / "mclib" / "book" / "c.py").write_text("from .a import x\n")
    (tmp_path / "mclib" / "book" / "d.py").write_text("from .a import x\n")  # downward only: not in it
    assert layout.circles(layout.file_arrows(tmp_path)) == [["mclib.book.a", "mclib.book.b", "mclib.book.c"]]


MAX_POSITIONAL = 5  # results travel as small dataclasses, options by keyword


def test_no_function_takes_more_than_five_positional_arguments():
    """Every function of mclib takes at most MAX_POSITIONAL positional parameters (self
    not counted); the rest are keyword-only, so a call names what it passes."""
    too_many = []
    for path in sorted(MCLIB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = node.args.posonlyargs + node.args.args
                own = 1 if params and params[0].arg in ("self", "cls") else 0
                if len(params) - own > MAX_POSITIONAL:
                    too_many.append(f"{path.relative_to(MCLIB.parent)}:{node.lineno} {node.name}")
    assert not too_many, too_many


# Files read top to bottom, functions read in one screen: the house's limits (a file of mclib
# over ~500 lines or a function over ~80 is split by concern, not by line count alone).
FILE_LINES, FUNCTION_LINES = 520, 80


def test_no_file_of_mclib_is_longer_than_the_limit():
    long = {
        str(p.relative_to(MCLIB.parent)): n
        for p in sorted(MCLIB.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > FILE_LINES
    }
    assert not long, long


def test_no_function_of_mclib_is_longer_than_the_limit():
    long = {}
    for p in sorted(MCLIB.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES:
                    long[f"{p.relative_to(MCLIB.parent)}:{node.lineno} {node.name}"] = n
    assert not long, long
