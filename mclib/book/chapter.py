"""The opening of every chapter, `open_chapter`, and what more than one chapter shows.

    ch = open_chapter(profile, seed, run_dir, device)                             # chapters 02-99
    ch = open_chapter(profile, seed, run_dir, device, train=True, specs=specs())  # 01: trains first

It returns a `Chapter` on the run's own profile.yaml (the named profile adds only the book's
`analysis` sizes and the device). Every chapter module has CHAPTER, `readings(ch, ...) -> (glue,
rows)` (two tables: SECTION_readings) and `scorecard_table(ch, rows)`, `ch` first in every function
(tests/test_chapter.py). Also here: `departures_table`, `shown_path`, and the downloads
(`download_links`, `checkpoint_zip`, `checkpoint_series_links`).
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

from ..analyses.freezing import GROUPS, LONGEST_FIRST, freeze_run, pending_groups
from ..core import jobs as core_jobs  # read at call time: tests replace its cluster
from ..core import train as core_train  # likewise: tests replace seed_jobs and train_seed
from ..core.checkpoints import load_checkpoint, saved_steps
from ..core.config import Profile, load_profile, profile_path
from ..core.data import copy_level
from ..core.ending import RunEnd, run_end
from ..core.jobs import needs_gpu, resources_for, results, submit_when_free, submit_while, wait_ended
from ..core.metrics import find_drop
from ..core.model import config_text
from ..core.paper import profile as paper_profile
from ..core.placement import CheckpointSteps, checkpoint_steps
from ..core.precision import resolve_device
from ..core.recipe import deviations
from ..core.repo import REPO
from ..core.runs import (
    CHECKPOINTS,
    MODEL_CARD,
    MODEL_FILE,
    PROFILE,
    check_same_profile,
    checkpoint_dir,
    checkpoint_series_path,
    checkpoint_zip_path,
    freeze_dir,
    load_metrics,
    run_profile,
    seed_run_dirs,
    write_atomic,
)
from .chapter_card import checkpoint_roles, model_card
from .runner import runs_read
from .runner_beside import READY
from .runner_plan import asked
from .spec import Specs, among

log = logging.getLogger(__name__)


@dataclass
class Chapter:
    """What a chapter reads: one run, on one device; its checkpoints' models load once (`model`)."""

    cfg: Profile  # the run's profile.yaml + the book's analysis sizes + the device
    run_dir: Path
    device: torch.device
    metrics: pd.DataFrame  # metrics.csv: one row per step
    drop: int | None  # `find_drop` on the training rows (None: no drop)
    steps: CheckpointSteps  # .pre, .transition, .post, .note: where this run's checkpoints sit
    end: RunEnd  # why training ended (.text: one sentence)
    _models: dict = field(default_factory=dict, repr=False)

    def model(self, step: int):
        """The checkpoint at `step`, on the chapter's device, in eval mode; loaded once and shared
        (analyses change a model only through hooks that leave nothing attached, or on a copy)."""
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
        return (
            f"profile {self.cfg.name}, seed {self.cfg.seed}: {m.layers} layers x {m.heads} heads, "
            f"hidden {m.hidden}"
        )

    def relative_to_drop(self, step: int) -> str:
        """'before the drop at step D', 'after ...', or 'this run has no drop'."""
        if self.drop is None:
            return "this run has no drop"
        return f"{'before' if step < self.drop else 'after'} the drop at step {self.drop:,}"


def open_chapter(
    profile: str,
    seed: int,
    run_dir: str | Path,
    device: str = "auto",
    train: bool = False,
    *,
    cluster: str | None = None,
    specs: Specs | None = None,
) -> Chapter:
    """The first call of every chapter. train=True (the training chapter, with the chapters'
    `specs`): first train, resume or find complete every run the build's chapters read
    (`train_runs`). A run folder trained with another recipe than `profile` is a ConfigError."""
    notebook_setup()  # before any progress bar is made

    named = load_profile(profile_path(profile), seed=seed)
    if device != named.train.device:  # a device chosen on the command line
        named = named.replace(**{"train.device": device})
    run_dir = Path(run_dir)
    if train and specs is None:
        raise TypeError(
            "open_chapter(train=True) needs the chapters' specs (specs=mclib.chapters.registry.specs())"
        )
    if train and named.analysis.train_in_book:
        run_dir = train_runs(named, run_dir, cluster, specs=specs)[named.seed]
    elif train:  # nothing trains here: the runs the build's chapters read must be there
        seeds = {named.seed, *(s for r in runs_read(named, asked(), specs=specs).values() for s in r.seeds)}
        require_runs(named.replace(**{"analysis.seeds": sorted(seeds)}), run_dir)
    if not (run_dir / PROFILE).is_file():
        raise FileNotFoundError(
            f"run folder {str(run_dir)!r} holds no run: the training chapter (01_train) trains it first"
        )
    check_same_profile(run_dir, named)
    cfg = run_profile(run_dir).replace(
        **{"train.device": named.train.device, "analysis": named.to_dict()["analysis"], "notes": named.notes}
    )
    metrics = load_metrics(run_dir)
    return Chapter(
        cfg=cfg,
        run_dir=run_dir,
        device=resolve_device(cfg.train.device),
        metrics=metrics,
        drop=find_drop(metrics, rank=cfg.data.rank),
        steps=checkpoint_steps(run_dir, cfg),
        end=run_end(run_dir),
    )


def glue_all(values) -> None:
    """Glue every name -> value of `values` for the prose, displaying none."""
    from myst_nb import glue  # noqa: PLC0415 - Jupyter Book's, only inside a notebook

    for name, value in values.items():
        glue(name, value, display=False)


def notebook_setup() -> None:
    """Make figures gluable as PNG (IPython's inline backend); `open_chapter` calls it first. tqdm's
    "IProgress not found" warning is filtered in the book's kernels (`runner_execute.QUIET_KERNEL`)."""
    from IPython import get_ipython  # noqa: PLC0415 - only inside a notebook's kernel

    if get_ipython() is not None:
        # registers IPython's PNG formatter for figures (mclib.book.plots_base then picks the Agg
        # backend, so nothing is shown twice); without it glue stores only "<Figure ...>"
        get_ipython().run_line_magic("matplotlib", "inline")


def train_runs(cfg: Profile, run_dir: str | Path, cluster: str | None = None, *, specs: Specs) -> dict:
    """Train, resume or find complete every run the build's chapters read (outside a build,
    every chapter's), side by side on a Dask cluster (local, or `cluster` / $MCLIB_CLUSTER): the
    book's run, the other seeds the specs declare and, once the book's run is complete, their E15
    runs, longest plateau first. While the book's run trains, idle workers take `idle_tasks`.
    Complete runs are skipped, cut ones resume. Returns {seed: folder}."""
    reads = runs_read(cfg, asked(), specs=specs).values()
    seeds = {cfg.seed, *(s for r in reads for s in r.seeds)}
    wanted = [g for g in LONGEST_FIRST if any(g in r.e15 for r in reads)]  # none with analysis.freeze: false
    jobs = [job for job in core_train.seed_jobs(cfg, run_dir) if job[0].seed in seeds]
    main_pending = any(job[0].seed == cfg.seed for job in jobs)
    e15 = lambda cfg, run_dir: pending_groups(cfg, run_dir, wanted) if wanted else []
    if not jobs and not e15(cfg, run_dir):
        return seed_run_dirs(cfg, run_dir)
    resources = resources_for(cfg)
    with core_jobs.cluster(cluster, threads_per_run=cfg.train.threads, gpu=needs_gpu(cfg)) as client:
        seeds = submit_when_free(
            client, core_train.train_seed, jobs, resources, [f"train-{job[1].name}" for job in jobs]
        )
        idle = []
        if main_pending:
            idle = submit_while(
                client, idle_tasks(cfg, run_dir, specs=specs), seeds[0], resources, busy=seeds
            )
            seeds[0].result()  # E15 starts from this run's last checkpoint (seed_jobs lists it first)
        groups = e15(cfg, run_dir)
        say_when_ended(seeds + idle, seeds)  # the runner's other chapters may start once only E15 trains
        e15 = submit_when_free(
            client,
            freeze_run,
            [(cfg, run_dir, g) for g in groups],
            resources,
            [f"freeze-{g}" for g in groups],
            busy=seeds + idle,
        )
        results(seeds + e15)  # a run that failed raises here, once the others have ended
        for f in idle:  # what failed here, its chapter does again, and fails there if it must
            error = f.exception()
            if error is not None:
                log.warning(
                    f"{f.key}: failed on an idle worker ({' '.join(str(error).split())}); its chapter does "
                    "it again"
                )
    return seed_run_dirs(cfg, run_dir)


def say_when_ended(futures: list, must_succeed: list) -> None:
    """Once every future has ended (those of `must_succeed` without error), create the file
    $MCLIB_BOOK_READY names (if any), from a daemon thread."""

    path = os.environ.get(READY)
    if not path:
        return

    def wait():
        wait_ended(futures)
        if all(f.status == "finished" for f in must_succeed):
            Path(path).touch()

    threading.Thread(target=wait, daemon=True).start()


def idle_tasks(cfg: Profile, run_dir: str | Path, *, specs: Specs) -> list[tuple]:
    """(fn, args, name) of the `idle_work` that the chapters the build executes declare (outside
    a build, every chapter of `specs`), in toc order; what no worker takes, its chapter does."""

    return [
        task for s in among(specs, asked()) if s.idle_work is not None for task in s.idle_work(cfg, run_dir)
    ]


class MissingRuns(RuntimeError):
    """Runs a chapter reads are missing and the book may not train them; one line naming them."""


def require_runs(cfg: Profile, run_dir: str | Path, freeze: bool = False) -> dict:
    """{seed: folder} of `seed_run_dirs` (freeze=True: {group: folder} of E15's runs), none
    trained here; a run without a checkpoint raises `MissingRuns`."""

    runs = {g: freeze_dir(run_dir, g) for g in GROUPS} if freeze else seed_run_dirs(cfg, run_dir)
    missing = [shown_path(d) for d in runs.values() if not saved_steps(d)]
    if missing:
        raise MissingRuns(
            f"{len(missing)} run(s) this chapter reads are not trained, and this book does not train "
            f"(analysis.train_in_book: false): {', '.join(missing)}"
        )
    return runs


def seed_runs(cfg: Profile, run_dir: str | Path) -> dict:
    """{seed: folder} of `analysis.seeds`: trained or resumed when the book trains, else `require_runs`."""
    if not cfg.analysis.train_in_book:
        return require_runs(cfg, run_dir)
    return core_train.train_seeds(cfg, run_dir)


def departures_table(profile: Profile, caption: str, end: RunEnd | None = None):
    """Where `profile` departs from the paper's task and recipe, as a styled table (key, profile,
    paper); with `end`, also where training ended when that came before the paper's last step."""

    paper = paper_profile()
    rows = deviations(profile, paper)
    if end is not None and end.step < paper.train.steps:
        rows.append(
            {
                "key": "where training ended",
                "profile": f"{end.ended} at step {end.step:,} ({end.text})",
                "paper": f"after its {paper.train.steps:,} steps",
            }
        )
    table = pd.DataFrame(rows, columns=["key", "profile", "paper"])
    return (
        table.style.hide(axis="index")
        .set_caption(caption)
        .format(lambda v: f"{v:g}" if isinstance(v, float) else str(v))
    )


def shown_path(path) -> str:
    """A path as the book prints it: relative to the repository, else its last two parts."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO))
    except ValueError:
        return str(Path(*p.parts[-2:]))


def checkpoint_zip(run_dir: str | Path, step: int | None = None) -> Path:
    """The checkpoint at `step` (default the last) zipped at `runs.checkpoint_zip_path`, written
    atomically once (a checkpoint never changes)."""

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


def checkpoint_links(ch: Chapter, run_dir: str | Path, step: int, label: str) -> list[str]:
    """A download of the zipped checkpoint at `step` where it is at most CHECKPOINT_DOWNLOAD_MB or
    the profile opts in (`analysis.download_checkpoint`); else one sentence saying where it is."""
    folder = checkpoint_dir(Path(run_dir), step)
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    if size <= CHECKPOINT_DOWNLOAD_MB * 1e6 or ch.cfg.analysis.download_checkpoint:
        return download_links(ch.run_dir, [(checkpoint_zip(run_dir, step), label)])
    return [
        f"{label}: {size / 1e6:,.0f} MB, not copied into the site (analysis.download_checkpoint: true "
        "offers it), "
        f"in `{shown_path(folder)}`"
    ]


def checkpoint_series_zip(ch: Chapter) -> Path:
    """The analysis checkpoints in one zip (`runs.checkpoint_series_path`), each a HuggingFace
    folder with config.json (in today's format, `config_text`, so that AutoModel loads it whole),
    model.safetensors and its model card, without train_state.pt; rewritten atomically each call."""

    path = checkpoint_series_path(ch.run_dir)

    def write(tmp: Path):
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for step in checkpoint_roles(ch.steps):
                src = checkpoint_dir(ch.run_dir, step)
                folder = f"{ch.run_dir.name}/{src.name}"
                z.writestr(f"{folder}/{CONFIG_FILE}", config_text(src))
                z.write(src / MODEL_FILE, f"{folder}/{MODEL_FILE}")
                z.writestr(f"{folder}/{MODEL_CARD}", model_card(ch, step))

    write_atomic(path, write)
    return path


def checkpoint_series_links(ch: Chapter) -> list[str]:
    """`checkpoint_links` for the analysis checkpoints together (`checkpoint_series_zip`)."""

    steps = list(checkpoint_roles(ch.steps))
    size = sum(
        (checkpoint_dir(ch.run_dir, s) / name).stat().st_size
        for s in steps
        for name in (CONFIG_FILE, MODEL_FILE)
    )
    listed = ", ".join(f"{s:,}" for s in steps)
    if size <= CHECKPOINT_DOWNLOAD_MB * 1e6 or ch.cfg.analysis.download_checkpoint:
        label = (
            f"the analysis checkpoints (steps {listed}; zip, each a HuggingFace folder with its model card)"
        )
        return download_links(ch.run_dir, [(checkpoint_series_zip(ch), label)])
    return [
        f"the analysis checkpoints (steps {listed}), {size / 1e6:,.0f} MB together, are not copied into the "
        f"site: they are the folders step_NNNNNN of `{shown_path(ch.run_dir / CHECKPOINTS)}`; to offer them, "
        f"set analysis.download_checkpoint: true in the profile (the book then zips them with their model "
        f"cards into `{shown_path(checkpoint_series_path(ch.run_dir))}` and links it here), or upload each "
        f"folder to a model hub"
    ]


def executed_dir(run_dir: str | Path) -> Path | None:
    """OUT/book/_executed when the run sits at OUT/runs/NAME (the runner's layout), else None."""
    folder = Path(run_dir).resolve().parent.parent / "book" / "_executed"
    return folder if folder.is_dir() else None


def download_links(run_dir: str | Path, files: list[tuple[Path, str]]) -> list[str]:
    """A MyST {download} link per (file, label), relative to `executed_dir`; without that
    layout, "label: path" as text."""
    where = executed_dir(run_dir)
    if where is None:
        return [f"{label}: {shown_path(f)}" for f, label in files]
    return [
        f"{{download}}`{label} <{Path(os.path.relpath(Path(f).resolve(), where)).as_posix()}>`"
        for f, label in files
    ]
