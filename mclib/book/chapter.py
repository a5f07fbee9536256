"""The opening of every chapter: one call, `open_chapter`, after the papermill parameters.

    ch = open_chapter(profile, seed, run_dir, device)             # chapters 02-99
    ch = open_chapter(profile, seed, run_dir, device, train=True)  # 01: trains first

It sets the notebook up (PNG figures for glue), reads the run's own
profile.yaml (so a chapter sees the recipe the run was trained with; the named profile
only adds the book's `analysis` sizes and the device), applies the device once, and
returns a `Chapter`: the profile, the device, the run folder, its metrics and drop,
where its checkpoints sit (`mclib.core.placement.checkpoint_steps`: pre on the plateau,
transition around the drop, post at the end), why training ended (`run_end`), and the
models at those steps, each loaded once per chapter (`Chapter.model`).

Every chapter module (`mclib.chapters.chNN_name`, the notebook book/NN_name.ipynb) has the
same entry points, with `ch` (this module's `Chapter`) first (tests/test_chapter.py):

    CHAPTER = "NN_name"                    the notebook it serves, and its scorecard's chapter name
    readings(ch, ...) -> (glue, rows)      the chapter's scorecard rows and the sentences that state
                                           them (a chapter with two scorecard tables: SECTION_readings)
    scorecard_table(ch, rows)              records the rows in the run's scorecard, shows them styled

plus its own computing (`e2_table(ch)`, ...) and showing (`..._shown(ch, ...)`, `..._figure`)
functions; a notebook glues what they return with `glue_all`.

Also here, because more than one chapter shows them: `departures_table` (where a
profile departs from the paper), `shown_path` (a folder as the book prints it) and
`download_links` (a run's metrics.csv and final checkpoint, zipped by `checkpoint_zip`), and the
analysis checkpoints as one download, each with its model card (`checkpoint_series_links`).
"""
from __future__ import annotations

import logging
import os
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from transformers.utils import CONFIG_NAME as CONFIG_FILE  # HuggingFace's config.json

from ..core.checkpoints import load_checkpoint
from ..core.config import Profile, load_profile, profile_path
from ..core.data import copy_level
from ..core.ending import RunEnd, run_end
from ..core.metrics import find_drop
from ..core.paper import profile as paper_profile
from ..core.placement import CheckpointSteps, checkpoint_steps
from ..core.repo import REPO
from ..core.runs import PROFILE, check_same_profile, checkpoint_dir, load_metrics, run_profile

log = logging.getLogger(__name__)



@dataclass
class Chapter:
    """What a chapter reads: one run, on one device."""
    cfg: Profile             # the run's profile.yaml + the book's analysis sizes + the device
    run_dir: Path
    device: torch.device
    metrics: pd.DataFrame    # metrics.csv: one row per step
    drop: int | None         # `find_drop` on the training rows (None: no drop)
    steps: CheckpointSteps   # .pre, .transition, .post, .note: where this run's checkpoints sit
    end: RunEnd              # why training ended (.text: one sentence)
    _models: dict = field(default_factory=dict, repr=False)

    def model(self, step: int):
        """The checkpoint at `step`, on the chapter's device, in eval mode. Loaded once per
        chapter and shared: analyses change a model through hooks that leave nothing
        attached (`mclib.core.hooks`) or copy it first (`reinit_component`), so sharing is safe."""
        if step not in self._models:
            self._models[step] = load_checkpoint(self.run_dir, step, self.cfg.model.attention).to(self.device)
        return self._models[step]

    @property
    def pre(self):
        return self.model(self.steps.pre)

    @property
    def post(self):
        return self.model(self.steps.post)

    @property
    def copy_level(self) -> float:
        """E[X²] of the training matrices: the L_mask of a model that copies (outputs 0 where masked)."""
        return copy_level(self.cfg.data.rank, self.cfg.data.dist)

    @property
    def where(self) -> str:
        """The run in a few words: profile, seed, architecture."""
        m = self.cfg.model
        return f"profile {self.cfg.name}, seed {self.cfg.seed}: {m.layers} layers x {m.heads} heads, hidden {m.hidden}"

    def relative_to_drop(self, step: int) -> str:
        """'before the drop at step D', 'after ...', or 'this run has no drop'."""
        if self.drop is None:
            return "this run has no drop"
        return f"{'before' if step < self.drop else 'after'} the drop at step {self.drop:,}"


def open_chapter(profile: str, seed: int, run_dir: str | Path, device: str = "auto", train: bool = False,
                 *, cluster: str | None = None) -> Chapter:
    """The first call of every chapter (see the module docstring). train=True (the training
    chapter only): first train, resume or find complete every run that the chapters the
    build executes read (`train_runs`). A run folder trained with another recipe than
    `profile` names is refused with a one-line ConfigError."""
    notebook_setup()  # before any progress bar is made
    from ..core.precision import resolve_device

    named = load_profile(profile_path(profile), seed=seed)
    if device != named.train.device:  # a device chosen on the command line
        named = named.replace(**{"train.device": device})
    run_dir = Path(run_dir)
    if train and named.analysis.train_in_book:
        run_dir = train_runs(named, run_dir, cluster)[named.seed]
    elif train:  # nothing trains here: the runs the build's chapters read must be there
        from .runner import runs_read
        from .runner_plan import asked

        seeds = {named.seed, *(s for r in runs_read(named, asked()).values() for s in r.seeds)}
        require_runs(named.replace(**{"analysis.seeds": sorted(seeds)}), run_dir)
    if not (run_dir / PROFILE).is_file():
        raise FileNotFoundError(f"run folder {str(run_dir)!r} holds no run: the training chapter (01_train) "
                                "trains it first")
    check_same_profile(run_dir, named)
    cfg = run_profile(run_dir).replace(**{"train.device": named.train.device, "analysis": named.to_dict()["analysis"],
                                         "notes": named.notes})
    metrics = load_metrics(run_dir)
    return Chapter(cfg=cfg, run_dir=run_dir, device=resolve_device(cfg.train.device), metrics=metrics,
                   drop=find_drop(metrics, rank=cfg.data.rank), steps=checkpoint_steps(run_dir, cfg),
                   end=run_end(run_dir))


def glue_all(values) -> None:
    """Glue every name -> value of `values` (a chapter function's glue) for the prose to show;
    none is displayed where it is glued."""
    from myst_nb import glue

    for name, value in values.items():
        glue(name, value, display=False)


def notebook_setup() -> None:
    """Figures can be glued as PNG. `open_chapter` calls it first. (tqdm's "IProgress not
    found" warning is filtered in the kernels the book starts: `runner_execute.QUIET_KERNEL`.)"""
    from IPython import get_ipython

    if get_ipython() is not None:
        # registers IPython's PNG formatter for figures (mclib.book.plots_base then picks the Agg
        # backend, so nothing is shown twice); without it glue stores only "<Figure ...>"
        get_ipython().run_line_magic("matplotlib", "inline")


def train_runs(cfg: Profile, run_dir: str | Path, cluster: str | None = None) -> dict:
    """Every training run that the chapters the build executes read (`mclib.book.runner_plan.asked`;
    outside a build every chapter of the toc), side by side on a Dask cluster (`mclib.core.jobs`:
    the local one, or `cluster` / $MCLIB_CLUSTER): the book's run and the other seeds they
    declare (`runs_read`; `mclib.core.train.seed_jobs`), and, as soon as the book's run is
    complete, the E15 runs they declare, re-initialised from its last checkpoint
    (`mclib.analyses.freezing.pending_groups`, the paper's longest plateau first). Each run
    starts on the first worker that frees (`mclib.core.jobs.submit_when_free`). While the
    book's run still trains, a worker that the other seeds leave idle takes the later
    chapters' work that does not read it (`idle_tasks`). Complete runs are skipped, cut ones
    resume; when every run is complete no cluster starts. Returns {seed: folder}
    (`mclib.core.runs.seed_run_dirs`)."""
    from ..analyses.freezing import LONGEST_FIRST, freeze_run, pending_groups
    from ..core.jobs import cluster as dask_cluster
    from ..core.jobs import needs_gpu, resources_for, results, submit_when_free, submit_while
    from ..core.runs import seed_run_dirs
    from ..core.train import seed_jobs, train_seed
    from .runner import runs_read
    from .runner_plan import asked

    reads = runs_read(cfg, asked()).values()
    seeds = {cfg.seed, *(s for r in reads for s in r.seeds)}
    wanted = [g for g in LONGEST_FIRST if any(g in r.e15 for r in reads)]  # none with analysis.freeze: false
    jobs = [job for job in seed_jobs(cfg, run_dir) if job[0].seed in seeds]
    main_pending = any(job[0].seed == cfg.seed for job in jobs)
    e15 = lambda cfg, run_dir: pending_groups(cfg, run_dir, wanted) if wanted else []
    if not jobs and not e15(cfg, run_dir):
        return seed_run_dirs(cfg, run_dir)
    resources = resources_for(cfg)
    with dask_cluster(cluster, threads_per_run=cfg.train.threads, gpu=needs_gpu(cfg)) as client:
        seeds = submit_when_free(client, train_seed, jobs, resources, [f"train-{job[1].name}" for job in jobs])
        idle = []
        if main_pending:
            idle = submit_while(client, idle_tasks(cfg, run_dir), seeds[0], resources, busy=seeds)
            seeds[0].result()  # E15 starts from this run's last checkpoint (seed_jobs lists it first)
        groups = e15(cfg, run_dir)
        say_when_ended(seeds + idle, seeds)  # the runner's other chapters may start once only E15 trains
        e15 = submit_when_free(client, freeze_run, [(cfg, run_dir, g) for g in groups], resources,
                               [f"freeze-{g}" for g in groups], busy=seeds + idle)
        results(seeds + e15)  # a run that failed raises here, once the others have ended
        for f in idle:  # what failed here, its chapter does again, and fails there if it must
            error = f.exception()
            if error is not None:
                log.warning(f"{f.key}: failed on an idle worker ({' '.join(str(error).split())}); its chapter does it again")
    return seed_run_dirs(cfg, run_dir)


def say_when_ended(futures: list, must_succeed: list) -> None:
    """Once every future has ended, and those of `must_succeed` without an error, create the
    file $MCLIB_BOOK_READY names (`mclib.book.runner_beside.alongside`: the book's other chapters
    then execute beside E15's runs); nothing where it names none. Waits on a thread of its
    own, so that E15's runs are handed out meanwhile."""
    from ..core.jobs import wait_ended
    from .runner_beside import READY

    path = os.environ.get(READY)
    if not path:
        return

    def wait():
        wait_ended(futures)
        if all(f.status == "finished" for f in must_succeed):
            Path(path).touch()
    threading.Thread(target=wait, daemon=True).start()


def idle_tasks(cfg: Profile, run_dir: str | Path) -> list[tuple]:
    """(fn, args, name) of the later chapters' work that does not read the book's run, for
    the workers that the other seeds leave idle while the book's run trains alone
    (`train_runs`): what each chapter the build executes (`mclib.book.runner_plan.asked`, in toc
    order; outside a build every chapter of the toc) declares in its `idle_work(cfg, run_dir)`,
    the longest first (chapter 06's solvers, then chapter 08's GPT runs). On the cpu profile
    the solvers have nothing left to solve since the committed results/solvers-cpu.csv.gz and
    results/solvers-paper.csv.gz hold every draw (2026-11-27), so the idle work is GPT's runs.
    What no worker took before the book's run ended, its chapter does, as it always did."""
    from .runner import declared_by
    from .runner_plan import asked

    return [task for idle_work in declared_by("idle_work", asked()).values() for task in idle_work(cfg, run_dir)]


class MissingRuns(RuntimeError):
    """A chapter that may not train (`analysis.train_in_book: false`) found runs it reads
    missing; the message is one line naming them."""


def require_runs(cfg: Profile, run_dir: str | Path, freeze: bool = False) -> dict:
    """The book's runs as they are, none trained here (`analysis.train_in_book: false`):
    {seed: folder} of `seed_run_dirs`, or with freeze=True {group: folder} of E15's runs.
    A run without a checkpoint raises `MissingRuns`, one line naming every such folder."""
    from ..analyses.freezing import GROUPS
    from ..core.checkpoints import saved_steps
    from ..core.runs import freeze_dir, seed_run_dirs

    runs = ({g: freeze_dir(run_dir, g) for g in GROUPS} if freeze else seed_run_dirs(cfg, run_dir))
    missing = [shown_path(d) for d in runs.values() if not saved_steps(d)]
    if missing:
        raise MissingRuns(f"{len(missing)} run(s) this chapter reads are not trained, and this book does not train "
                          f"(analysis.train_in_book: false): {', '.join(missing)}")
    return runs


def seed_runs(cfg: Profile, run_dir: str | Path) -> dict:
    """{seed: folder} of `analysis.seeds`, the chapters' one way to them: trained, resumed or
    found complete when the book trains (`mclib.core.train.train_seeds`), else read as they
    are (`require_runs`: a missing one is a one-line error)."""
    if not cfg.analysis.train_in_book:
        return require_runs(cfg, run_dir)
    from ..core.train import train_seeds
    return train_seeds(cfg, run_dir)


def departures_table(profile: Profile, caption: str, end: RunEnd | None = None):
    """The keys where `profile` departs from the paper's task and recipe
    (`mclib.core.config.deviations`), as a styled table: key, this profile's value, the paper's;
    and, with the run's `end`, where training ended when that came before the paper's last step
    (by the profile's rule, a caller's stop, or a deadline's cut), with its step."""
    from ..core.config import deviations

    paper = paper_profile()
    rows = deviations(profile, paper)
    if end is not None and end.step < paper.train.steps:
        rows.append({"key": "where training ended", "profile": f"{end.ended} at step {end.step:,} ({end.text})",
                     "paper": f"after its {paper.train.steps:,} steps"})
    table = pd.DataFrame(rows, columns=["key", "profile", "paper"])
    return (table.style.hide(axis="index").set_caption(caption)
            .format(lambda v: f"{v:g}" if isinstance(v, float) else str(v)))


def shown_path(path) -> str:
    """A folder as the book prints it: relative to the repository when inside it, else
    its last two parts (e.g. runs/cpu-seed1); never an absolute machine path."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO))
    except ValueError:
        return str(Path(*p.parts[-2:]))


def checkpoint_zip(run_dir: str | Path, step: int | None = None) -> Path:
    """`runs.checkpoint_zip_path`: the checkpoint folder at `step` (default the
    last saved: the end of training) with config.json, model.safetensors, train_state.pt;
    zipped once (a checkpoint never changes, so an existing zip is kept) and written
    atomically (`write_atomic`)."""
    from ..core.checkpoints import saved_steps
    from ..core.runs import checkpoint_zip_path, write_atomic

    step = saved_steps(run_dir)[-1] if step is None else step
    src, path = checkpoint_dir(Path(run_dir), step), checkpoint_zip_path(run_dir, step)
    if not path.is_file():
        def write(tmp: Path):
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
                for f in sorted(src.iterdir()):
                    z.write(f, f"{src.name}/{f.name}")
        write_atomic(path, write)
    return path


CHECKPOINT_DOWNLOAD_MB = 50  # a checkpoint up to this size is a download; a larger one only with the opt-in


def checkpoint_links(ch: "Chapter", run_dir: str | Path, step: int, label: str) -> list[str]:
    """The checkpoint at `step` of `run_dir` as a zipped download (`checkpoint_zip`) when it
    is small (<= CHECKPOINT_DOWNLOAD_MB) or the profile opts in (`analysis.download_checkpoint`);
    else one sentence saying where it is, so that a GPU run's 120-360 MB checkpoints are not
    copied into the site."""
    folder = checkpoint_dir(Path(run_dir), step)
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    if size <= CHECKPOINT_DOWNLOAD_MB * 1e6 or ch.cfg.analysis.download_checkpoint:
        return download_links(ch.run_dir, [(checkpoint_zip(run_dir, step), label)])
    return [f"{label}: {size / 1e6:,.0f} MB, not copied into the site (analysis.download_checkpoint: true offers it), "
            f"in `{shown_path(folder)}`"]


CITATION = "CITATION.cff"  # the book's citation, at the root of its repository
PAPER_CITATION = ("Gopalani, Lubana & Hu, Abrupt Learning in Transformers: A Case Study on Matrix Completion "
                  "(NeurIPS 2024), https://arxiv.org/abs/2410.22244")
CARD_MODELS = {  # model.kind -> where its class lives, its name, what its forward takes, what it wraps
    "bert": ("mclib.core.model", "MatrixBert", ".tokens", "HuggingFace's BertModel"),
    "gpt": ("mclib.core.gpt", "MatrixGPT", "", "HuggingFace's GPT2Model, teacher-forced"),
}
ROLES = {"pre": "pre-shift: on the copying plateau", "transition": "transition: around the drop",
         "post": "post-shift: the end of training"}


def checkpoint_roles(steps: CheckpointSteps) -> dict[int, str]:
    """Each analysis checkpoint's step -> its role (`ROLES`), in step order."""
    roles = {s: ROLES["transition"] for s in steps.transition}
    roles[steps.pre], roles[steps.post] = ROLES["pre"], ROLES["post"]
    return dict(sorted(roles.items()))


def model_card(ch: "Chapter", step: int) -> str:
    """The model card (README.md) of the checkpoint at `step` in the checkpoint series: the
    task, the step and its role, its losses at that step (its metrics.csv row), the model,
    how to load it, the run's profile.yaml, and how to cite the book and the paper."""
    from ..core.runs import METRICS

    cfg, d, m = ch.cfg, ch.cfg.data, ch.cfg.model
    row = ch.metrics[ch.metrics["step"] == step]
    cells = {k: v for k, v in row.iloc[0].items() if k not in ("step", "wall") and pd.notna(v)} if len(row) else {}
    losses = ("| " + " | ".join(cells) + " |\n|" + "---|" * len(cells) + "\n| "
              + " | ".join(f"{v:.4g}" for v in cells.values()) + " |") if cells else f"{METRICS} has no row at step {step}."
    drop = f"the run's drop is at step {ch.drop:,}" if ch.drop is not None else "the run did not drop"
    folder = checkpoint_dir(ch.run_dir, step).name
    module, cls, arg, what = CARD_MODELS[m.kind]
    return f"""# {cls}: {cfg.name} profile, seed {cfg.seed}, step {step:,}

A checkpoint of the book that reproduces {PAPER_CITATION}.

## Task

Low-rank matrix completion: {d.n}x{d.n} matrices of rank {d.rank} ({d.dist} factors), each entry masked
with probability {d.p_mask}. The model reads the {d.n * d.n} entries as tokens (a masked entry is token 0)
and outputs one number per entry; L is the squared error over all entries, L_obs over the observed
ones, L_mask over the masked ones.

## This checkpoint

Step {step:,} of the run {ch.run_dir.name} ({checkpoint_roles(ch.steps)[step]}); {drop}. Where
the analysis checkpoints sit: {ch.steps.note}. The run {ch.end.text}.

Its losses at step {step:,} (the run's {METRICS}: the training batch of that step; eval_* on a
held-out batch, where the run evaluated):

{losses}

The model: {m.layers} layers, {m.heads} heads, hidden {m.hidden}, intermediate {m.intermediate}
({what} and a linear read-out, {module}.{cls}).

## Load it

With mclib (the book's repository, `pip install -e .`):

```python
from mclib.core.data import make_batch
from {module} import {cls}

model = {cls}.from_pretrained("{folder}").eval()
pred = model(make_batch(x, mask){arg})   # x [batch, {d.n}, {d.n}] float, mask [batch, {d.n}, {d.n}] bool (True = masked)
```

## The run's profile ({PROFILE})

```yaml
{(ch.run_dir / PROFILE).read_text().strip()}
```

## Cite

The book: {CITATION} at the root of its repository. The paper: {PAPER_CITATION}.
"""


def checkpoint_series_zip(ch: "Chapter") -> Path:
    """`runs.checkpoint_series_path`: the run's analysis checkpoints (`checkpoint_roles`) in
    one zip, each a HuggingFace folder RUN/step_NNNNNN/ with config.json, model.safetensors
    and its model card (`model_card`; train_state.pt, what resuming needs, is left out);
    written atomically (`write_atomic`) at every call, since the series moves while the run
    trains."""
    from ..core.runs import MODEL_CARD, MODEL_FILE, checkpoint_series_path, write_atomic

    path = checkpoint_series_path(ch.run_dir)

    def write(tmp: Path):
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for step in checkpoint_roles(ch.steps):
                src = checkpoint_dir(ch.run_dir, step)
                folder = f"{ch.run_dir.name}/{src.name}"
                for name in (CONFIG_FILE, MODEL_FILE):
                    z.write(src / name, f"{folder}/{name}")
                z.writestr(f"{folder}/{MODEL_CARD}", model_card(ch, step))
    write_atomic(path, write)
    return path


def checkpoint_series_links(ch: "Chapter") -> list[str]:
    """The analysis checkpoints as one download (`checkpoint_series_zip`) when together they
    are small (<= CHECKPOINT_DOWNLOAD_MB, the laptop profiles) or the profile opts in
    (`analysis.download_checkpoint`); else one sentence saying where they are and how to offer them."""
    from ..core.runs import CHECKPOINTS, MODEL_FILE, checkpoint_series_path

    steps = list(checkpoint_roles(ch.steps))
    size = sum((checkpoint_dir(ch.run_dir, s) / name).stat().st_size for s in steps for name in (CONFIG_FILE, MODEL_FILE))
    listed = ", ".join(f"{s:,}" for s in steps)
    if size <= CHECKPOINT_DOWNLOAD_MB * 1e6 or ch.cfg.analysis.download_checkpoint:
        label = f"the analysis checkpoints (steps {listed}; zip, each a HuggingFace folder with its model card)"
        return download_links(ch.run_dir, [(checkpoint_series_zip(ch), label)])
    return [f"the analysis checkpoints (steps {listed}), {size / 1e6:,.0f} MB together, are not copied into the "
            f"site: they are the folders step_NNNNNN of `{shown_path(ch.run_dir / CHECKPOINTS)}`; to offer them, "
            f"set analysis.download_checkpoint: true in the profile (the book then zips them with their model "
            f"cards into `{shown_path(checkpoint_series_path(ch.run_dir))}` and links it here), or upload each "
            f"folder to a model hub"]


def executed_dir(run_dir: str | Path) -> Path | None:
    """Where the executed chapters live when the book's run sits where the runner puts it
    (OUT/runs/NAME-seedS beside OUT/book/_executed; OUT is Jupyter Book's source root, so
    Sphinx can copy files under it into _downloads); None otherwise."""
    folder = Path(run_dir).resolve().parent.parent / "book" / "_executed"
    return folder if folder.is_dir() else None


def download_links(run_dir: str | Path, files: list[tuple[Path, str]]) -> list[str]:
    """One MyST {download} link per (file, label), relative to the executed chapter of the
    book's run `run_dir` (`executed_dir`); without the book's layout, "label: folder/file"
    as text."""
    where = executed_dir(run_dir)
    if where is None:
        return [f"{label}: {shown_path(f)}" for f, label in files]
    return [f"{{download}}`{label} <{Path(os.path.relpath(Path(f).resolve(), where)).as_posix()}>`"
            for f, label in files]
