"""Profiles: one YAML file per setting (params/*.yaml), loaded into typed, validated dataclasses.

A pydantic schema (`_Profile`: each key's type and range; `_across`: the checks that read two
keys) validates it. A bad value raises `ConfigError` with one line naming the key and the value
(the CLI prints it after the file or "--set" it came from, and exits 2); several bad values give
one error listing each on its own line (at most MAX_PROBLEMS), e.g. "params/x.yaml: 4 bad
values:" then "  data.p_mask = 1.5 is outside [0, 1)".
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import ValidationError

from .metrics import SLOPE_BLOCKS
from .packaged import profile_file
from .schema import (
    FINITE_NOT_NEGATIVE,
    FRACTION,
    NOT_NEGATIVE,
    POSITIVE,
    Bool,
    Float,
    Int,
    Schema,
    Str,
    at_least_one,
    check,
    items,
    one_of,
    problems,
)


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
    return ConfigError(
        "\n".join([f"{len(problems)} bad values:", *(f"  {m}" for m in shown), *more]), problems
    )


@dataclass
class DataConfig:
    n: int = 7  # matrices are n×n
    rank: int = 2
    p_mask: float = 0.3  # probability that an entry is masked
    dist: str = "uniform"  # factor distribution, see mclib.core.data.sample_matrices


@dataclass
class ModelConfig:
    kind: str = "bert"  # "bert" (the paper's encoder) or "gpt" (the decoder of E19, mclib.core.gpt)
    layers: int = 4
    heads: int = 8
    hidden: int = 768
    intermediate: int = 3072
    init_std: float = 0.02  # BERT's initializer_range
    attention: str = "sdpa"  # HF attention implementation used in training
    attn_bias: float = 0.0  # added to every head's attention logits toward attn_bias_target keys
    #   (after Gopalani & Hu 2025; mclib.core.attention): 0 = off, the paper's model
    attn_bias_target: str = "row_col"  # "row_col" (the query's own row and column) or "other" (the control)


@dataclass
class TrainConfig:
    steps: int = 50_000  # the last step; with until: converged, the cap
    until: str = "steps"  # "steps": train `steps` steps; "converged": stop once L_mask stops improving
    #   after the drop (mclib.core.metrics.converged: patience, min_improvement), at the latest at `steps`
    patience: int = 2000  # until: converged; the window (steps, after the drop) whose fitted slope is read
    min_improvement: float = 0.05  # converged when L_mask falls by less than this per 1 000 steps,
    #   even at the fit's pessimistic end (rate - 2 standard errors; mclib.core.metrics.CONVERGED_Z),
    #   and the next `patience` steps confirm it (their mean within the same bar of the window's)
    batch: int = 256
    lr: float = 1e-4
    warmup: int = 0  # linear warm-up steps (0 = constant lr, as the paper)
    beta2: float = 0.999  # Adam's second-moment decay (the paper: PyTorch's default)
    adam: str = "auto"  # "foreach", "fused" or "auto" (step.make_optimizer); fixed for a run folder
    grad_clip: float = 0.0  # clip the global gradient norm to this (0 = no clipping, as the paper)
    precision: str = "fp32"  # "fp32" (no TF32 on CUDA; sm80+ attention: 3xTF32), "tf32" (CUDA's TF32
    #   matmuls; emulated off CUDA) or "bf16" (autocast, fp32 master weights);
    #   mclib.core.precision.set_precision
    device: str = "auto"  # "auto" = cuda if available, else cpu; resolved once, when a run starts, and
    #   recorded in its profile.yaml (mclib.core.precision.with_device)
    threads: int = 0  # CPU threads for torch (0 = torch's default)
    eval_every: int = 100  # eval L on fresh matrices every this many steps
    eval_batch: int = 64
    save_every: int = 1000  # a checkpoint every this many steps (and at `checkpoints`)
    state_every: int = 0  # Adam's state and the generators (train_state.pt) with every this many steps'
    #   checkpoint, a multiple of save_every; 0: with every checkpoint. Always at a run's end, at a deadline
    #   and on SIGTERM/SIGINT (mclib.core.train); a hard kill resumes from the newest checkpoint that has it
    log_every: int = 50  # metrics are read from the device every this many steps
    compile: bool = False  # run the model's forward (and so its backward) through torch.compile
    step: str = "auto"  # how the step runs (mclib.core.step.step_variant): eager, compile, reduce-overhead,
    #   cuda-graph, or auto: on the CPU as `compile` says; on CUDA the faster of eager and cuda-graph
    #   checked in the process


@dataclass
class Checkpoints:
    """The steps the analyses use. place "fixed": these steps; place "drop": placed after
    training from the run's measured drop (`mclib.core.placement.checkpoint_steps`), these
    steps being the fallback for a run without a drop."""

    place: str = "fixed"
    keep: str = "all"  # which saved checkpoints stay on disk as a run trains
    #   (mclib.core.checkpoints.prune_checkpoints)
    pre: int = 4000
    transition: list[int] = field(default_factory=lambda: [10_000, 14_000, 16_000, 20_000])
    post: int = 50_000

    def all_steps(self) -> list[int]:
        return sorted({self.pre, *self.transition, self.post})


@dataclass
class Analysis:
    """Sample sizes and settings of the book's experiments (docs/protocol.md, §2); the
    paper's values are the defaults, small profiles shrink them."""

    seed: int = 0  # seed of every evaluation batch
    headline_matrices: int = 4096  # the pre- and post-shift losses a chapter leads with (L_mask s.e. ~2-4 %)
    eval_matrices: int = 256  # E3-E10, E18 per line
    copy_matrices: int = 512  # E2
    probe_fit: int = 2048  # E11
    probe_test: int = 256
    freeze_steps: int = 50_000  # E15: training steps per re-initialised component
    nuclear_matrices: int = 512  # E16, per p_mask
    nuclear_p_masks: list[float] = field(
        default_factory=lambda: [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6]
    )
    regularised_matrices: int = 2048  # E17, on the paper's task (L_mask s.e. ~3 % of the value; 256: ~9 %)
    solver_matrices: int = 1024  # E16's solver curve (per p_mask), soft-impute and ALS, on the paper's task:
    #   s.e. < 5 % of L at p_mask >= 0.3 (4.4 % at 0.3), 6-13 % below, where a few matrices make the mean;
    #   ALS's pooled L_mask stays at ~40 % (a few ill-posed matrices), which no affordable size fixes
    ood_matrices: int = 1024  # E18
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])  # training seeds compared in the book
    after_drop: int | None = None  # the other seeds stop this many steps after their drop
    #   (None: train them in full)
    gpt_steps: int | None = None  # E19: the GPT runs' steps (None: params/gpt.yaml's; the smoke book
    #   shortens them)
    download_checkpoint: bool = False  # offer checkpoints over 50 MB (the final one, the analysis
    #   series) as downloads in the site (a GPU run's)
    freeze: bool = True  # E15's re-initialised runs: trained by the book (false: chapter 05 has none to read)
    train_in_book: bool = True  # the training chapter trains, resumes or finds complete the book's runs;
    #   false: no chapter trains, each reads the runs as they are and names a missing one in one line
    #   (a GPU lease's slice, whose training ran before: mclib.lease.slices)


@dataclass
class Profile:
    name: str = "paper"
    seed: int = 1
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    analysis: Analysis = field(default_factory=Analysis)
    notes: str = ""  # free text: how this profile deviates from the paper

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **overrides) -> Profile:
        """A validated copy with dotted overrides, e.g. replace(**{"train.steps": 10}); a whole
        section may be given as a mapping ("analysis": {...}). A key that is no profile's is
        a ConfigError naming it and its value."""
        d = self.to_dict()
        for key, value in overrides.items():
            *parents, leaf = key.split(".")
            node = d
            for p in parents:
                if not isinstance(node.get(p), dict):
                    raise ConfigError(f"unknown key {key} = {value!r} (known: {', '.join(node)})")
                node = node[p]
            node[leaf] = value
        return profile_from_dict(d)


BERT_ONLY = {"attention": "sdpa", "attn_bias": 0.0, "attn_bias_target": "row_col"}
ADAMS = ("auto", "foreach", "fused")  # Adam's kernels (train.adam; mclib.core.step.make_optimizer)
PRECISIONS = ("fp32", "tf32", "bf16")  # of training (train.precision; mclib.core.precision.set_precision)
STEPS = (  # train.step (mclib.core.step.WAYS, step_variant)
    "auto",
    "eager",
    "compile",
    "reduce-overhead",
    "cuda-graph",
    "matmul-attention",
    "compile-matmul-attention",
    "ahead",
    "cuda-graph-ahead",
    "compile-graph",
    "compile-graph-matmul-attention",
    "autotune-graph",
)
KEEP = ("all", "analysis")  # checkpoints.keep (mclib.core.checkpoints.prune_checkpoints)


# --- the schema: each key's type and range, one section a model, in the dataclasses' order ------
# (the defaults are the dataclasses'; a key of a dataclass that is not here, or one here that is
# not there, fails every profile)

PosInt, NonNegInt = Annotated[Int, POSITIVE], Annotated[Int, NOT_NEGATIVE]
PosFloat, Fraction = Annotated[Float, POSITIVE], Annotated[Float, FRACTION]


class _Data(Schema):
    n: PosInt
    rank: PosInt
    p_mask: Fraction
    dist: Annotated[Str, one_of(("uniform", "gaussian", "laplace", "random"))]


class _Model(Schema):
    kind: Annotated[Str, one_of(("bert", "gpt"))]
    layers: PosInt
    heads: PosInt
    hidden: PosInt
    intermediate: PosInt
    init_std: PosFloat
    attention: Annotated[Str, one_of(("sdpa", "eager"))]
    attn_bias: Annotated[Float, FINITE_NOT_NEGATIVE]
    attn_bias_target: Annotated[Str, one_of(("row_col", "other"))]  # mclib.core.attention.BIAS_TARGETS


class _Train(Schema):
    steps: PosInt
    until: Annotated[Str, one_of(("steps", "converged"))]
    patience: Annotated[
        Int,
        POSITIVE,
        check(
            lambda v: v >= SLOPE_BLOCKS,
            f"is under {SLOPE_BLOCKS}: the convergence rule fits {SLOPE_BLOCKS} block means",
        ),
    ]
    min_improvement: Fraction
    batch: PosInt
    lr: PosFloat
    warmup: NonNegInt
    beta2: Fraction
    adam: Annotated[Str, one_of(ADAMS)]
    grad_clip: Annotated[Float, NOT_NEGATIVE]
    precision: Annotated[Str, one_of(PRECISIONS)]
    device: Annotated[Str, one_of(("auto", "cpu", "cuda"))]
    threads: NonNegInt
    eval_every: PosInt
    eval_batch: PosInt
    save_every: PosInt
    state_every: Int  # 0 or a multiple of save_every: `_across`
    log_every: PosInt
    compile: Bool
    step: Annotated[Str, one_of(STEPS)]


class _Checkpoints(Schema):
    place: Annotated[Str, one_of(("fixed", "drop"))]
    keep: Annotated[Str, one_of(KEEP)]
    pre: Int  # every step within 1..train.steps: `_across`
    transition: items(Int)
    post: Int


class _Analysis(Schema):
    seed: Int
    headline_matrices: PosInt
    eval_matrices: PosInt
    copy_matrices: PosInt
    probe_fit: PosInt
    probe_test: PosInt
    freeze_steps: PosInt
    nuclear_matrices: PosInt
    nuclear_p_masks: items(Annotated[Float, check(lambda v: 0 < v < 1, "is outside (0, 1)")])
    regularised_matrices: PosInt
    solver_matrices: PosInt
    ood_matrices: PosInt
    seeds: Annotated[items(Int), at_least_one("seed")]
    after_drop: NonNegInt | None
    gpt_steps: PosInt | None
    download_checkpoint: Bool
    freeze: Bool
    train_in_book: Bool


class _Profile(Schema):
    name: Str
    seed: NonNegInt
    data: _Data
    model: _Model
    train: _Train
    checkpoints: _Checkpoints
    analysis: _Analysis
    notes: Str


SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "checkpoints": Checkpoints,
    "analysis": Analysis,
}


def _across(p: Profile) -> list[tuple[str, str, tuple[str, ...]]]:
    """The checks that read more than one key: (the key named, the line, the other keys it reads)."""
    d, m, t = p.data, p.model, p.train
    found = []
    if d.rank > d.n:
        found.append(("data.rank", f"data.rank = {d.rank} is larger than data.n = {d.n}", ("data.n",)))
    if m.kind == "gpt":  # BERT's levers have no meaning in the GPT-2 classes
        found += [
            (
                f"model.{key}",
                f"model.{key} = {getattr(m, key)!r} is a BERT key; model.kind: gpt has no such lever",
                ("model.kind",),
            )
            for key, off in BERT_ONLY.items()
            if getattr(m, key) != off
        ]
    if m.hidden % m.heads:
        found.append(
            (
                "model.heads",
                f"model.heads = {m.heads} does not divide model.hidden = {m.hidden}",
                ("model.hidden",),
            )
        )
    if t.state_every < 0 or t.state_every % t.save_every:
        found.append(
            (
                "train.state_every",
                f"train.state_every = {t.state_every!r} is not 0 or a positive multiple of "
                f"train.save_every = {t.save_every}",
                ("train.save_every",),
            )
        )
    outside = [s for s in p.checkpoints.all_steps() if not 0 < s <= t.steps]
    if outside:
        steps = (
            f"step {outside[0]} is"
            if len(outside) == 1
            else f"steps {', '.join(str(s) for s in outside)} are"
        )
        found.append(
            (
                "checkpoints.steps",
                f"checkpoints {steps} outside 1..train.steps = {t.steps}",
                ("train.steps", "checkpoints.pre", "checkpoints.transition", "checkpoints.post"),
            )
        )
    return found


def _merged(raw: dict, skip: set[str]) -> dict:
    """The default profile with `raw`'s keys on it, less the dotted keys in `skip`."""
    out = Profile().to_dict()
    for key, value in raw.items():
        if key in skip:
            continue
        if value is None and isinstance(out.get(key), dict):
            continue  # a section left empty (`analysis:`): its defaults
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **{k: v for k, v in value.items() if f"{key}.{k}" not in skip}}
        else:
            out[key] = value
    return out


def profile_from_dict(raw: Any) -> Profile:
    """A validated Profile from a parsed profile; every bad value is named in one ConfigError,
    once: a key of the wrong type or out of its range is read at its default by the checks
    across keys, and a check that reads it is not judged."""
    raw = raw if raw is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"profile = {raw!r} is not a mapping")
    found: dict[str, str] = {}
    try:
        checked = _Profile.model_validate(_merged(raw, set()))
    except ValidationError as e:
        for key, line in problems(e, _Profile, "profile"):
            found.setdefault(key.split("[")[0], line)
        checked = _Profile.model_validate(_merged(raw, set(found)))  # every bad key at its default
    profile = Profile(
        **{
            name: SECTIONS[name](**value) if name in SECTIONS else value
            for name, value in checked.model_dump().items()
        }
    )
    for key, line, reads in _across(profile):
        if not any(k in found or k.split(".")[0] in found for k in (key, *reads)):
            found[key] = line
    if found:
        raise _config_error(list(found.values()))
    return profile


# Levers an older run folder's profile.yaml may hold (docs/cpu-profile.md), each with the value that
# means "off": `profile_from_saved` reads such a key at that value as absent; any other value is an
# unknown key, in a saved profile as in params/.
REMOVED = {
    "data.mix_rank": 1,
    "data.mix_fraction": 0.0,
    "model.position_init_std": None,
    "model.attn_logit_scale": 1.0,
    "model.qk_norm": False,
    "train.optimizer": "adam",
    "train.muon_lr": 0.02,
    "train.embedding_lr": None,
}
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
        raw = {
            section: {k: v for k, v in keys.items() if not off(f"{section}.{k}", v)}
            if isinstance(keys, dict)
            else keys
            for section, keys in raw.items()
        }
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


def load_profile(path: str | Path, *, overrides_from: str = "overrides", **overrides) -> Profile:
    """Load and validate params/<name>.yaml; `overrides` are dotted keys (see Profile.replace).
    A bad value of the file is named after the file, one of the overrides after
    `overrides_from` (the command line's "--set")."""
    path = Path(path)
    raw = read_yaml(path, "profile")
    try:
        profile = profile_from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}", e.problems) from None
    try:
        return profile.replace(**overrides) if overrides else profile
    except ConfigError as e:
        raise ConfigError(f"{overrides_from}: {e}", e.problems) from None


def parse_setting(text: str) -> tuple[str, Any]:
    """ "train.lr=1e-3" -> ("train.lr", 0.001): a dotted key and its value read as YAML, where a
    number in exponent form without a dot (1e-3, 2E4) is a number as in YAML 1.2 (PyYAML's
    1.1 reads it as a string). No "=" or no key raises ConfigError naming the text."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"{text!r} is not KEY=VALUE (e.g. train.lr=1e-3)")
    try:
        parsed = parse_yaml(value) if value.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"{text!r}: the value is not valid YAML: {str(e).splitlines()[0]}") from None
    if isinstance(parsed, str) and _EXPONENT.fullmatch(parsed.strip()):
        parsed = float(parsed)
    return key.strip(), parsed


_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def profile_path(name_or_path: str) -> Path:
    """`cpu` -> the shipped profile (params/cpu.yaml in a checkout, mclib/profiles/cpu.yaml in a
    wheel: mclib.core.packaged); a path is returned as is."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return profile_file(name_or_path)
