"""Finding what drew a figure: every figure a chapter glues is signed with
the function that drew it (`mclib.book.plots_base.closed`), and the README's table from the
paper's figures to the chapters names only functions that exist."""

import ast
import importlib
import inspect
import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from mclib.book import plots_base
from mclib.core.paper import FIGURES_NEURIPS

ROOT = Path(__file__).resolve().parents[1]
GLUE_FIGURE = re.compile(r"```\{glue:figure\}\s+(\S+)")


def resolve(name: str):
    """The object a dotted name points to: the longest importable module, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


# --- the signature ---------------------------------------------------------------------------


def draws_a_line():
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    return plots_base.closed(fig)


def draws_through_a_comprehension_and_a_nested_function():
    def inner():
        return plots_base.closed(plt.subplots()[0])

    return [plots_base.closed(plt.subplots()[0]) for _ in range(1)][0], inner()


def test_closed_signs_the_figure_with_the_function_that_drew_it():
    fig = draws_a_line()
    assert plots_base.drawer(fig) == f"{__name__}.draws_a_line"
    assert resolve(plots_base.drawer(fig)) is draws_a_line
    texts = [t for t in fig.texts if t.get_gid() == plots_base.DRAWER_GID]
    assert len(texts) == 1 and texts[0].get_text() == f"drawn by {__name__}.draws_a_line"
    assert not plt.get_fignums() or fig.number not in plt.get_fignums()  # closed in pyplot
    # a comprehension or a nested function is not resolvable: the module-level function around it is named
    for f in draws_through_a_comprehension_and_a_nested_function():
        assert plots_base.drawer(f) == f"{__name__}.draws_through_a_comprehension_and_a_nested_function"
    # signed once: a second closed keeps the first name
    assert plots_base.drawer(plots_base.closed(fig)) == f"{__name__}.draws_a_line" and len(fig.texts) == 1
    assert plots_base.drawer(plt.figure()) is None
    plt.close("all")


def test_the_signature_lies_under_the_plot(tmp_path):
    """Below the figure's bottom edge, so that it covers nothing; a PNG cropped to what is
    drawn (IPython's inline backend, which the book's figures go through) shows it."""
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    fig.savefig(tmp_path / "unsigned.png", bbox_inches="tight")
    plots_base.sign(fig, "somewhere.something")
    (text,) = [t for t in fig.texts if t.get_gid() == plots_base.DRAWER_GID]
    fig.canvas.draw()
    assert text.get_window_extent().transformed(fig.transFigure.inverted()).y1 <= 0.001
    fig.savefig(tmp_path / "signed.png", bbox_inches="tight")
    height = lambda name: plt.imread(tmp_path / name).shape[0]
    assert height("signed.png") > height("unsigned.png")  # the crop reaches down to the signature
    plt.close(fig)


# --- every glued figure of every chapter ------------------------------------------------------


def _chapters():
    """(notebook, chapter module, the names its markdown shows as {glue:figure}, its code)."""
    out = []
    for nb in sorted((ROOT / "book").glob("[0-9]*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        names = [
            m
            for c in cells
            if c["cell_type"] == "markdown"
            for m in GLUE_FIGURE.findall("".join(c["source"]))
        ]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        module = re.search(r"from mclib\.chapters import (\w+) as chapter", code).group(1)
        out.append((nb.name, importlib.import_module(f"mclib.chapters.{module}"), names, code))
    return out


def _pattern(node: ast.AST) -> re.Pattern | None:
    """A glue key written in a chapter function as a string or an f-string, as a regex."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.compile(re.escape(node.value) + r"\Z")
    if isinstance(node, ast.JoinedStr):
        return re.compile(
            "".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+" for v in node.values)
            + r"\Z"
        )
    return None


def _drawer_of(module, name: str, code: str):
    """(module, function) that returns the figure glued as `name`: the one the notebook glues
    it from (glue("name", chapter.f(...)), or another mclib.chapters module the notebook imports,
    e.g. followup.f(...)), else the chapter function whose glue dict holds the key."""
    direct = re.search(rf'glue\(\s*"{re.escape(name)}",\s*(\w+)\.(\w+)\(', code)  # one line or several
    if direct:
        alias, fn = direct.groups()
        if alias == "chapter":
            return module, fn
        imported = re.search(rf"from mclib\.chapters import {alias}\b", code)
        assert imported, (name, alias)
        return importlib.import_module(f"mclib.chapters.{alias}"), fn
    tree = ast.parse(inspect.getsource(module))
    found = set()
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            for d in ast.walk(fn):
                if isinstance(d, ast.Dict) and any(
                    p is not None and (pat := _pattern(p)) and pat.match(name) for p in d.keys
                ):
                    found.add(fn.name)
    if (
        not found
    ):  # the name held by a module-level constant (ch03_heads.E10_GLUE): the function that reads it and signs
        held = {
            t.id
            for a in tree.body
            if isinstance(a, ast.Assign)
            for t in a.targets
            if isinstance(t, ast.Name)
            and any(isinstance(c, ast.Constant) and c.value == name for c in ast.walk(a.value))
        }
        found = {
            fn.name
            for fn in tree.body
            if isinstance(fn, ast.FunctionDef)
            and any(isinstance(n, ast.Name) and n.id in held for n in ast.walk(fn))
            and any(
                isinstance(n, ast.Call)
                and "closed" in (getattr(n.func, "id", None), getattr(n.func, "attr", None))
                for n in ast.walk(fn)
            )
        }
    assert len(found) == 1, (module.__name__, name, found)
    return module, found.pop()


def _calls_closed(fn) -> bool:
    return any(
        isinstance(n, ast.Call)
        and (getattr(n.func, "id", None) == "closed" or getattr(n.func, "attr", None) == "closed")
        for n in ast.walk(ast.parse(inspect.getsource(fn)))
    )


CHAPTERS = _chapters()


@pytest.mark.parametrize("notebook, module, names, code", CHAPTERS, ids=[c[0] for c in CHAPTERS])
def test_every_glued_figure_is_signed_by_a_chapter_function(notebook, module, names, code):
    """Each figure a chapter shows comes from a function of its module that passes it
    through `closed`, so the name under it (module.function, `closed`'s caller) is that
    function's, and resolves to it."""
    assert names, notebook
    for name in names:
        drawer, fn_name = _drawer_of(module, name, code)
        fn = resolve(f"{drawer.__name__}.{fn_name}")
        assert inspect.isfunction(fn) and fn.__module__ == drawer.__name__, (notebook, name)
        assert _calls_closed(fn), (
            f"{notebook}: {name} comes from {fn_name}, which does not sign it through closed"
        )


def test_no_chapter_closes_a_figure_unsigned():
    """`plt.close` in a chapter module would be a figure that leaves without its drawer's name."""
    for path in sorted((ROOT / "mclib" / "chapters").glob("*.py")):
        calls = [
            n
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call)
            and getattr(n.func, "attr", None) == "close"
            and getattr(n.func.value, "id", None) == "plt"
        ]
        assert not calls, path.name


def test_the_smoke_chapter_s_figures_name_their_drawers(ch):
    from mclib.chapters import ch01_train, ch02_copying, ch04_embeddings

    _, glued = ch02_copying.pre_losses_and_figures(ch)
    figures = {
        "mclib.chapters.ch01_train.loss_figure": [ch01_train.loss_figure(ch)],
        "mclib.chapters.ch02_copying.pre_losses_and_figures": [
            glued["fig_copy_scatter"],
            glued["fig_mask_value"],
        ],
        "mclib.chapters.ch04_embeddings.position_norms_figure": [ch04_embeddings.position_norms_figure(ch)],
    }
    for name, figs in figures.items():
        assert all(plots_base.drawer(f) == name for f in figs) and callable(resolve(name))


# --- the README's table ---------------------------------------------------------------------


def _readme_table() -> list[dict]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## The paper's figures, chapter by chapter", 1)[1].split("\n## ", 1)[0]
    lines = [l for l in section.splitlines() if l.startswith("| ") and not l.startswith("| paper")]
    cells = [[c.strip() for c in l.strip("|").split("|")] for l in lines]
    return [dict(zip(["paper", "what", "chapter", "drawn_by", "rebuild"], c)) for c in cells]


def test_the_readme_table_names_functions_that_exist():
    rows = _readme_table()
    assert len(rows) >= 10
    for row in rows:
        names = re.findall(r"`([\w.]+)`", row["drawn_by"])
        assert names, row
        for name in names:
            fn = resolve(f"mclib.chapters.{name}")
            assert inspect.isfunction(fn), name
            assert name.split(".")[0] == f"ch{row['chapter']}", row  # the chapter's own module
        assert (ROOT / "book" / f"{row['chapter']}.ipynb").is_file(), row
        assert row["rebuild"] == f"`python -m mclib book --chapters {row['chapter']}`", row
        from mclib.book.runner import select_chapters

        assert [t.stem for t in select_chapters(row["chapter"])] == [row["chapter"]]  # the command takes it


def test_the_readme_table_lists_every_figure_the_book_cites():
    cited = set()
    for row in _readme_table():
        if row["paper"].startswith("W "):
            continue
        m = re.match(r"Figs?\. (\d+)(?:–(\d+))?|Table (\d+)", row["paper"])
        assert m, row
        if m.group(1):
            cited |= set(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    assert set(FIGURES_NEURIPS) <= cited, set(FIGURES_NEURIPS) - cited
