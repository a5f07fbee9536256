"""scripts/compare_books.py on two hand-made books (fast): a glued table (a pandas Styler) is
compared by its HTML, whose random ids pandas draws at every rendering are not a difference,
and a difference is shown where the two values first part. The script on a trained run's
scorecard: tests/test_scripts.py (slow)."""

import json
from pathlib import Path

import pandas as pd
from pandas.io.formats.style import Styler
from sources import load_script

ROOT = Path(__file__).resolve().parents[1]
compare = load_script(ROOT / "scripts" / "compare_books.py")


def _book(out: Path, glued: dict) -> Path:
    """A built book's --out with one executed chapter that glued `glued` (name -> a Styler or a value)."""
    folder = out / "book" / "_executed"
    folder.mkdir(parents=True)
    outputs = []
    for name, value in glued.items():
        data = {"application/papermill.record/text/plain": repr(value)}
        if isinstance(value, Styler):
            data["application/papermill.record/text/html"] = value.to_html()
        outputs.append(
            {
                "output_type": "display_data",
                "data": data,
                "metadata": {"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}},
            }
        )
    cell = {"cell_type": "code", "source": "", "metadata": {}, "execution_count": 1, "outputs": outputs}
    (folder / "99_scorecard.ipynb").write_text(
        json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    return out


def _table(link: str) -> Styler:
    return pd.DataFrame({"experiment": [f'<a href="{link}">E1</a>'], "rows": [7]}).style.hide(axis="index")


def test_a_table_is_compared_by_its_html_without_pandas_random_ids(tmp_path):
    a = compare.glued(_book(tmp_path / "a", {"landing_table": _table("01_train.html"), "n": 3}))
    b = compare.glued(_book(tmp_path / "b", {"landing_table": _table("01_train.html"), "n": 3}))
    c = compare.glued(_book(tmp_path / "c", {"landing_table": _table("07_beyond.html"), "n": 3}))
    assert "01_train.html" in a["99_scorecard:landing_table"]  # the table itself, not the Styler's address
    assert compare.differences(a, b, "glue") == []
    [line] = compare.differences(a, c, "glue")
    assert (
        line.startswith("glue 99_scorecard:landing_table: ")
        and "01_train.html" in line
        and "07_beyond" in line
    )
