"""What a chapter declares is its spec (mclib.book.spec.ChapterSpec), collected by
mclib.chapters.registry: every chapter of the toc has one, naming its own notebook; a spec
with a field that does not exist, of the wrong kind, or naming a notebook that does not
exist is refused in one line naming the chapter and the field; and the book's machinery
and the lease look nothing up by a name computed at run time."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

from mclib.book.runner import chapters
from mclib.book.spec import FIELDS, ChapterSpec, ChapterSpecError
from mclib.chapters import registry

MCLIB = Path(__file__).resolve().parents[1] / "mclib"


def test_every_chapter_of_the_toc_declares_a_spec_naming_its_notebook():
    specs = registry.specs()
    assert list(specs) == [t.stem for t in chapters()]
    modules = sorted(p.stem[2:] for p in (MCLIB / "chapters").glob("ch[0-9][0-9]_*.py"))
    assert sorted(specs) == modules  # a chapter module outside the toc declares nothing anyone reads
    for stem, spec in specs.items():
        assert isinstance(spec, ChapterSpec) and spec.notebook == stem


def test_exactly_one_chapter_trains_and_one_adds_a_part_to_the_site():
    specs = registry.specs().values()
    assert [s.notebook for s in specs if s.trains_runs] == ["01_train"]
    assert [s.notebook for s in specs if s.site_part is not None] == ["99_scorecard"]


def _fake_chapter(monkeypatch, stem: str, **attributes) -> None:
    """A module mclib.chapters.chSTEM with these attributes, as if imported."""
    module = types.ModuleType(registry.module_name(stem))
    for name, value in attributes.items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, module.__name__, module)


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def test_a_chapter_module_without_a_spec_is_named(monkeypatch, tmp_path):
    _fake_chapter(monkeypatch, "98_fake", CHAPTER="98_fake")
    (tmp_path / "98_fake.ipynb").write_text("{}")
    with pytest.raises(ChapterSpecError) as e:
        registry.load("98_fake", tmp_path)
    assert _one_line(e).startswith("chapter 98_fake: mclib.chapters.ch98_fake declares no SPEC")


def test_a_spec_naming_a_notebook_that_does_not_exist_is_named(monkeypatch, tmp_path):
    _fake_chapter(monkeypatch, "98_fake", SPEC=ChapterSpec("98_fake"))
    with pytest.raises(ChapterSpecError) as e:
        registry.load("98_fake", tmp_path)
    message = _one_line(e)
    assert message.startswith("chapter 98_fake: field notebook = '98_fake' names no notebook")
    assert "98_fake.ipynb" in message
    (tmp_path / "98_fake.ipynb").write_text("{}")
    assert registry.load("98_fake", tmp_path).notebook == "98_fake"


def test_a_spec_naming_another_chapter_s_notebook_is_named(monkeypatch, tmp_path):
    _fake_chapter(monkeypatch, "98_fake", SPEC=ChapterSpec("01_train"))
    with pytest.raises(ChapterSpecError) as e:
        registry.load("98_fake", tmp_path)
    assert _one_line(e) == "chapter 98_fake: field notebook = '01_train', but its module serves 98_fake"


def test_a_spec_that_is_not_a_chapter_spec_is_named(monkeypatch, tmp_path):
    _fake_chapter(monkeypatch, "98_fake", SPEC={"notebook": "98_fake"})
    with pytest.raises(ChapterSpecError) as e:
        registry.load("98_fake", tmp_path)
    assert _one_line(e) == "chapter 98_fake: SPEC is a dict, not a ChapterSpec"


def test_an_unknown_field_is_refused_naming_the_chapter_and_the_field():
    with pytest.raises(ChapterSpecError) as e:
        ChapterSpec("03_heads", rejudge=lambda row, recorded: (row, []))  # rejudged, misspelt
    message = _one_line(e)
    assert (
        message.startswith("chapter 03_heads: ChapterSpec has no field 'rejudge'") and "rejudged" in message
    )


def test_an_unknown_field_in_a_chapter_module_stops_its_import(tmp_path, monkeypatch):
    """A misspelt declaration fails where the chapter's module is imported, not silently later."""
    (tmp_path / "fake_chapter.py").write_text(
        "from mclib.book.spec import ChapterSpec\nSPEC = ChapterSpec('98_fake', idle_works=None)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ChapterSpecError, match=r"^chapter 98_fake: ChapterSpec has no field 'idle_works'"):
        __import__("fake_chapter")


@pytest.mark.parametrize(
    "field, value",
    [
        ("trains_runs", "yes"),
        ("runs_read", 3),
        ("site_part", "99_scorecard"),
        ("speaks_for", {"e3_match": 3}),
        ("rule_of", {}),
    ],
)
def test_a_field_of_the_wrong_kind_is_named(field, value):
    with pytest.raises(ChapterSpecError) as e:
        ChapterSpec("02_copying", **{field: value})
    assert _one_line(e).startswith(f"chapter 02_copying: field {field} = {value!r} is not what it declares")


def test_a_spec_is_frozen_and_every_field_but_the_notebook_defaults_to_declaring_nothing():
    spec = ChapterSpec("09_appendix")
    with pytest.raises(AttributeError):
        spec.trains_runs = True  # type: ignore[misc]
    assert FIELDS[0] == "notebook"
    assert not any(vars(spec)[f] for f in FIELDS[1:])
    with pytest.raises(TypeError):
        ChapterSpec("09_appendix", None)  # the declarations are named, never positional


def _computed_lookups(root: Path) -> list[str]:
    """'FILE:LINE getattr/hasattr' for every getattr or hasattr by a name that is not a literal, in
    the rooms that handle chapters from below (the book's machinery, the lease): how
    `declared(name)` read a chapter module's attributes. (core and analyses, which know of no
    chapter, read models' and profiles' attributes so.)"""
    bad = []
    for room in ("book", "lease"):
        for path in sorted((root / room).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2
                    and not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))
                ):
                    bad.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.func.id}")
    return bad


def test_the_book_and_the_lease_look_no_attribute_up_by_a_computed_name(tmp_path):
    bad = _computed_lookups(MCLIB)
    assert not bad, (
        "attributes looked up by a computed name (read the chapters' specs instead):\n" + "\n".join(bad)
    )
    (tmp_path / "mclib" / "book").mkdir(parents=True)
    (tmp_path / "mclib" / "book" / "x.py").write_text(
        "def declared(m, name):\n    return getattr(m, name) if hasattr(m, 'site_part') else None\n"
    )
    assert _computed_lookups(tmp_path / "mclib") == ["mclib/book/x.py:2 getattr"]
