"""Print E3, E6, E7 and E8 for a run's pre- and post-shift checkpoints beside the paper's.

    python scripts/quick_check.py runs/cpu-seed1 [--n 256] [--seed 0]

A sanity check that the interventions give numbers that make sense before the book
shows them. All on the same 256 fresh matrices per line.
"""

import argparse
from pathlib import Path

from mclib.analyses.attention import ablation_hooks
from mclib.analyses.evaluate import activation_patching, evaluate
from mclib.analyses.interventions import permute_positions_hooks, switch_qkv_hooks
from mclib.core.checkpoints import load_checkpoint
from mclib.core.paper import PAPER
from mclib.core.placement import checkpoint_steps
from mclib.core.runs import run_profile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    run = Path(args.run_dir)
    profile = run_profile(run)
    # the run's own analysis checkpoints (placed from its drop, post at its end), as the book reads them;
    # the profile's fixed steps are only the fallback for a run without a drop
    cp = checkpoint_steps(run, profile)
    pre, post = load_checkpoint(run, cp.pre), load_checkpoint(run, cp.post)
    layers, heads = profile.model.layers, profile.model.heads
    every_head = {(l, h) for l in range(layers) for h in range(heads)}
    ev = lambda m, **kw: evaluate(m, profile.data, args.n, args.seed, **kw)

    rows = []
    for name, model in [("pre", pre), ("post", post)]:
        base = ev(model)
        rows.append(
            (
                "E3",
                f"{name} L_obs / L_mask",
                base,
                PAPER[("E3", f"{name} L_obs")],
                PAPER[("E3", f"{name} L_mask")],
            )
        )
        for mode in ("uniform", "batch_mean"):
            r = ev(model, hooks=ablation_hooks(model, every_head, mode))
            rows.append(
                (
                    "E3",
                    f"{name} all heads ablated ({mode})",
                    r,
                    PAPER[("E3", f"{name} ablated L_obs")],
                    PAPER[("E3", f"{name} ablated L_mask")],
                )
            )
    rows.append(
        (
            "E6",
            "post-QKV into pre",
            ev(pre, hooks=switch_qkv_hooks(pre, post)),
            PAPER[("E6", "post-QKV into pre L_obs")],
            PAPER[("E6", "post-QKV into pre L_mask")],
        )
    )
    rows.append(
        (
            "E6",
            "pre-QKV into post",
            ev(post, hooks=switch_qkv_hooks(post, pre)),
            PAPER[("E6", "pre-QKV into post L_obs")],
            None,
        )
    )
    rows.append(
        (
            "E7",
            "positions permuted (post)",
            ev(post, hooks=permute_positions_hooks(post, args.seed)),
            PAPER[("E7", "L_obs")],
            PAPER[("E7", "L_mask")],
        )
    )
    print(f"{run}: pre = step {cp.pre}, post = step {cp.post}, {args.n} matrices, seed {args.seed}")
    print(f"{'id':4} {'what':38} {'L_obs':>9} {'paper':>9} {'L_mask':>8} {'paper':>8}")
    fmt = lambda v, w: f"{v:>{w}.3g}" if v is not None else " " * (w - 1) + "-"
    for eid, what, r, p_obs, p_mask in rows:
        print(
            f"{eid:4} {what:38} {fmt(r['L_obs'], 9)} {fmt(p_obs, 9)} {fmt(r['L_mask'], 8)} {fmt(p_mask, 8)}"
        )
    for layers_ in ("all", "last"):
        r = activation_patching(post, profile.data, args.n, args.seed, layers_)
        print(
            f"E8   patch X -> -X ({layers_} layers): masked MSE to X {r['masked_vs_X']:.3g} "
            f"(paper {PAPER[('E8', 'masked MSE to X')]}), to -X {r['masked_vs_negX']:.3g} "
            f"(paper {PAPER[('E8', 'masked MSE to -X')]}); observed to X {r['observed_vs_X']:.3g}, "
            f"to -X {r['observed_vs_negX']:.3g}"
        )


if __name__ == "__main__":
    main()
