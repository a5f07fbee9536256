"""The core: what a run is and how it trains. Nothing here knows about analyses or the book.

config.py       profiles (params/*.yaml) as typed dataclasses, validated; one-line errors
recipe.py       what a deviation from the paper's recipe can be; the keys that say how a run is executed
data.py         low-rank matrices, masks, the tokenizer
model.py        BertModel + linear read-out, model_type matrix-bert (AutoModel loads it); checkpoints are
                HF folders
card.py         a checkpoint's model card: huggingface_hub's ModelCard, the weights' sha256
gpt.py          E19's GPT decoder, trained with teacher forcing
attention.py    mclib's attention function (hook points, attention bias), registered with transformers
hooks.py        every activation by name (TransformerLens' scheme): hooks(), run_with_cache()
metrics.py      L, L_obs, L_mask, mask value; `find_drop`, the one definition of the drop; convergence
precision.py    the device and the precision (fp32, tf32, bf16); tf32.py: TF32 emulated on the CPU
step.py         the optimiser, one training step, and the run it steps
graphstep.py    the step as one CUDA graph; variants.py: step variants checked against eager, timed
train.py        the loop (online data, exact resume), one trainer a folder
runs.py         a run folder: its layout and name, its profile and metrics files, atomic writes
export.py       a run folder's metrics and loss curve as TensorBoard or W&B files (`python -m mclib export`)
checkpoints.py  a run's checkpoints: saved, read, damaged and set aside, resumed from, pruned
ending.py       how a run ends: its stop rules, end.json, whether it is complete
placement.py    the analysis checkpoints of a trained run: pre, transition, post
jobs.py         several runs at once on Dask: local cluster, a scheduler's address, SLURM/PBS
sweep.py        `python -m mclib sweep FILE.yaml`: settings x seeds, resumable (sweep_run.py, sweep_figure.py)
flops.py        FLOPs and memory of a training step
paper.py        what the paper reports, and its profile (params/paper.yaml)
repo.py         the repository this code runs from: its root, git revision, the hash of mclib's sources
packaged.py     the files shipped in the package (importlib.resources): profiles, the tables the library reads
"""
