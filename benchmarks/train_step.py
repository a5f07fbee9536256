"""Time one training step four ways, for the paper model and the default CPU model.

    python benchmarks/train_step.py [--quick] [--dry-run] [--paths abcd] [--out docs/data/performance.csv]

In one process and one run (docs/performance.md explains every column):

1. the machine's ceilings: fp32 and bf16 matmul GFLOP/s at a size that fills the cores;
2. for each profile (params/paper.yaml, params/cpu.yaml as they are now), at its batch:
   (a) stock   the stock HuggingFace way: BertModel (default attention) + Linear read-out,
               Adam, MSE, loss.item() each step; no mclib trainer;
   (b) authors the authors' protocol: our update, then the model re-run on the training
               batch after the update and on 64 fresh matrices, every metric of those
               two passes read to the host each step;
   (c) ours    mclib.core.step.train_step (the HF model, torch's Adam) in fp32: the step
               the training loop runs;
   (d) ours    the same in bf16 autocast (fp32 master weights);
   (e) ours    (c) through torch.compile (train.compile; --compile);
   (h) ours    (c) with TF32 matmuls (train.precision: tf32; CUDA only);
   Paths (f), (g), (i) and (s) timed the stacked copy of the model (mclib/core/stacked.py),
   removed in 9842a40 (2026-11-26): their rows in docs/data/performance.csv are from revision d54ea56
   or earlier.
   the paths run in alternation (a, b, c, d, then rotated) for several rounds after
   warm-up rounds, so that machine noise hits all of them alike; each ratio is the
   median over rounds of the ratio within a round.
3. FLOPs per step from mclib.core.flops (the one place they are counted), achieved GFLOP/s
   and its fraction of the measured ceiling, and the peak resident memory.

The table is printed; rows are appended to --out with the date and the machine.
--quick: batch ≤ 32, fewer rounds, a smaller matmul (a sanity run, minutes).
--dry-run: one step of every path at batch 4, nothing timed, nothing written.
--paths: the paths to time (default abcd; with --device cuda, acdh; path (a) is every
ratio's reference and always runs). On a GPU: `--device cuda --profiles paper`.
A machine without bf16 hardware can leave out (d): emulated bf16 takes minutes a step on
the paper model, and its ceiling is then not measured either.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout, installed or not

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402
from transformers import BertConfig, BertModel  # noqa: E402

from mclib.core.config import Profile, load_profile, profile_path  # noqa: E402
from mclib.core.data import VOCAB_SIZE, sample_batch  # noqa: E402
from mclib.core.flops import authors_step_flops, train_step_flops  # noqa: E402
from mclib.core.metrics import losses  # noqa: E402
from mclib.core.model import build_model  # noqa: E402
from mclib.core.precision import resolve_device  # noqa: E402
from mclib.core.variants import step_function  # noqa: E402

PATHS = {  # key: (label, precision, counts the authors' extra passes)
    "a": ("stock HF fp32", "fp32", False),
    "b": ("authors' protocol fp32", "fp32", True),
    "c": ("ours fp32", "fp32", False),
    "d": ("ours bf16 autocast", "bf16", False),
    "e": ("ours fp32 + torch.compile", "fp32", False),
    "h": ("ours TF32 (CUDA)", "tf32", False),
}

CSV_COLUMNS = [  # fixed, so that appended runs line up
    "date",
    "profile",
    "model",
    "batch",
    "path",
    "ms_step",
    "ms_min",
    "ms_max",
    "tokens_s",
    "gflop_step",
    "gflops",
    "frac_peak",
    "peak_used",
    "t_over_a",
    "t_over_b",
    "t_over_c",
    "rounds",
    "steps_per_sample",
    "attention_a",
    "peak_fp32_gflops",
    "peak_bf16_gflops",
    "matmul_size",
    "peak_rss_mb",
    "cpu",
    "bf16_flags",
    "cores",
    "threads",
    "device",
    "gpu",
    "torch",
    "transformers",
    "quick",
]


# ---------------------------------------------------------------- machine
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bf16_hardware() -> str:
    """The CPU flags that give bf16 matmuls hardware support (none: bf16 is emulated)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return " ".join(f for f in flags if f in ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_fp16")) or "none"


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
}  # tf32: fp32 storage, TF32 products


def matmul_ceilings(
    size: int, reps: int, device: torch.device, precisions=("fp32", "bf16")
) -> dict[str, float]:
    """Best GFLOP/s of a size³ matmul in each precision of `PATHS`, alternating them;
    "tf32" multiplies fp32 matrices with TF32 products allowed (CUDA only; on the CPU it is
    the fp32 matmul again). Every precision of `PATHS` gets a key (NaN: not measured)."""
    mats = {
        p: [torch.randn(size, size, device=device, dtype=DTYPES[p]) for _ in range(2)] for p in precisions
    }
    best = {p: 0.0 for p in mats}
    tf32_was = torch.backends.cuda.matmul.allow_tf32
    try:
        for rep in range(reps + 1):  # the first repetition is a warm-up
            for p, (x, y) in mats.items():
                torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
                sync(device)
                t0 = time.perf_counter()
                x @ y
                sync(device)
                if rep:
                    best[p] = max(best[p], 2 * size**3 / (time.perf_counter() - t0) / 1e9)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_was
    return {p: best.get(p, math.nan) for p in DTYPES}


# ---------------------------------------------------------------- the paths
def make_paths(profile: Profile, batch: int, device: torch.device, keys: str) -> dict:
    """key -> a function that runs one full step (data sampling included)."""
    d, m, t = profile.data, profile.model, profile.train
    gen = torch.Generator().manual_seed(profile.seed)  # sampled on the host and copied, as in training

    def data(size=batch):
        return sample_batch(size, d.n, d.rank, d.p_mask, gen, dist=d.dist).to(device, non_blocking=True)

    def ours(precision, compile_=False):  # the training loop's step: one HF model, torch's Adam
        return step_function(
            profile.replace(
                **{"train.batch": batch, "train.precision": precision, "train.compile": compile_}
            ),
            device,
        )

    def stock():
        torch.manual_seed(profile.seed)
        cfg = BertConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=m.hidden,
            num_hidden_layers=m.layers,
            num_attention_heads=m.heads,
            intermediate_size=m.intermediate,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            max_position_embeddings=d.n * d.n,
        )
        bert = BertModel(cfg, add_pooling_layer=False).to(device).train()
        readout = nn.Linear(m.hidden, 1).to(device)
        opt = torch.optim.Adam([*bert.parameters(), *readout.parameters()], lr=t.lr)

        def step():
            b = data()
            pred = readout(bert(input_ids=b.tokens).last_hidden_state).squeeze(-1)
            loss = nn.functional.mse_loss(pred, b.x.flatten(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.item()  # a plain loop logs its loss every step

        return step, bert.config._attn_implementation

    def authors():
        model = build_model(m, d.n, profile.seed).to(device)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=t.lr)

        def step():
            b = data()
            model.train()
            loss = losses(model(b.tokens).logits.view_as(b.x), b.x, b.mask)["L"]  # our update, written out
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            model.eval()
            with torch.no_grad():  # metrics from two extra passes, read every step
                after = losses(model(b.tokens).logits.view_as(b.x), b.x, b.mask)
                e = data(t.eval_batch)
                fresh = losses(model(e.tokens).logits.view_as(e.x), e.x, e.mask)
            return {
                **{k: v.item() for k, v in after.items()},
                **{f"eval_{k}": v.item() for k, v in fresh.items()},
            }

        return step

    paths, notes = {}, {}
    for k in keys:
        if k == "a":
            paths[k], notes["attention_a"] = stock()
        elif k == "b":
            paths[k] = authors()
        elif k in "cdh":
            paths[k] = ours(PATHS[k][1])
        elif k == "e":
            paths[k] = ours("fp32", compile_=True)
    return paths, notes


def run_path(key: str, fn, inner: int, device: torch.device) -> float:
    """Seconds per step, averaged over `inner` consecutive steps."""
    if device.type == "cuda":  # what train.precision does (mclib.core.precision.set_precision)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = PATHS[key][1] == "tf32"
    sync(device)
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / inner


def bench_profile(name: str, profile: Profile, batch: int, args, device, peaks) -> list[dict]:
    keys = args.paths
    paths, notes = make_paths(profile, batch, device, keys)
    m, n = profile.model, profile.data.n
    flops = {
        k: (
            authors_step_flops(m, n, batch, profile.train.eval_batch)
            if PATHS[k][2]
            else train_step_flops(m, n, batch)
        )
        for k in keys
    }
    tokens = batch * n * n

    if args.dry_run:
        for k, fn in paths.items():
            out = fn()
            ok = (
                out.isfinite().all().item()
                if torch.is_tensor(out)
                else all(map(math.isfinite, (out.values() if isinstance(out, dict) else [out])))
            )
            print(f"  dry run {name} ({k}) {PATHS[k][0]}: one step at batch {batch}, finite losses: {ok}")
        return []

    # the warm-up rounds also size the run: a sample is `inner` steps lasting ≥ min_sample s,
    # and a model whose step takes over a second (the paper's) gets few rounds
    warm = {k: [] for k in keys}
    for r in range(args.warmup):
        for k in keys:
            warm[k].append(run_path(k, paths[k], 1, device))
    inner = {k: max(1, math.ceil(args.min_sample / min(warm[k]))) for k in keys}
    if args.rounds is None:
        args.rounds = 2 if args.quick else 3 if min(warm["a"]) > 1.0 else 10
    times = {k: [] for k in keys}
    for r in range(args.rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]  # rotate, so no path always runs first
        for k in order:
            times[k].append(run_path(k, paths[k], inner[k], device))
        print(
            f"  {name} round {r + 1}/{args.rounds}: "
            + ", ".join(f"{k} {1000 * times[k][-1]:.1f} ms" for k in keys),
            flush=True,
        )

    def ratio(k, ref):
        if ref not in times:
            return math.nan
        return statistics.median(x / y for x, y in zip(times[k], times[ref]))

    rows = []
    for k in keys:
        label, precision, _ = PATHS[k]
        sec = statistics.median(times[k])
        gflops = flops[k] / sec / 1e9
        rows.append(
            {
                "profile": name,
                "model": f"{m.layers}L {m.heads}H h{m.hidden} i{m.intermediate}",
                "batch": batch,
                "path": f"({k}) {label}",
                "ms_step": 1000 * sec,
                "ms_min": 1000 * min(times[k]),
                "ms_max": 1000 * max(times[k]),
                "tokens_s": tokens / sec,
                "gflop_step": flops[k] / 1e9,
                "gflops": gflops,
                "frac_peak": gflops / peaks[precision],
                "peak_used": precision,
                "t_over_a": ratio(k, "a"),
                "t_over_b": ratio(k, "b"),
                "t_over_c": ratio(k, "c"),
                "rounds": args.rounds,
                "steps_per_sample": inner[k],
                "attention_a": notes.get("attention_a", ""),
            }
        )
    print(f"  {name}: peak RSS so far {peak_rss_mb():.0f} MB", flush=True)
    return rows


# ---------------------------------------------------------------- main
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="batch ≤ 32, fewer rounds: a sanity run")
    ap.add_argument("--dry-run", action="store_true", help="one step of each path at batch 4; no timings")
    ap.add_argument(
        "--out",
        default=str(ROOT / "docs" / "data" / "performance.csv"),
        help="CSV the rows are appended to (not written by --dry-run)",
    )
    ap.add_argument("--profiles", default="paper,cpu", help="comma-separated profile names or YAML paths")
    ap.add_argument(
        "--rounds",
        type=int,
        help="timed alternations (default: 3 if a step takes over 1 s, as the paper's, else 10; quick 2)",
    )
    ap.add_argument("--warmup", type=int, help="warm-up alternations (default 2; quick 1)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    ap.add_argument("--compile", action="store_true", help="also time (e): ours fp32 through torch.compile")
    ap.add_argument(
        "--paths",
        default=None,
        help="which paths to time, e.g. abc to leave out bf16 (default abcd; (a) always runs)",
    )
    args = ap.parse_args(argv)
    if args.paths is None:
        args.paths = "acdh" if resolve_device(args.device).type == "cuda" else "abcd"
    bad = sorted(set(args.paths) - set(PATHS))
    if bad or not args.paths:
        ap.error(f"--paths {args.paths!r}: unknown path {''.join(bad)!r}; choose from {''.join(PATHS)}")
    # (a) is every ratio's reference; the order is fixed so that rounds rotate alike
    args.paths = "".join(
        k for k in PATHS if k in set(args.paths) | {"a"} | ({"e"} if args.compile else set())
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if device.type != "cuda" and "h" in args.paths:
        ap.error(f"--paths {args.paths!r}: (h) is TF32, which only CUDA has; --device is {device.type}")

    machine = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "bf16_flags": bf16_hardware(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "quick": args.quick,
    }
    print("machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()), flush=True)

    size, reps = (128, 1) if args.dry_run else (1024, 3) if args.quick else (2048, 5)
    peaks = matmul_ceilings(size, reps, device, sorted({PATHS[k][1] for k in args.paths}))
    if args.dry_run:
        print(f"ceilings: dry run, one {size}³ matmul in fp32 and in bf16 ran (not a measurement)")
    else:
        print(
            f"ceilings: matmul {size}³, best of {reps}: "
            + ", ".join(f"{p} {g:.0f} GFLOP/s" for p, g in peaks.items() if not math.isnan(g)),
            flush=True,
        )

    rows = []
    for name in args.profiles.split(","):
        profile = load_profile(profile_path(name))
        batch = 4 if args.dry_run else min(profile.train.batch, 32) if args.quick else profile.train.batch
        args_p = argparse.Namespace(**vars(args))
        args_p.warmup = max(1, args.warmup if args.warmup is not None else (1 if args.quick else 2))
        args_p.min_sample = 0.3 if args.quick else 1.0
        authors = authors_step_flops(profile.model, profile.data.n, batch, profile.train.eval_batch)
        print(
            f"{name}: batch {batch}"
            + ("" if args.dry_run else f", {args_p.warmup} warm-up alternations")
            + "; "
            f"FLOPs/step {train_step_flops(profile.model, profile.data.n, batch) / 1e9:.2f} G "
            f"(authors' step {authors / 1e9:.2f} G)",
            flush=True,
        )
        rows += bench_profile(profile.name, profile, batch, args_p, device, peaks)

    rss = peak_rss_mb()
    if args.dry_run:
        print(f"dry run: every path ran; nothing timed, nothing written. peak RSS {rss:.0f} MB")
        return
    df = pd.DataFrame(rows)
    show = df[
        [
            "profile",
            "batch",
            "path",
            "ms_step",
            "tokens_s",
            "gflops",
            "frac_peak",
            "t_over_a",
            "t_over_b",
            "t_over_c",
        ]
    ]
    print()
    print(show.to_markdown(index=False, floatfmt=".3g"))
    print()
    for p in df["profile"].unique():
        r = df[df["profile"] == p]
        r = r.set_index(r["path"].str[1])
        pairs = [
            (k, ref)
            for k, ref in (("c", "a"), ("d", "a"), ("d", "b"), ("e", "a"))
            if k in r.index and ref in r.index
        ]
        pairs += [(k, "c") for k in "eh" if k in r.index and "c" in r.index]
        print(
            f"{p}: "
            + ", ".join(f"t({k})/t({ref}) = {r.at[k, f't_over_{ref}']:.3f}" for k, ref in pairs)
            + "  (medians of per-round ratios; < 1 = faster)"
        )
    print(
        "ceilings: "
        + ", ".join(f"{p} {g:.0f}" for p, g in peaks.items() if not math.isnan(g))
        + f" GFLOP/s; peak RSS {rss:.0f} MB"
    )

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df = df.assign(
        **machine,
        peak_fp32_gflops=peaks["fp32"],
        peak_bf16_gflops=peaks["bf16"],
        matmul_size=size,
        peak_rss_mb=rss,
    ).reindex(columns=CSV_COLUMNS)
    df.to_csv(out, mode="a", header=not out.exists(), index=False)
    print(f"appended {len(df)} rows to {out}")


if __name__ == "__main__":
    main()
