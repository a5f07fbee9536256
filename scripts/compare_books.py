"""Did a change alter what the book says? Compare two built books' numbers.

    python scripts/compare_books.py BEFORE_OUT_DIR AFTER_OUT_DIR

Each argument is a `python -m mclib book --out` folder. Compared: the scorecard
(runs/*/scorecard.json, row by row, each changed field named) and every glued value of every
executed chapter (its text/plain form; a table's HTML, pandas' random ids left out; figures are
compared by name only, since PNG bytes carry matplotlib's metadata). Prints each difference and
exits 1 if there is any, so a refactor that must not change the book can be checked on one
machine in one command.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mclib.core.runs import SCORECARD  # noqa: E402

# pandas names each rendering of a Styler's table and cells with a random id ("T_b68ad")
STYLER_ID = re.compile(r"\bT_[0-9a-f]{5}(?=[_\"\s.#])")


def glued(out_dir: Path) -> dict[str, str]:
    values = {}
    for nb_path in sorted((out_dir / "book" / "_executed").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        for cell in nb["cells"]:
            for out in cell.get("outputs", []):
                record = out.get("metadata", {}).get("scrapbook")
                if not record:
                    continue
                data = out.get("data", {})
                image = any(k.endswith("image/png") for k in data)
                html = "".join(data.get("application/papermill.record/text/html", ""))
                text = "".join(data.get("application/papermill.record/text/plain", ""))
                # a table (a pandas Styler) is compared by its HTML, its text form being only its
                # address, and without the random ids, which say nothing about the book
                value = STYLER_ID.sub("T_", html) if html else text
                values[f"{nb_path.stem}:{record['name']}"] = "<figure>" if image else value
    return values


def scorecards(out_dir: Path) -> dict[str, dict]:
    """Every scorecard row of every run, keyed "RUN ID: QUANTITY" (a second row under the same key
    gets " (2)", in the order recorded)."""
    rows, seen = {}, Counter()
    for path in sorted((out_dir / "runs").glob(f"*/{SCORECARD}")):
        for row in json.loads(path.read_text()):
            key = f"{path.parent.name} {row.get('id')}: {row.get('quantity')}"
            seen[key] += 1
            rows[key if seen[key] == 1 else f"{key} ({seen[key]})"] = row
    return rows


def row_changes(before: dict, after: dict) -> str:
    """The fields of one scorecard row that changed, "verdict 'matches' -> 'differs'; ..."."""
    return "; ".join(
        f"{k} {str(before.get(k))[:120]!r} -> {str(after.get(k))[:120]!r}"
        for k in sorted(before.keys() | after.keys())
        if before.get(k) != after.get(k)
    )


def differences(before: dict, after: dict, what: str) -> list[str]:
    out = []
    for key in sorted(before.keys() | after.keys()):
        if key not in after:
            out.append(f"{what} {key}: only before")
        elif key not in before:
            out.append(f"{what} {key}: only after")
        elif isinstance(before[key], dict) and isinstance(after[key], dict):
            if changes := row_changes(before[key], after[key]):  # a field absent counts as None
                out.append(f"{what} {key}: {changes}")
        elif before[key] != after[key]:
            b, a = str(before[key]), str(after[key])
            start = max(
                0, len(os.path.commonprefix((b, a))) - 60
            )  # where the two first differ, and what leads there
            cut = lambda v: ("…" if start else "") + v[start : start + 200]
            out.append(f"{what} {key}: {cut(b)!r} -> {cut(a)!r}")
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    before, after = (Path(a) for a in sys.argv[1:])
    for d in (before, after):
        if not (d / "book" / "_executed").is_dir():
            print(f"compare_books: {str(d)!r} holds no built book (no book/_executed)", file=sys.stderr)
            return 2
    diffs = differences(scorecards(before), scorecards(after), "scorecard")
    g_before, g_after = glued(before), glued(after)
    diffs += differences(g_before, g_after, "glue")
    for line in diffs:
        print(line)
    print(f"{len(g_before)} glued values and the scorecards compared: {len(diffs)} difference(s)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
