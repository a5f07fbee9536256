"""How the code is laid out, as numbers: the figures to compare before and after a move.

    python benchmarks/layout.py              # import graph, notebook cells, duplicates
    python benchmarks/layout.py --tests      # also time the fast test tier

Prints one table per measure:
- the import graph of mclib: files, arrows (module -> module it imports, lazy imports
  included), the largest file, and the modules most imported (fan-in);
- the rooms (mclib's packages): files and lines each, and the circles among files (a set of
  modules each of which reaches the others through imports; tests/test_layers.py fails on one);
- the longest functions of mclib, in lines;
- lines per notebook code cell (non-blank lines), longest and mean, per notebook and overall;
- the duplicate pairs over mclib, scripts, benchmarks, tests AND the notebooks' code (each
  notebook exported to a .py with nbconvert), through the `duplicates` command when it is on
  PATH;
- with --tests, the wall time of the fast tier, `python -m pytest -m "not slow" -n 2`, and of
  the same tests in one process (`--repeat N` runs each N times, alternating).
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The mclib modules a file imports, anywhere in it (top level or inside functions)."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from . import x` names modules; `from .x import f` names module x
            names = [f"{stem}.{a.name}" for a in node.names] + [stem]
        else:
            continue
        for name in names:
            if name in known and name != me:
                found.add(name)
    return found


def file_arrows(root: Path = ROOT) -> set[tuple[str, str]]:
    """(module, module it imports) for every file of root/mclib, lazy imports included; a
    package's __init__ re-exporting its modules is not a dependency between layers."""
    files = sorted((root / "mclib").rglob("*.py"))
    known = {module_name(f, root) for f in files}
    arrows = {(module_name(f, root), m) for f in files for m in imported_modules(f, known, root)}
    return {(a, b) for a, b in arrows if not b.startswith(a + ".")}


def circles(arrows: set[tuple[str, str]]) -> list[list[str]]:
    """The circles among modules: each set of two or more modules that reach one another
    through `arrows` (a strongly connected component, Tarjan's), sorted, largest first."""
    out, index, low, stack, on_stack = [], {}, {}, [], set()
    succ: dict[str, list[str]] = {}
    for a, b in sorted(arrows):
        succ.setdefault(a, []).append(b)

    def visit(v: str) -> None:  # recursive: mclib's graph is a few dozen modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted({m for arrow in arrows for m in arrow}):
        if v not in index:
            visit(v)
    return sorted(out, key=lambda c: (-len(c), c))


def import_graph() -> None:
    files = sorted((ROOT / "mclib").rglob("*.py"))
    arrows = file_arrows()
    lines = {f: len(f.read_text().splitlines()) for f in files}
    largest = max(lines, key=lines.get)
    fan_in = Counter(b for _, b in arrows)
    print("| import graph of mclib | value |\n|---|---|")
    print(f"| files | {len(files)} |")
    print(f"| arrows (distinct module -> module) | {len(arrows)} |")
    print(f"| lines, all files | {sum(lines.values())} |")
    print(f"| largest file | {largest.relative_to(ROOT)} ({lines[largest]} lines) |")
    top = ", ".join(f"{m} ({k})" for m, k in fan_in.most_common(5))
    print(f"| most imported | {top} |\n")

    rooms: dict[str, list[int]] = {}
    for f in files:
        rooms.setdefault(f.parent.relative_to(ROOT).as_posix(), []).append(lines[f])
    print("| room | files | lines |\n|---|---|---|")
    for room, sizes in sorted(rooms.items()):
        print(f"| {room}/ | {len(sizes)} | {sum(sizes)} |")
    found = circles(arrows)
    print(
        f"\ncircles among files: {len(found)}"
        + "".join(f"\n- {len(c)} files: {', '.join(c)}" for c in found)
        + "\n"
    )


def longest_functions(k: int = 8) -> None:
    """The k longest functions of mclib (methods and nested functions included), in lines."""
    found = []
    for f in sorted((ROOT / "mclib").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(
                    (node.end_lineno - node.lineno + 1, f"{f.relative_to(ROOT)}:{node.lineno} {node.name}")
                )
    print("| longest functions of mclib | lines |\n|---|---|")
    for n, where in sorted(found, key=lambda x: (-x[0], x[1]))[:k]:
        print(f"| {where} | {n} |")
    print()


def notebook_cells() -> None:
    rows, every = [], []
    for nb_path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        sizes = [
            len([l for l in c.source.splitlines() if l.strip()]) for c in nb.cells if c.cell_type == "code"
        ]
        every += sizes
        rows.append(
            (
                nb_path.name,
                len(sizes),
                max(sizes, default=0),
                statistics.mean(sizes) if sizes else 0.0,
                sum(sizes),
            )
        )
    print("| notebook | code cells | longest cell | mean cell | code lines |\n|---|---|---|---|---|")
    for name, k, longest, mean, total in rows:
        print(f"| {name} | {k} | {longest} | {mean:.1f} | {total} |")
    print(
        f"| all | {len(every)} | {max(every, default=0)} | "
        f"{statistics.mean(every) if every else 0:.1f} | {sum(every)} |\n"
    )


def duplicate_pairs() -> None:
    if shutil.which("duplicates") is None:
        print("duplicates: command not on PATH, skipped\n")
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for folder in ("mclib", "scripts", "benchmarks", "tests"):
            shutil.copytree(ROOT / folder, tmp / folder, ignore=shutil.ignore_patterns("__pycache__"))
        (tmp / "notebooks").mkdir()
        for nb_path in sorted((ROOT / "book").glob("*.ipynb")):
            nb = nbformat.read(nb_path, as_version=4)
            code = "\n\n".join(c.source for c in nb.cells if c.cell_type == "code")
            (tmp / "notebooks" / f"nb_{nb_path.stem}.py").write_text(code + "\n")
        out = subprocess.run(
            ["duplicates", "--repo", str(tmp), "--most", "40"], capture_output=True, text=True
        ).stdout
    print("duplicates over mclib, scripts, benchmarks, tests and the notebooks' code:")
    print("```\n" + out.strip() + "\n```\n")


FAST_TIER = [sys.executable, "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider"]


def fast_tier(repeat: int) -> None:
    """The fast tier's wall time as a whole process, `repeat` times each: on two workers
    (`-n 2`, the documented command: pytest-xdist) and in one process, alternating so that
    a slower minute of the machine falls on both. A run that fails is reported, not timed."""
    commands = {"-n 2 (the fast tier)": FAST_TIER + ["-n", "2"], "one process": FAST_TIER}
    times = {name: [] for name in commands}
    codes = {name: set() for name in commands}
    for _ in range(repeat):
        for name, cmd in commands.items():
            start = time.perf_counter()
            codes[name].add(subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode)
            times[name].append(time.perf_counter() - start)
    from train_step import cpu_model  # benchmarks/train_step.py, next to this file

    print(f"fast tier on {cpu_model()}, {len(os.sched_getaffinity(0))} cores:\n")
    print("| command | runs (s) | median (s) | exit codes |\n|---|---|---|---|")
    for name in commands:
        runs = ", ".join(f"{t:.1f}" for t in times[name])
        print(f"| {name} | {runs} | {statistics.median(times[name]):.1f} | {sorted(codes[name])} |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", action="store_true", help="also time the fast test tier")
    ap.add_argument("--repeat", type=int, default=1, help="with --tests: runs of each command (default 1)")
    args = ap.parse_args()
    import_graph()
    longest_functions()
    notebook_cells()
    duplicate_pairs()
    if args.tests:
        fast_tier(args.repeat)


if __name__ == "__main__":
    main()
