"""Diagnostic: does the model learn to complete the matrix when its attention patterns
are given instead of learned?

    python scripts/oracle_attention.py [--profile cpu] [--steps 2000] [--seed 1]

Every layer's heads get fixed patterns, whatever q and k say: heads 0-2 attend uniformly
within the query's row, 3-5 within its column, 6 to itself, 7 (and any further head)
uniformly over all positions. Q and K then receive no gradient; everything else trains
as the profile says (Adam at train.lr with its warm-up, batch train.batch, fp32, one
thread). Prints L_obs and L_mask averaged over every 250 steps. docs/cpu-profile.md
reports its result for the cpu profile (plateau through step 2 000).
"""

import argparse
import time

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from mclib.core.config import load_profile, profile_path
from mclib.core.data import sample_batch
from mclib.core.metrics import losses
from mclib.core.model import build_model
from mclib.core.step import lr_at


def oracle_patterns(n: int, heads: int) -> torch.Tensor:
    """`[head, query, key]` rows summing to 1: 3 row heads, 3 column heads, 1 self, the rest uniform."""
    pos = torch.arange(n * n)
    same_row = (pos[:, None] // n == pos[None] // n).float()
    same_col = (pos[:, None] % n == pos[None] % n).float()
    kinds = [same_row] * 3 + [same_col] * 3 + [torch.eye(n * n)]
    kinds += [torch.ones(n * n, n * n)] * max(0, heads - len(kinds))
    p = torch.stack(kinds[:heads])
    return p / p.sum(-1, keepdim=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_profile(profile_path(args.profile), seed=args.seed)
    d, t = cfg.data, cfg.train
    patterns = oracle_patterns(d.n, cfg.model.heads)

    def oracle(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        probs = patterns.expand(query.size(0), -1, -1, -1)  # [batch, head, query, key]
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs

    AttentionInterface.register("oracle", oracle)
    AttentionMaskInterface.register("oracle", eager_mask)
    model = build_model(cfg.model, d.n, cfg.seed)
    model.set_attn_implementation("oracle")
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], t.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    window, t0 = [], time.time()
    for step in range(1, args.steps + 1):
        opt.param_groups[0]["lr"] = lr_at(step, t.lr, t.warmup)
        b = sample_batch(t.batch, d.n, d.rank, d.p_mask, gen)
        ls = losses(model(b.tokens).logits.view_as(b.x), b.x, b.mask)
        opt.zero_grad()
        ls["L"].backward()
        opt.step()
        window.append([ls["L_obs"].item(), ls["L_mask"].item()])
        if step % 250 == 0:
            obs, mask = torch.tensor(window).mean(0).tolist()
            print(f"step {step}: L_obs {obs:.2e}, L_mask {mask:.4f} ({time.time() - t0:.0f} s)", flush=True)
            window = []


if __name__ == "__main__":
    main()
