"""A checkpoint's model card (README.md beside config.json and model.safetensors), through
huggingface_hub's `ModelCard`: a YAML header a model hub reads, then the text.

The header (`card_data`, a `ModelCardData`): the library (transformers, for a MatrixBert:
`AutoModel` loads it once `mclib.core.model` is imported), tags, and under `mclib:` the run's
profile name, seed and step and the sha256 of every weight file of the folder
(`weight_hashes`); where the caller measured it, L_mask on fresh matrices as the card's
evaluation result (`model-index`). The text is the caller's (`mclib.book.chapter.model_card`
writes the book's).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .config import Profile

WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
)  # HuggingFace's weight files (train_state.pt is Adam's state, not weights)
CLASSES = {"bert": "MatrixBert", "gpt": "MatrixGPT"}  # model.kind -> the class a checkpoint holds


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weight_hashes(folder: str | Path) -> dict[str, str]:
    """{file name: sha256} of every weight file in a checkpoint folder (`WEIGHT_SUFFIXES`), by
    name; a folder without one is a one-line FileNotFoundError."""
    folder = Path(folder)
    files = (
        sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
        if folder.is_dir()
        else []
    )
    if not files:
        raise FileNotFoundError(
            f"{folder}: no weight file ({', '.join(WEIGHT_SUFFIXES)}) to hash for its model card"
        )
    return {p.name: sha256(p) for p in files}


def card_data(
    profile: Profile, step: int, folder: str | Path, l_mask: float | None = None, matrices: int | None = None
) -> ModelCardData:
    """The card's header for the checkpoint of `profile`'s run at `step` saved in `folder`;
    `l_mask`: its L_mask on `matrices` fresh matrices of the profile's task, where measured."""
    d, kind = profile.data, profile.model.kind
    name = f"{CLASSES[kind]} {profile.name} seed {profile.seed} step {step}"
    results = None
    if l_mask is not None:
        on = f"{matrices} fresh" if matrices else "fresh"
        results = [
            EvalResult(
                task_type="matrix-completion",
                task_name="low-rank matrix completion",
                dataset_type="synthetic",
                dataset_split="fresh",
                dataset_name=f"{on} {d.n}x{d.n} rank-{d.rank} matrices ({d.dist} factors, p_mask {d.p_mask})",
                metric_type="mse",
                metric_name="L_mask",
                metric_value=float(l_mask),
            )
        ]
    return ModelCardData(
        library_name="transformers" if kind == "bert" else None,
        tags=["mclib", "matrix-completion", kind],
        model_name=name,
        eval_results=results,
        mclib={
            "profile": profile.name,
            "seed": profile.seed,
            "step": step,
            "weights_sha256": weight_hashes(folder),
        },
    )


def model_card(data: ModelCardData, text: str) -> ModelCard:
    """A `ModelCard`: the header `data` (`card_data`), then `text` (Markdown); `str()` of it is the
    README.md."""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{text.lstrip()}")
