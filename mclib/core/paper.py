"""The numbers the paper reports (docs/protocol.md, §2), keyed (experiment, quantity); (W) is the
workshop version, (N) the NeurIPS one. Facts to compare against, nothing is tuned toward
them. The paper's task and recipe: `profile()`, `task()` (params/paper.yaml).
"""

from .config import DataConfig, Profile, load_profile, profile_path


def profile() -> Profile:
    """The paper's task and recipe (params/paper.yaml)."""
    return load_profile(profile_path("paper"))


def shapes_profile(steps: int = 6, batch: int = 8) -> Profile:
    """The paper's model and task exactly (params/paper.yaml), trained `steps` steps of `batch`
    matrices and analysed at the smoke profile's sizes: the paper book in minutes on a CPU
    (tests/test_paper_shapes.py, benchmarks/paper_shapes.py)."""
    smoke = load_profile(profile_path("smoke")).analysis
    return profile().replace(
        **{
            "name": "paper-shapes",
            "train.steps": steps,
            "train.batch": batch,
            "train.eval_every": 2,
            "train.eval_batch": batch,
            "train.save_every": 2,
            "train.log_every": 2,
            "train.patience": 10,
            "train.threads": 1,
            "checkpoints.pre": 2,
            "checkpoints.transition": [4],
            "checkpoints.post": steps,
            "analysis": {**smoke.__dict__, "seeds": [1, 2, 3], "after_drop": 2, "freeze_steps": 4},
        }
    )


def task() -> DataConfig:
    """The paper's task: 7×7, rank 2, p_mask 0.3, uniform factors (profile().data)."""
    return profile().data


PAPER = {
    ("E1", "drop step"): 15_000,
    ("E1", "final L (W)"): 4e-3,
    ("E3", "pre L_obs"): 3.4e-4,
    ("E3", "pre L_mask"): 0.2236,
    ("E3", "pre ablated L_obs"): 3.2e-4,
    ("E3", "pre ablated L_mask"): 0.2236,
    ("E3", "post L_obs"): 9.2e-5,
    ("E3", "post L_mask"): 0.0128,
    ("E3", "post ablated L_obs"): 3.7e-3,
    ("E3", "post ablated L_mask"): 0.2183,
    ("E4", "L_obs"): 9.44e-5,
    ("E4", "L_mask"): 0.01428,
    ("E4", "ablated L_obs"): 9.36e-5,
    ("E4", "ablated L_mask"): 0.01575,
    ("E6", "post-QKV into pre L_obs"): 5e-3,
    ("E6", "post-QKV into pre L_mask"): 0.2246,
    ("E6", "pre-QKV into post L_obs"): 9.5e-4,
    ("E7", "L_obs"): 2.4e-4,
    ("E7", "L_mask"): 0.5687,
    ("E8", "masked MSE to X"): 0.014,
    ("E8", "masked MSE to -X"): 0.8066,
}

# E2 (W, pre-shift): L'_mask / L_obs for each replacement value, low-rank (the paper: rank 2) and random
# matrices.
PAPER_E2 = {
    ("low-rank", None): (3e-4, 3.3e-4),
    ("low-rank", 0.44): (4e-4, 2.8e-4),
    ("low-rank", -0.24): (3.7e-4, 2.7e-4),
    ("random", None): (2.8e-4, 3.5e-4),
    ("random", 0.44): (3.7e-4, 3e-4),
    ("random", -0.24): (3.6e-4, 2.8e-4),
}

# E17: lambda -> (L_obs, L_mask, L), on the paper's task (7x7, rank 2, p_mask 0.3), means over
# PAPER_E17_MATRICES matrices; the paper gives no errors.
PAPER_E17_MATRICES = 256
PAPER_E17 = {
    5e-4: (1.015e-5, 0.040728, 0.012173),
    1e-3: (3.686e-5, 0.040456, 0.01211),
    1.5e-3: (7.959e-5, 0.040505, 0.012155),
    2e-3: (1.3769e-4, 0.040734, 0.012264),
    5e-3: (7.8591e-4, 0.043402, 0.013516),
}

# E15 (N §4, Fig. 8) gives curves, no numbers: what each re-initialised group's loss did.
PAPER_E15 = {
    "attention": "a plateau, then a drop",
    "mlp": "no plateau",
    "positional": "the longest plateau, then a drop",
    "token": "no plateau",
}
# The same curves as an order of the drops, earliest first (groups in one list: no order
# between them).
PAPER_E15_ORDER = [["mlp", "token"], ["attention"], ["positional"]]

# The authors' head numbers (1-indexed layer, head) of E4 and E5; a new run's heads differ.
PAPER_HEADS = {
    "uninterpretable": [(3, 3), (4, 2), (4, 5), (4, 6), (4, 7)],
    "masked-row": [(2, 1), (3, 4), (4, 8)],
    "observed-copy": [(4, 3), (4, 4)],
    "mask-ignore": [(2, 2), (2, 3), (2, 4), (2, 6), (3, 1), (3, 2), (3, 3), (3, 5), (3, 6)],
    "longest-contiguous-column": [(2, 5), (2, 7), (2, 8)],
    "input-processing": [(1, 1), (1, 2), (1, 5), (1, 6), (1, 7), (1, 8)],
}

# The NeurIPS version's figures the book cites, by number, read from their captions (Fig. 2 as the
# book cites it); the book's text says "NeurIPS version" after each, "workshop version" after a
# workshop number. tests/test_book.py checks every citation against this.
FIGURES_NEURIPS = {
    2: "the training loss: a plateau, then a sudden drop (E1)",
    3: "BERT against nuclear-norm minimisation (E16)",
    4: "attention heads of the post-shift model: row and column heads (E9)",
    6: "linear probes of the hidden states (E11)",
    7: "embeddings: token norms, PCA of the token embeddings, t-SNE of the position embeddings (E12, E14)",
    8: "training individual components, the rest frozen (E15)",
    11: "the GPT variant (E19)",
    12: "the GPT variant (E19)",
    13: "model width (E20)",
    14: "model depth (E20)",
    22: "attention heads across training steps (E9)",
    23: "attention heads under structured masks (E10)",
}
