"""Profiles: one YAML file per setting (params/*.yaml), loaded into typed, validated dataclasses.

A bad value raises `ConfigError` with one line naming the key and the value (the CLI prints
it and exits 2); several bad values give one error listing each on its own line (at most
MAX_PROBLEMS), e.g. "params/x.yaml: 4 bad values:" then "  data.p_mask = 1.5 is outside [0, 1)".
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from .metrics import SLOPE_BLOCKS
from .packaged import profile_file


class ConfigError(ValueError):
    """A bad profile value; the message is one line naming the key and the value. With
    several bad values (`problems`, one line each) the message is a header line and
    then one indented line per value."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems if problems is not None else [message]


MAX_PROBLEMS = 20  # lines one ConfigError lists at most (a screenful); the rest are counted


def _config_error(problems: list[str]) -> ConfigError:
    """One ConfigError for every problem found: the problem itself when there is one."""
    if len(problems) == 1:
        return ConfigError(problems[0])
    shown = problems[:MAX_PROBLEMS]
    more = [f"  ... and {len(problems) - len(shown)} more"] if len(problems) > len(shown) else []
    return ConfigError("\n".join([f"{len(problems)} bad values:", *(f"  {m}" for m in shown), *more]), problems)


@dataclass
class DataConfig:
    n: int = 7              # matrices are n×n
    rank: int = 2
    p_mask: float = 0.3     # probability that an entry is masked
    dist: str = "uniform"   # factor distribution, see mclib.core.data.sample_matrices


@dataclass
class ModelConfig:
    kind: str = "bert"      # "bert" (the paper's encoder) or "gpt" (the decoder of E19, mclib.core.gpt)
    layers: int = 4
    heads: int = 8
    hidden: int = 768
    intermediate: int = 3072
    init_std: float = 0.02                  # BERT's initializer_range
    attention: str = "sdpa"                 # HF attention implementation used in training
    attn_bias: float = 0.0                  # added to every head's attention logits toward attn_bias_target keys
    #   (after Gopalani & Hu 2025; mclib.core.attention): 0 = off, the paper's model
    attn_bias_target: str = "row_col"       # "row_col" (the query's own row and column) or "other" (the control)


@dataclass
class TrainConfig:
    steps: int = 50_000        # the last step; with until: converged, the cap
    until: str = "steps"       # "steps": train `steps` steps; "converged": stop once L_mask stops improving
    #   after the drop (mclib.core.metrics.converged: patience, min_improvement), at the latest at `steps`
    patience: int = 2000       # until: converged; the window (steps, after the drop) whose fitted slope is read
    min_improvement: float = 0.05  # converged when L_mask falls by less than this per 1 000 steps, even at the
    #   fit's pessimistic end (rate - 2 standard errors; mclib.core.metrics.CONVERGED_Z)
    batch: int = 256
    lr: float = 1e-4
    warmup: int = 0            # linear warm-up steps (0 = constant lr, as the paper)
    beta2: float = 0.999       # Adam's second-moment decay (the paper: PyTorch's default)
    grad_clip: float = 0.0     # clip the global gradient norm to this (0 = no clipping, as the paper)
    precision: str = "fp32"    # "fp32" (no TF32 on CUDA; sm80+ attention: 3xTF32), "tf32" (CUDA's TF32 matmuls; emulated off CUDA) or "bf16"
    #   (autocast, fp32 master weights); mclib.core.precision.set_precision
    device: str = "auto"       # "auto" = cuda if available, else cpu; resolved once, when a run starts, and
    #   recorded in its profile.yaml (mclib.core.precision.with_device)
    threads: int = 0           # CPU threads for torch (0 = torch's default)
    eval_every: int = 100      # eval L on fresh matrices every this many steps
    eval_batch: int = 64
    save_every: int = 1000     # a checkpoint every this many steps (and at `checkpoints`)
    state_every: int = 0       # Adam's state and the generators (train_state.pt) with every this many steps'
    #   checkpoint, a multiple of save_every; 0: with every checkpoint. Always at a run's end, at a deadline and on
    #   SIGTERM/SIGINT (mclib.core.train); a hard kill resumes from the newest checkpoint that has it
    log_every: int = 50        # metrics are read from the device every this many steps
    compile: bool = False      # run the model's forward (and so its backward) through torch.compile
    step: str = "auto"         # how the step runs (mclib.core.step.step_variant): eager, compile, reduce-overhead,
    #   cuda-graph, or auto: on the CPU as `compile` says; on CUDA the faster of eager and cuda-graph checked in the process


@dataclass
class Checkpoints:
    """The steps the analyses use. place "fixed": these steps; place "drop": placed after
    training from the run's measured drop (`mclib.core.placement.checkpoint_steps`), these
    steps being the fallback for a run without a drop."""
    place: str = "fixed"
    keep: str = "all"       # which saved checkpoints stay on disk as a run trains (mclib.core.checkpoints.prune_checkpoints)
    pre: int = 4000
    transition: list[int] = field(default_factory=lambda: [10_000, 14_000, 16_000, 20_000])
    post: int = 50_000

    def all_steps(self) -> list[int]:
        return sorted({self.pre, *self.transition, self.post})


@dataclass
class Analysis:
    """Sample sizes and settings of the book's experiments (docs/protocol.md, §2); the
    paper's values are the defaults, small profiles shrink them."""
    seed: int = 0                   # seed of every evaluation batch
    headline_matrices: int = 4096   # the pre- and post-shift losses a chapter leads with (L_mask s.e. ~2-4 %)
    eval_matrices: int = 256        # E3-E10, E18 per line
    copy_matrices: int = 512        # E2
    probe_fit: int = 2048           # E11
    probe_test: int = 256
    freeze_steps: int = 50_000      # E15: training steps per re-initialised component
    nuclear_matrices: int = 512     # E16, per p_mask
    nuclear_p_masks: list[float] = field(default_factory=lambda: [0.1, 0.15, 0.2, 0.25, 0.3, 0.35,
                                                                  0.4, 0.45, 0.5, 0.55, 0.6])
    regularised_matrices: int = 2048  # E17, on the paper's task (L_mask s.e. ~3 % of the value; 256: ~9 %)
    solver_matrices: int = 1024     # E16's solver curve (per p_mask), soft-impute and ALS, on the paper's task:
    #   s.e. < 5 % of L at p_mask >= 0.3 (4.4 % at 0.3), 6-13 % below, where a few matrices make the mean;
    #   ALS's pooled L_mask stays at ~40 % (a few ill-posed matrices), which no affordable size fixes
    ood_matrices: int = 1024        # E18
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])  # training seeds compared in the book
    after_drop: int | None = None   # the other seeds stop this many steps after their drop (None: train them in full)
    gpt_steps: int | None = None    # E19: the GPT runs' steps (None: params/gpt.yaml's; the smoke book shortens them)
    download_checkpoint: bool = False  # offer checkpoints over 50 MB (the final one, the analysis series) as downloads in the site (a GPU run's)
    freeze: bool = True             # E15's re-initialised runs: trained by the book (false: chapter 05 has none to read)
    train_in_book: bool = True      # the training chapter trains, resumes or finds complete the book's runs; false: no
    #   chapter trains, each reads the runs as they are and names a missing one in one line (a GPU lease's slice,
    #   whose training ran before: mclib.lease.slices)


@dataclass
class Profile:
    name: str = "paper"
    seed: int = 1
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    analysis: Analysis = field(default_factory=Analysis)
    notes: str = ""            # free text: how this profile deviates from the paper

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **overrides) -> "Profile":
        """A validated copy with dotted overrides, e.g. replace(**{"train.steps": 10})."""
        d = self.to_dict()
        for key, value in overrides.items():
            *parents, leaf = key.split(".")
            node = d
            for p in parents:
                node = node[p]
            node[leaf] = value
        return profile_from_dict(d)


BERT_ONLY = {"attention": "sdpa", "attn_bias": 0.0, "attn_bias_target": "row_col"}
PRECISIONS = ("fp32", "tf32", "bf16")  # of training (train.precision; mclib.core.precision.set_precision)
STEPS = ("auto", "eager", "compile", "reduce-overhead", "cuda-graph",  # train.step (mclib.core.step.WAYS, step_variant)
         "matmul-attention", "compile-matmul-attention", "ahead", "cuda-graph-ahead", "compile-graph",
         "compile-graph-matmul-attention", "autotune-graph")
KEEP = ("all", "analysis")  # checkpoints.keep (mclib.core.checkpoints.prune_checkpoints)

_CHOICES = {
    ("data", "dist"): ("uniform", "gaussian", "laplace", "random"),
    ("model", "attention"): ("sdpa", "eager"),
    ("model", "kind"): ("bert", "gpt"),
    ("model", "attn_bias_target"): ("row_col", "other"),  # mclib.core.attention.BIAS_TARGETS
    ("train", "precision"): PRECISIONS,
    ("train", "step"): STEPS,
    ("train", "device"): ("auto", "cpu", "cuda"),
    ("train", "until"): ("steps", "converged"),
    ("checkpoints", "place"): ("fixed", "drop"),
    ("checkpoints", "keep"): KEEP,
}
_POSITIVE = {
    "data": ("n", "rank"),
    "model": ("layers", "heads", "hidden", "intermediate", "init_std"),
    "train": ("steps", "batch", "lr", "eval_every", "eval_batch", "save_every", "log_every", "patience"),
    "analysis": ("headline_matrices", "eval_matrices", "copy_matrices", "probe_fit", "probe_test", "freeze_steps",
                 "nuclear_matrices", "regularised_matrices", "solver_matrices", "ood_matrices"),
}


def _coerce(where: str, value: Any, typ: Any) -> Any:
    """Check a YAML value against a dataclass field type (int, float, bool, str, list[int], optional)."""
    typ = str(typ)
    if value is None and "None" in typ:
        return None
    if typ.startswith("int") or typ.startswith("float"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if typ.startswith("int"):
            ok = ok and float(value).is_integer()
        if not ok:
            raise ConfigError(f"{where} = {value!r} is not {'an integer' if typ.startswith('int') else 'a number'}")
        return int(value) if typ.startswith("int") else float(value)
    if typ.startswith("list"):
        if not isinstance(value, list):
            value = [value]
        return [_coerce(where, v, typ[5:-1]) for v in value]  # list[int] / list[float]
    if typ == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} = {value!r} is not true or false")
        return value
    if typ == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where} = {value!r} is not a string")
    return value


def _section(cls, raw: Any, where: str, problems: dict[str, str]):
    """`cls` from the mapping `raw`; each key that is unknown or of the wrong type is added to
    `problems` (key -> message) and keeps its default, so that every key is read."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.setdefault(where, f"{where} = {raw!r} is not a mapping")
        return cls()
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        name = f"{where + '.' if where else ''}{key}"
        if key not in known:
            problems.setdefault(name, f"unknown key {name} (known: {', '.join(known)})")
            continue
        sub = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig,
               "checkpoints": Checkpoints, "analysis": Analysis}.get(key) if cls is Profile else None
        if sub:
            kwargs[key] = _section(sub, value, key, problems)
            continue
        try:
            kwargs[key] = _coerce(name, value, known[key].type)
        except ConfigError as e:
            problems.setdefault(name, str(e))
    return cls(**kwargs)


def _validate(p: Profile, problems: dict[str, str]) -> None:
    """Add every bad value of `p` to `problems` (key -> message). A key already there (a
    wrong type, kept at its default) is not judged again, nor is a check across keys that
    reads one, so each bad value gets one line."""
    def bad(key: str, message: str, *reads: str) -> None:
        if not any(k in problems or k.split(".")[0] in problems for k in (key, *reads)):
            problems[key] = message

    for section, keys in _POSITIVE.items():
        for key in keys:
            value = getattr(getattr(p, section), key)
            if value <= 0:
                bad(f"{section}.{key}", f"{section}.{key} = {value!r} must be positive")
    for (section, key), choices in _CHOICES.items():
        value = getattr(getattr(p, section), key)
        if value not in choices:
            bad(f"{section}.{key}", f"{section}.{key} = {value!r} is not one of {', '.join(choices)}")
    d, m, t = p.data, p.model, p.train
    if not (math.isfinite(m.attn_bias) and m.attn_bias >= 0):
        raise ConfigError(f"model.attn_bias = {m.attn_bias!r} must be a finite number >= 0")
    if d.rank > d.n:
        bad("data.rank", f"data.rank = {d.rank} is larger than data.n = {d.n}", "data.n")
    if not 0 <= d.p_mask < 1:
        bad("data.p_mask", f"data.p_mask = {d.p_mask!r} is outside [0, 1)")
    if m.kind == "gpt":  # BERT's levers have no meaning in the GPT-2 classes
        for key, default in BERT_ONLY.items():
            if getattr(m, key) != default:
                bad(f"model.{key}", f"model.{key} = {getattr(m, key)!r} is a BERT key; model.kind: gpt has no such lever",
                    "model.kind")
    if m.heads > 0 and m.hidden % m.heads:
        bad("model.heads", f"model.heads = {m.heads} does not divide model.hidden = {m.hidden}", "model.hidden")
    if not 0 <= t.beta2 < 1:
        bad("train.beta2", f"train.beta2 = {t.beta2!r} is outside [0, 1)")
    if t.grad_clip < 0:
        bad("train.grad_clip", f"train.grad_clip = {t.grad_clip!r} must not be negative")
    if t.patience < SLOPE_BLOCKS:
        bad("train.patience", f"train.patience = {t.patience!r} is under {SLOPE_BLOCKS}: the convergence rule fits "
                              f"{SLOPE_BLOCKS} block means")
    if not 0 <= t.min_improvement < 1:
        bad("train.min_improvement", f"train.min_improvement = {t.min_improvement!r} is outside [0, 1)")
    if t.state_every < 0 or (t.state_every and t.save_every > 0 and t.state_every % t.save_every):
        bad("train.state_every", f"train.state_every = {t.state_every!r} is not 0 or a positive multiple of "
                                 f"train.save_every = {t.save_every}", "train.save_every")
    for key in ("warmup", "threads"):
        if getattr(t, key) < 0:
            bad(f"train.{key}", f"train.{key} = {getattr(t, key)!r} must not be negative")
    outside = [s for s in p.checkpoints.all_steps() if not 0 < s <= t.steps]
    if outside:
        steps = (f"step {outside[0]} is" if len(outside) == 1
                 else f"steps {', '.join(str(s) for s in outside)} are")
        bad("checkpoints.steps", f"checkpoints {steps} outside 1..train.steps = {t.steps}", "train.steps",
            "checkpoints.pre", "checkpoints.transition", "checkpoints.post")
    for q in p.analysis.nuclear_p_masks:
        if not 0 < q < 1:
            bad("analysis.nuclear_p_masks", f"analysis.nuclear_p_masks has {q!r}, outside (0, 1)")
    if not p.analysis.seeds:
        bad("analysis.seeds", "analysis.seeds = [] must name at least one seed")
    if p.analysis.gpt_steps is not None and p.analysis.gpt_steps <= 0:
        bad("analysis.gpt_steps", f"analysis.gpt_steps = {p.analysis.gpt_steps!r} must be positive")
    if p.analysis.after_drop is not None and p.analysis.after_drop < 0:
        bad("analysis.after_drop", f"analysis.after_drop = {p.analysis.after_drop!r} must not be negative")
    if p.seed < 0:
        bad("seed", f"seed = {p.seed!r} must not be negative")


def profile_from_dict(raw: Any) -> Profile:
    """A validated Profile from a parsed profile; every bad value is named in one ConfigError."""
    problems: dict[str, str] = {}
    profile = _section(Profile, raw, "", problems)
    _validate(profile, problems)
    if problems:
        raise _config_error(list(problems.values()))
    return profile


# Levers an older run folder's profile.yaml may hold (docs/cpu-profile.md), each with the value that
# means "off": `profile_from_saved` reads such a key at that value as absent; any other value is an
# unknown key, in a saved profile as in params/.
REMOVED = {"data.mix_rank": 1, "data.mix_fraction": 0.0, "model.position_init_std": None,
           "model.attn_logit_scale": 1.0, "model.qk_norm": False, "train.optimizer": "adam",
           "train.muon_lr": 0.02, "train.embedding_lr": None}
# Keys of how an older run was executed, read as absent in a saved profile.yaml at any value: they
# never changed what a run computes (train.fast: the stacked copy of the model, docs/performance.md).
REMOVED_RUNNING = ("train.fast",)


def profile_from_saved(raw: Any) -> Profile:
    """`profile_from_dict` for a profile a run folder saved (its profile.yaml), which may
    hold the `REMOVED` levers at their "off" values and the `REMOVED_RUNNING` keys at any
    value (a run from before they left)."""
    def off(key: str, value: Any) -> bool:
        return key in REMOVED_RUNNING or (key in REMOVED and REMOVED[key] == value)

    if isinstance(raw, dict):
        raw = {section: {k: v for k, v in keys.items() if not off(f"{section}.{k}", v)} if isinstance(keys, dict)
               else keys for section, keys in raw.items()}
    return profile_from_dict(raw)


# PyYAML's C parser (libyaml) where the installed wheel has it: the same safe constructor
# builds the same values, about ten times sooner than the pure-Python scanner.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, parsed by libyaml where PyYAML was built with it."""
    return yaml.load(text, Loader=_SAFE_LOADER)


def read_yaml(path: str | Path, what: str, error: type[Exception] = ConfigError) -> Any:
    """The parsed YAML file at `path`; a missing file or bad YAML raises `error` with one
    line naming it ("{what} file 'x.yaml' does not exist")."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} file {str(path)!r} does not exist")
    try:
        return parse_yaml(path.read_text())
    except yaml.YAMLError as e:
        raise error(f"{what} file {str(path)!r} is not valid YAML: {str(e).splitlines()[0]}") from None


def load_profile(path: str | Path, **overrides) -> Profile:
    """Load and validate params/<name>.yaml; `overrides` are dotted keys (see Profile.replace)."""
    path = Path(path)
    raw = read_yaml(path, "profile")
    try:
        profile = profile_from_dict(raw)
        return profile.replace(**overrides) if overrides else profile
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}", e.problems) from None


def profile_path(name_or_path: str) -> Path:
    """`cpu` -> the shipped profile (params/cpu.yaml in a checkout, mclib/profiles/cpu.yaml in a
    wheel: mclib.core.packaged); a path is returned as is."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return profile_file(name_or_path)


# What a deviation from the paper's recipe can be: the task and how the model is built and
# trained. Not bookkeeping (logging, checkpoint steps, threads, device) nor analysis sizes.
RECIPE = ("data", "model", "train")
# Precision is recipe: TF32 and bf16 round the model's products, so they are departures.
# The train keys that say how a run is executed (where, how fast, until when it keeps going, how
# often Adam's state is kept): not recipe, and free to change when a run folder is resumed
# (mclib.core.runs.check_same_profile reads this list; it also lets train.steps grow, which is
# recipe: a run may be resumed to train longer).
RUNNING = ("device", "threads", "compile", "step", "until", "patience", "min_improvement", "state_every")
# Not recipe either, but fixed for a run folder, so not in RUNNING: what the folder records
# (eval_every, eval_batch, log_every: its metric rows; save_every: its checkpoints) and the
# attention implementation (sdpa or eager: the same model, other rounding).
_NOT_RECIPE = {"train": RUNNING + ("eval_every", "eval_batch", "save_every", "log_every"),
               "model": ("attention",)}


def deviations(profile: Profile, reference: Profile) -> list[dict[str, Any]]:
    """Every recipe key (task, model, optimisation) where `profile` differs from `reference`
    (normally the paper's profile): [{"key": "data.n", "profile": 5, "paper": 7}, ...]."""
    out = []
    for section in RECIPE:
        ours, theirs = getattr(profile, section), getattr(reference, section)
        for f in fields(ours):
            if f.name in _NOT_RECIPE.get(section, ()):
                continue
            a, b = getattr(ours, f.name), getattr(theirs, f.name)
            if a != b:
                out.append({"key": f"{section}.{f.name}", "profile": a, "paper": b})
    return out
