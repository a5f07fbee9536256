"""The whole book at the paper's shapes, a few steps long: per chapter, wall time, the
largest process's resident memory, and the bytes the build holds on disk after it.

    python benchmarks/paper_shapes.py [--out DIR] [--steps 6] [--batch 8]

The profile is `mclib.core.paper.shapes_profile` (params/paper.yaml's model and task,
`steps` steps of `batch` matrices, the smoke profile's analysis sizes). The book is built
with the README's command in a child process; a sampler reads every 0.5 s the resident
memory of each process under it (/proc, Linux) and the size of the output folder, and the
runner's "[i/N] NAME: running" lines mark where each chapter starts. Prints a Markdown
table (docs/performance.md, "The paper book at full shape") and writes it as CSV beside
the output folder. Time it on idle cores: `lscpu` first.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mclib.core.paper import shapes_profile  # noqa: E402


def _children(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = (task / "children").read_text().split()
                todo += [int(k) for k in kids]
        except OSError:
            pass
    return out


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _size(folder: Path) -> int:
    return (
        sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
        if folder.exists()
        else 0
    )


def measure(out: Path, steps: int, batch: int) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    profile = out / "paper-shapes.yaml"
    profile.write_text(yaml.safe_dump(shapes_profile(steps, batch).to_dict(), sort_keys=False))
    cmd = [sys.executable, "-m", "mclib", "book", "--profile", str(profile), "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    phases: list[dict] = []
    lock = threading.Lock()

    def start(name: str) -> None:
        with lock:
            now = time.time()
            if phases:
                phases[-1]["end"] = now
                phases[-1]["bytes_after"] = _size(out)
            phases.append({"phase": name, "start": now, "peak_rss": 0})

    def sample() -> None:
        while proc.poll() is None:
            peak = max((_rss(p) for p in _children(proc.pid)), default=0)
            with lock:
                if phases:
                    phases[-1]["peak_rss"] = max(phases[-1]["peak_rss"], peak)
            time.sleep(0.5)

    start("start-up")
    threading.Thread(target=sample, daemon=True).start()
    log = []
    for line in proc.stdout:
        log.append(line)
        m = re.match(r"\[\d+/\d+\] (\S+): running", line)
        if m:
            start(m.group(1))
        elif line.startswith("site: jupyter-book build"):
            start("site")
    code = proc.wait()
    start("end")
    phases.pop()
    if code:
        sys.stderr.write("".join(log[-40:]))
        raise SystemExit(f"the book failed (exit {code})")
    return [
        {
            "phase": p["phase"],
            "seconds": round(p["end"] - p["start"], 1),
            "peak_rss_gb": round(p["peak_rss"] / 1e9, 2),
            "disk_after_gb": round(p["bytes_after"] / 1e9, 2),
        }
        for p in phases
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output folder (default: a temporary one, removed afterwards)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "book"
        t0 = time.time()
        rows = measure(out, args.steps, args.batch)
        total = round(time.time() - t0, 1)
        runs = out / "runs"
        sizes = {d.name: _size(d) for d in sorted(runs.iterdir())} if runs.is_dir() else {}
        site = _size(out / "_build" / "html")
    print(
        f"cores {len(os.sched_getaffinity(0))}; {args.steps} steps x {args.batch} matrices; total {total} s\n"
    )
    print("| phase | seconds | largest process (GB) | on disk after it (GB) |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['phase']} | {r['seconds']} | {r['peak_rss_gb']} | {r['disk_after_gb']} |")
    print(
        "\nrun folders: "
        + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in sizes.items())
        + f"; site {site / 1e6:.0f} MB"
    )
    target = REPO / "docs" / "data" / "paper_shapes.csv"
    with open(target, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"table: {target}")


if __name__ == "__main__":
    main()
