"""Slice A's chapters on a GPU lease, estimated from the CPU.

    python benchmarks/slice_chapters.py [--hidden 64] [--out docs/data/slice_chapters.csv]

What it does: the paper's task and sample sizes (params/paper.yaml's `analysis`) with a
narrow model (`--hidden`, intermediate 4x), trained 40 steps at batch 8 (checkpoints at 10,
20, 30, 40: what the chapters compute does not depend on how good the model is), then slice
A's chapters (results/paper-slices.yaml) executed one at a time as `slice finish` executes
them (no site, no training inside a chapter). Every forward pass of the BERT encoder in the
chapters' kernels is timed and counted by a global torch forward hook (a sitecustomize on
the kernels' PYTHONPATH: nothing in mclib changes for it).

How the estimate is made, per chapter:
  rest_s      = CPU seconds spent outside the encoder's passes: the kernel's CPU time (at its
                exit) less its passes' CPU time, plus the runner's own (papermill, the chapter's
                key): the data, the numpy/pandas work, the figures, the kernel's start. CPU time,
                not wall time, so that other work on the machine does not inflate it (wall - the
                passes' wall is printed beside it, rest_wall_s); the same work on the GPU machine,
                taken as no faster there (its 16 cores are not assumed to help)
  model_s     = the same forward passes at the paper's model (hidden 768, 3072), their FLOPs
                (`mclib.core.flops`, per pass: tokens x (2 N_mm + 4 layers s h)) at the rate the
                paper's training step reached on the H100 (the ledger's step_ms: TF32, batch 256)
  loads_s     = each distinct model the chapter ran counted as one checkpoint load of the
                paper's size, at the time measured here for one (an upper bound: copies made in
                memory, E6's switched model and E7's permuted ones, are counted as loads too)
  probes_s    = chapter 03's least-squares probes at the paper's width (3 targets x 5 layers),
                fitted on the device (`mclib.analyses.probes.fit_probe`, "pinv"): their FLOPs
                (an SVD of [N, 768], about 6 N h^2) at 5 % of the H100's fp64 peak (67 TFLOP/s):
                a stated assumption, not a measurement; on the CPU here one fit is timed too
  estimate_s  = rest_s + model_s + loads_s + probes_s
The hidden-width model's own arithmetic is what the GPU replaces; everything else is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # train_step.cpu_model, also when this file is imported (tests)

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from train_step import cpu_model  # noqa: E402  (benchmarks/train_step.py, next to this file)

from mclib.book.runner import build, select_chapters  # noqa: E402
from mclib.core import paper  # noqa: E402
from mclib.core.flops import forward_flops, train_step_flops  # noqa: E402
from mclib.core.model import build_model, load_model  # noqa: E402
from mclib.core.train import train  # noqa: E402
from mclib.lease import slices  # noqa: E402

H100_FP64_TFLOPS = 67.0  # the H100 SXM's dense fp64 (tensor core) peak, NVIDIA's datasheet
PROBE_FP64_EFFICIENCY = 0.05  # the share of that peak an SVD of a tall matrix is assumed to reach

# The kernels' sitecustomize: a global forward hook on every BertModel (the encoder that
# MatrixBert.forward and MatrixBert.hidden_states both call), appending one JSON line per
# pass (the pid, the model's id, tokens, sequence length, seconds) to $MCLIB_FORWARD_LOG.
HOOK = """
import os, time, json
_log = os.environ.get("MCLIB_FORWARD_LOG")
if _log:
    import atexit
    import torch
    _start = {}
    def _write(record):
        with open(_log, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **record}) + "\\n")
    def _pre(module, args):
        if type(module).__name__ == "BertModel":
            _start[id(module)] = (time.perf_counter(), time.process_time())
    def _post(module, args, output):
        t0 = _start.pop(id(module), None)
        if t0 is None:
            return
        batch, seq = output.last_hidden_state.shape[:2]
        _write({"model": id(module), "tokens": batch * seq, "seq": seq, "seconds": time.perf_counter() - t0[0],
                "cpu_s": time.process_time() - t0[1]})
    torch.nn.modules.module.register_module_forward_pre_hook(_pre)
    torch.nn.modules.module.register_module_forward_hook(_post)
    atexit.register(lambda: _write({"process_cpu_s": time.process_time()}))
"""  # noqa: E501 - the file's text, as the kernels have run it


def narrow_profile(hidden: int, ledger: dict, s: slices.Slice):
    """The slice's profile (its seeds, no E15, no training in chapters) with a `hidden`-wide
    model, 40 steps at batch 8, checkpoints fixed at 10, 20, 30, 40."""
    return slices.slice_profile(ledger, s).replace(
        **{
            "name": f"paper-h{hidden}",
            "model.hidden": hidden,
            "model.intermediate": 4 * hidden,
            "train.steps": 40,
            "train.until": "steps",
            "train.batch": 8,
            "train.eval_every": 10,
            "train.eval_batch": 8,
            "train.save_every": 10,
            "train.state_every": 0,
            "train.log_every": 5,
            "train.threads": 1,
            "train.device": "cpu",
            "train.precision": "fp32",
            "train.compile": False,
            "checkpoints.place": "fixed",
            "checkpoints.pre": 10,
            "checkpoints.transition": [20, 30],
            "checkpoints.post": 40,
        }
    )


def seconds_per_load(work: Path) -> float:
    """Median time to load a checkpoint of the paper's model from this disk (3 loads)."""
    folder = work / "paper-sized"
    build_model(paper.profile().model, paper.task().n, seed=0).save_pretrained(folder)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        load_model(folder)
        times.append(time.perf_counter() - t0)
    return sorted(times)[1]


def seconds_per_probe_fit(n_rows: int, hidden: int) -> float:
    """One least-squares probe fit of [n_rows, hidden] on the CPU here (gelsd, one target of 7 columns)."""
    from mclib.analyses.probes import fit_probe

    gen = torch.Generator().manual_seed(0)
    h, y = torch.randn(n_rows, hidden, generator=gen), torch.randn(n_rows, 7, generator=gen)
    t0 = time.perf_counter()
    fit_probe(h, y)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=64, help="the narrow model's width (default 64)")
    ap.add_argument("--slice", default="A", help="the ledger's slice whose chapters are timed (default A)")
    ap.add_argument("--ledger", default=str(slices.LEDGER))
    ap.add_argument(
        "--chapters", help="these chapters instead of the slice's (comma-separated, e.g. 07_beyond)"
    )
    ap.add_argument(
        "--work", help="a folder for the run and the executed chapters (default: a temporary one)"
    )
    ap.add_argument("--out", help="CSV to write the table to")
    args = ap.parse_args(argv)
    ledger = slices.read_ledger(Path(args.ledger))
    s = next((x for x in ledger["slices"] if x.name == args.slice), None)
    if s is None or not s.chapters:
        sys.exit(f"slice {args.slice!r}: not in {args.ledger}, or it has no chapters")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        profile = narrow_profile(args.hidden, ledger, s)
        ppath = work / "profile.yaml"
        ppath.write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False))
        from mclib.core.runs import default_run_dir

        train(profile, default_run_dir(profile, work / "runs"), progress=False)
        site = work / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(HOOK)
        log = work / "forwards.jsonl"
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(site), str(ROOT), os.environ.get("PYTHONPATH")])
        )
        rows = []
        for name in args.chapters.split(",") if args.chapters else s.chapters:
            log.unlink(missing_ok=True)
            os.environ["MCLIB_FORWARD_LOG"] = str(log)
            t0, cpu0 = time.perf_counter(), _own_cpu()
            build(str(ppath), out_dir=work, templates=select_chapters(name), site=False, progress=False)
            wall, runner_cpu = time.perf_counter() - t0, _own_cpu() - cpu0
            records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            passes = [r for r in records if "tokens" in r]
            kernel_cpu = sum(r["process_cpu_s"] for r in records if "process_cpu_s" in r)
            forward_cpu = sum(p["cpu_s"] for p in passes)
            rows.append(
                {
                    "chapter": name,
                    "wall_s": wall,
                    "forward_s": sum(p["seconds"] for p in passes),
                    "rest_wall_s": wall - sum(p["seconds"] for p in passes),
                    "kernel_cpu_s": kernel_cpu,
                    "forward_cpu_s": forward_cpu,
                    "runner_cpu_s": runner_cpu,
                    "rest_s": kernel_cpu - forward_cpu + runner_cpu,
                    "passes": len(passes),
                    "models": len({(p["pid"], p["model"]) for p in passes}),
                    "tokens": sum(p["tokens"] for p in passes),
                    "paper_tflop": sum(
                        forward_flops(paper.profile().model, paper.task().n, 1) * p["tokens"] / p["seq"]
                        for p in passes
                    )
                    / 1e12,
                }
            )
            if not any("process_cpu_s" in r for r in records):
                sys.exit(f"{name}: its kernel wrote no CPU time at exit (killed?): no estimate")
            print(
                f"{name}: {wall:.1f} s, {len(passes)} encoder passes ({rows[-1]['forward_s']:.1f} s); "
                "CPU time outside "
                f"them {rows[-1]['rest_s']:.1f} s",
                flush=True,
            )
        load_s = seconds_per_load(work)
        probe_rows = profile.analysis.probe_fit * paper.task().n ** 2
        probe_cpu_s = seconds_per_probe_fit(probe_rows, paper.profile().model.hidden)
    step_flops = train_step_flops(paper.profile().model, paper.task().n, 256)
    rate = step_flops / (ledger["step_ms"] / 1000)  # FLOP/s of the paper's training step on the H100
    table = pd.DataFrame(rows)
    table["model_s"] = table.paper_tflop * 1e12 / rate
    table["loads_s"] = table.models * load_s
    fits = paper.profile().model.layers + 1  # the embedding output and every layer
    probe_flops = 3 * fits * 6 * probe_rows * paper.profile().model.hidden ** 2
    table["probes_s"] = [
        probe_flops / (H100_FP64_TFLOPS * 1e12 * PROBE_FP64_EFFICIENCY) if c == "03_heads" else 0.0
        for c in table.chapter
    ]
    table["estimate_s"] = table.rest_s + table.model_s + table.loads_s + table.probes_s
    total = table[
        [
            "wall_s",
            "forward_s",
            "rest_wall_s",
            "kernel_cpu_s",
            "forward_cpu_s",
            "runner_cpu_s",
            "rest_s",
            "model_s",
            "loads_s",
            "probes_s",
            "estimate_s",
        ]
    ].sum()
    table = pd.concat(
        [
            table,
            pd.DataFrame(
                [
                    {
                        "chapter": "all" if args.chapters else "slice " + s.name,
                        **total,
                        "passes": table.passes.sum(),
                        "models": table.models.sum(),
                        "tokens": table.tokens.sum(),
                        "paper_tflop": table.paper_tflop.sum(),
                    }
                ]
            ),
        ]
    )
    table["hidden_here"] = args.hidden
    table["cpu"] = cpu_model()
    table["date"] = time.strftime("%Y-%m-%d")
    print(table.round(2).to_string(index=False))
    print(
        f"rate: {rate / 1e12:.0f} TFLOP/s (the ledger's {ledger['step_ms']} ms a training step "
        "at the paper's shapes); "
        f"one paper-size checkpoint load here {load_s:.2f} s; one probe fit of [{probe_rows}, "
        f"{paper.profile().model.hidden}] on this CPU {probe_cpu_s:.1f} s ({3 * fits} fits: "
        f"{3 * fits * probe_cpu_s:.0f} s if they ran on one core)"
    )
    which = f"chapters {args.chapters}" if args.chapters else f"slice {s.name}'s chapters"
    print(
        f"{which}: estimated {table.estimate_s.iloc[-1]:.0f} s on an H100 machine "
        f"(the ledger sizes slice {s.name}'s {s.chapters_s:.0f} s)"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False)
    return 0


def _own_cpu() -> float:
    """CPU seconds of this process (all its threads: papermill's, the runner's) so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


if __name__ == "__main__":
    sys.exit(main())
