"""The book: a profile in, a browsable HTML report out (`python -m mclib book --profile cpu`).

    _toc.yml               the chapters in order; the one list (`chapters()` reads it)
    _config.yml            Jupyter Book 1 settings (offline: no launch buttons, no math)
    book/NAME.ipynb        chapter templates, stored without outputs
    OUT/runs/P-seedS/      the run every chapter reads; the first chapter trains it
    OUT/book/_executed/    executed chapters + manifest.json   (OUT = --out-dir, default
    OUT/_build/html/       the site                             the repository itself)

Papermill runs every template with the same parameters (profile, seed, run_dir,
device); the training chapter calls `mclib.core.train.train`, which resumes or returns at
once if the run is complete, and every later chapter reads that run_dir.

Incremental: a chapter's key hashes its template, its parameters, the profile's
content, the mclib sources and the run's state (checkpoint list + metrics.csv), and the
run-folder files the notebook declares it reads in its own metadata, e.g. the scorecard
page's `"mclib": {"reads": ["scorecard.json"]}` (`declared_reads`). The key is taken
right after the chapter ran and stored in the manifest; the next build reuses the
executed copy if the key taken now is the same and the copy is untouched. Measuring after (not before) the run
is what lets the training chapter, which creates the run, be reused.

Paths: papermill gets absolute paths, and writes them into the executed notebook (its
parameters cell and metadata). The site offers each executed notebook for download, so
the runner writes them relative right after the run (`machine_paths`): the run folder
relative to --out-dir, the repository and --out-dir as ".". The manifest keeps them
absolute; it is not part of the site.

Runs: before any chapter runs, `plan` says in one line which runs the chapters asked read
(the book's run, and what each chapter declares in `runs_read`), which of them train, where
and why, which are complete, and which are left out because only chapters not asked read
them; a run they read that nothing asked trains stops the build there, in one line naming
it. The training chapter trains what the chapters asked read ($MCLIB_BOOK_CHAPTERS tells
its kernel which they are: `asked`), and runs again while one of those runs is not complete.

Failure: papermill saves the notebook and may mark it complete after a timeout or a
dead kernel, so its exception is what counts (and any error output, to be sure): the
manifest marks the chapter failed, nothing after it runs, no site is built, and
`BookError` names the chapter.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import scorecard
from ..core.config import ConfigError, load_profile, parse_yaml, profile_path
from ..core.paper import profile as paper_profile
from ..core.repo import REPO, git_revision, mclib_sha, short_sha
from ..core.runs import default_run_dir

# mclib.core.train (torch, tqdm) is imported inside the functions: the CLI imports this
# module for BookError, and should stay light.

EXECUTED = Path("book") / "_executed"
SITE_TOC = Path("_build") / "_toc.yml"
SECONDS_PER_PAPER_STEP_CPU = 12.4  # measured on 2 cores (docs/protocol.md, §4)


# papermill's bar over a chapter's cells, without tqdm's rate and remaining time: a cell that
# trains for half an hour made them read "3/12 [08:59<00:06]" (the training's own line:
# `_report_training`)
CELL_BAR = {"bar_format": "{desc}: {n_fmt}/{total_fmt} cells [{elapsed}]"}


class BookError(RuntimeError):
    """A chapter or the site build failed; the message is one line."""


def select_chapters(names: str, toc: Path = REPO / "_toc.yml") -> list[Path]:
    """The templates named in `names` ("01_train,03_heads"), in toc order; an unknown name
    is a one-line BookError naming it and the chapters there are."""
    known = {t.stem: t for t in chapters(toc)}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    bad = [n for n in wanted if n not in known]
    if bad or not wanted:
        raise BookError(f"--chapters {names!r}: unknown chapter {', '.join(bad) or '(none named)'}; "
                        f"chapters: {', '.join(known)}")
    return [t for name, t in known.items() if name in wanted]


def chapters(toc: Path = REPO / "_toc.yml") -> list[Path]:
    """The templates, in toc order: an entry `book/_executed/NAME` is `book/NAME.ipynb`."""
    def files(node):
        if isinstance(node, dict):
            if "file" in node:
                yield node["file"]
            for v in node.values():
                if isinstance(v, (dict, list)):
                    yield from files(v)
        elif isinstance(node, list):
            for v in node:
                yield from files(v)

    out = []
    for f in files(parse_yaml(toc.read_text())):
        if Path(f).parent == EXECUTED:
            template = REPO / "book" / f"{Path(f).name}.ipynb"
            if not template.is_file():
                raise BookError(f"{toc.name} lists {f} but {template.relative_to(REPO)} does not exist")
            out.append(template)
    return out


def chapter_modules(toc: Path = REPO / "_toc.yml") -> list:
    """The module of each chapter of the toc, in order: book/NN_name.ipynb is served by
    mclib.book.chNN_name (mclib/book/__init__.py)."""
    import importlib

    return [importlib.import_module(f"{__package__}.ch{t.stem}") for t in chapters(toc)]


def declared(name: str, toc: Path = REPO / "_toc.yml") -> list:
    """What the toc's chapters declare under `name`, in toc order: the attribute `name` of each
    chapter module that has one. The machinery names no chapter; it iterates over these:
    `idle_work` (work for idle cores while the book's run trains: `chapter.idle_tasks`),
    `site_part` (a part of the site after the chapters), the paper setting's rows
    (`curve_rows`, `freeze_rows`, `rejudged`: mclib.lease.reference), and, through
    `declared_by`, the runs a chapter reads (`runs_read`, `Reads`) and which one trains them
    (`trains_runs`: `plan`)."""
    return [getattr(m, name) for m in chapter_modules(toc) if hasattr(m, name)]


def declared_by(name: str, names: list[str] | None = None) -> dict:
    """{chapter: what it declares under `name`} of the chapters `names` (default every chapter
    of the toc), in their order; a name that no module of this package serves (a template
    outside the book) declares nothing."""
    import importlib
    import importlib.util

    out = {}
    for stem in [t.stem for t in chapters()] if names is None else names:
        try:
            found = importlib.util.find_spec(f"{__package__}.ch{stem}")
        except ModuleNotFoundError:  # a name with a dot
            found = None
        if found is not None and hasattr(m := importlib.import_module(found.name), name):
            out[stem] = getattr(m, name)
    return out


# --- which runs a build trains ------------------------------------------------------

ASKED = "MCLIB_BOOK_CHAPTERS"  # the chapters a build executes, comma-separated, for its kernels (`asked`)


@dataclass(frozen=True)
class Reads:
    """The runs a chapter reads beside the book's run, which every chapter reads: other seeds
    of `analysis.seeds` and E15's groups. A chapter module declares them as `runs_read(cfg) ->
    Reads`; one that declares none reads the book's run alone. The training chapter (the one
    that declares `trains_runs`) trains what the chapters a build executes read
    (`mclib.book.chapter.train_runs`), so a chapter added touches only its own module."""
    seeds: tuple[int, ...] = ()
    e15: tuple[str, ...] = ()


def asked() -> list[str] | None:
    """The chapters the build now running executes ($MCLIB_BOOK_CHAPTERS, which `build` sets
    for its kernels); None outside a build (a notebook opened by hand: every chapter)."""
    value = os.environ.get(ASKED)
    return None if value is None else [n for n in value.split(",") if n]


def runs_read(cfg, names: list[str] | None = None) -> dict[str, Reads]:
    """{chapter: `Reads`} of the chapters `names` (default every chapter of the toc) that
    declare `runs_read`."""
    return {name: f(cfg) for name, f in declared_by("runs_read", names).items()}


@contextlib.contextmanager
def _asking(names: list[str]):
    """$MCLIB_BOOK_CHAPTERS set to `names` while the chapters run (their kernels inherit it),
    as it was afterwards."""
    old = os.environ.get(ASKED)
    os.environ[ASKED] = ",".join(names)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ASKED, None)
        else:
            os.environ[ASKED] = old


@dataclass
class Plan:
    """What a build trains (`plan`): `train`, {run: chapter that trains it} of the runs the
    chapters asked read and that are not complete; `trainers`, the chapters asked that
    declare `trains_runs`; `line`, one line saying which runs train, where and why, which are
    complete and which are left out; `error`, one line naming a run that the chapters read
    and that nothing here trains (no checkpoint), else None."""
    train: dict[str, str]
    trainers: list[str]
    line: str
    error: str | None
    runs: dict = field(default_factory=dict)  # {run: folder} of every run the chapters asked read


def _runs_text(runs: list[str], readers: dict[str, list[str]], every: set[str]) -> str:
    """"seed 1 (every chapter), seeds 2, 3 (07_beyond), E15 attention, mlp (05_freezing)": the
    runs, those of one kind read by the same chapters together, each group with its readers."""
    groups: list[tuple[str, tuple, list[str]]] = []
    for run in runs:
        kind, what = run.split(" ", 1)
        why = ("every chapter",) if set(readers[run]) == every else tuple(readers[run])
        if groups and groups[-1][:2] == (kind, why):
            groups[-1][2].append(what)
        else:
            groups.append((kind, why, [what]))
    return ", ".join(f"{kind + 's' if kind == 'seed' and len(w) > 1 else kind} {', '.join(w)} ({', '.join(why)})"
                     for kind, why, w in groups)


def plan(cfg, run_dir: Path, names: list[str], out: Path) -> Plan:
    """Which runs the chapters `names` read (the book's run, and what each declares in
    `runs_read`), which of them are not complete, and who trains those: the training chapter
    where it is asked (it trains what the chapters asked read, `train_runs`), else the chapters
    that declare the run (they train what they read: `seed_runs`, `freeze_runs_of`), else
    nobody: then a run without a checkpoint is an error, and a cut one is read as it is. With
    `analysis.train_in_book: false` nothing trains. Runs that only chapters not asked read are
    left out, and the line says so."""
    from ..analyses.freezing import LONGEST_FIRST, pending_groups
    from ..core.checkpoints import saved_steps
    from ..core.runs import freeze_dir, seed_run_dirs
    from ..core.train import seed_jobs

    toc = [t.stem for t in chapters()]
    book = [n for n in names if n in declared_by("CHAPTER", names)]  # the chapters of the book among them
    every = runs_read(cfg, toc)
    mine = {n: r for n, r in every.items() if n in book}
    trainers = list(declared_by("trains_runs", book))
    folders = seed_run_dirs(cfg, run_dir)

    def runs_of(reads: dict[str, Reads], main: list[str]) -> dict[str, list[str]]:
        """{run: the chapters that read it}, seeds first, then E15 longest first."""
        readers = {f"seed {cfg.seed}": list(main)} if main else {}
        for s in folders:
            for n, r in reads.items():
                if s in r.seeds:
                    readers.setdefault(f"seed {s}", []).append(n)
        for g in LONGEST_FIRST:
            for n, r in reads.items():
                if g in r.e15:
                    readers.setdefault(f"E15 {g}", []).append(n)
        return readers

    readers = runs_of(mine, book)
    if not readers:
        return Plan({}, trainers, "", None)
    left = {run: chapters_ for run, chapters_ in runs_of(every, toc).items() if run not in readers}
    paths = {run: folders[int(run.split()[1])] if run.startswith("seed") else freeze_dir(run_dir, run.split()[1])
             for run in readers}
    pending_seeds = {job[0].seed for job in seed_jobs(cfg, run_dir)}
    groups = [run.split()[1] for run in readers if run.startswith("E15")]
    pending_e15 = set(groups if cfg.seed in pending_seeds or not groups else pending_groups(cfg, run_dir, groups))
    pending = [run for run in readers if (run.startswith("seed") and int(run.split()[1]) in pending_seeds)
               or (run.startswith("E15") and run.split()[1] in pending_e15)]
    main, train, unread = f"seed {cfg.seed}", {}, []
    for run in pending:
        declaring = [n for n in readers[run] if run != main or n in mine and cfg.seed in mine[n].seeds]
        if not cfg.analysis.train_in_book:
            unread.append(run)
        elif trainers:
            train[run] = trainers[0]
        elif declaring and (run != main or saved_steps(paths[main])):  # every chapter opens the book's run first
            train[run] = declaring[0]
        else:
            unread.append(run)
    missing = [run for run in unread if not saved_steps(paths[run])]
    shown = lambda run: f"{run} ({os.path.relpath(paths[run], out)})"
    add = f"add {', '.join(declared_by('trains_runs', toc)) or 'the training chapter'}"
    error = None
    if missing:
        why = ("this book does not train (analysis.train_in_book: false)" if not cfg.analysis.train_in_book else
               f"no chapter asked trains them ({add})")
        error = (f"{', '.join(book)}: {len(missing)} run(s) read are not trained, and {why}: "
                 + ", ".join(shown(run) for run in missing))
    elif main in pending and any(run.startswith("E15") and where not in trainers for run, where in train.items()):
        error = (f"{', '.join(book)}: E15's runs start from the book's run's last checkpoint, and {shown(main)} "
                 f"is not complete ({add})")
    parts = []
    for where in dict.fromkeys(train.values()):
        parts.append(f"training in {where}: " + _runs_text([r for r in train if train[r] == where], readers, set(book)))
    if not train:
        parts.append("training: none" + ("" if cfg.analysis.train_in_book else " (analysis.train_in_book: false)"))
    if unread:
        parts.append("read as they are, not complete: " + _runs_text(unread, readers, set(book)))
    done = [run for run in readers if run not in pending]
    if done:
        parts.append("complete: " + _runs_text(done, readers, set(book)))
    if left:
        parts.append("left out, no chapter asked reads them: " + _runs_text(list(left), left, set(toc)))
    return Plan(train, trainers, "runs: " + "; ".join(parts), error, paths)


# --- hashes -------------------------------------------------------------------------

def _file_sha(path: Path) -> str | None:
    return short_sha(path.read_bytes()) if path.is_file() else None


def run_state(run_dir: Path) -> str:
    from ..core.checkpoints import saved_steps
    from ..core.runs import METRICS

    return short_sha(saved_steps(run_dir), _file_sha(run_dir / METRICS))


# --- one chapter --------------------------------------------------------------------

def declared_reads(template: Path) -> list[str]:
    """The files of the run folder a chapter reads besides the run itself, as its notebook
    metadata declares them ("mclib": {"reads": [...]}): e.g. the scorecard page reads the
    scorecard.json the other chapters write, so it must run again when that changes."""
    meta = json.loads(template.read_text()).get("metadata", {}).get("mclib", {})
    return list(meta.get("reads", []))


def _key(template: Path, params: dict, profile: dict, run_dir: Path, src: str) -> str:
    extra = [(name, _file_sha(run_dir / name)) for name in declared_reads(template)]
    return short_sha(_file_sha(template), params, profile, src, run_state(run_dir), extra or None)


@contextlib.contextmanager
def _kernel_stderr_to(log: Path):
    """The kernel inherits file descriptor 2: point it at a log file (its warnings and a
    dying kernel's traceback are kept there), while our own sys.stderr (messages,
    papermill's progress bar) stays on the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(log, "wb") as f:
        os.dup2(f.fileno(), 2)
    old = sys.stderr
    with contextlib.suppress(AttributeError, OSError, ValueError):  # e.g. pytest's capture has no fd
        if sys.stderr.fileno() == 2:
            sys.stderr = open(saved, "w", buffering=1, closefd=False)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = old
        os.dup2(saved, 2)
        os.close(saved)


def _why(e: BaseException) -> str:
    """One line: the cell's exception for a cell error, else the exception's first line."""
    if hasattr(e, "ename"):  # PapermillExecutionError
        return f"{e.ename}: {e.evalue}"[:200]
    lines = [l for l in str(e).splitlines() if l.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:200]


def machine_paths(out: Path, run_dir: Path) -> dict[str, str]:
    """The absolute paths of this machine that an executed notebook may hold (papermill's
    parameters and metadata, a warning's file name), each with what the notebook says
    instead: the run folder relative to the output folder, the output folder and the
    repository as ".", the Python installation and the home folder by name. The site
    offers every executed notebook for download, so none of these may reach it."""
    return {str(Path(run_dir).resolve()): os.path.relpath(Path(run_dir).resolve(), Path(out).resolve()),
            str(Path(out).resolve()): ".", str(REPO): ".", sys.prefix: "<python>", str(Path.home()): "~"}


def relative_paths(text: str, paths: dict[str, str]) -> str:
    """`text` with each absolute path of `paths` (longest first, so a folder inside another
    is taken whole) replaced: "ABS/x" by "REL/x" ("x" when REL is "."), "ABS" alone by REL.
    A path that merely starts like one of them ("/tmp/out2" for "/tmp/out") is left."""
    import re

    for absolute in sorted((p for p in paths if len(p) > 1), key=len, reverse=True):
        rel = paths[absolute]
        text = re.sub(re.escape(absolute) + r"(/|(?![\w.\-]))",
                      lambda m: (("" if rel == "." else rel + "/") if m.group(1) else rel), text)
    return text


def _relative_everywhere(node, paths: dict[str, str]):
    """`relative_paths` applied to every string of a notebook (sources, outputs, metadata),
    except image data: base64 can spell a short path by chance."""
    if isinstance(node, str):
        return relative_paths(node, paths)
    if isinstance(node, list):
        return [_relative_everywhere(v, paths) for v in node]
    if isinstance(node, dict):
        for k, v in node.items():
            if not k.startswith("image/"):
                node[k] = _relative_everywhere(v, paths)
    return node


def _execute(template: Path, output: Path, params: dict, timeout: float | None, progress: bool,
             *, paths: dict[str, str] | None = None) -> None:
    """Run `template` into `output` with papermill, then make the copy the site offers for
    download machine-independent: every path of `paths` (`machine_paths`) written relative."""
    import nbformat
    import papermill as pm

    with _kernel_stderr_to(output.with_suffix(".kernel.log")):
        pm.execute_notebook(template, output, parameters=params, cwd=REPO,  # cwd: `import mclib` works uninstalled
                            execution_timeout=timeout, progress_bar=progress and CELL_BAR)
    nb = _relative_everywhere(nbformat.read(output, as_version=4), paths or {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "error":  # belt and braces: papermill should have raised
                raise RuntimeError(f"cell output {out.ename}: {out.evalue}")
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")  # the reader sees the settings table, not the raw paths
    nbformat.write(nb, output)


# --- the training chapter beside the others ------------------------------------------

READY = "MCLIB_BOOK_READY"  # where the training chapter's kernel says that only E15's runs still train
READY_FILE = ".training-ready"  # that file, in OUT/book/_executed/ (`mclib.book.chapter.train_runs` creates it)


def alongside(templates: list[Path], runs: Plan, cfg) -> str | None:
    """The chapter that executes beside the others, or None (one chapter after another).

    E15's runs start from the book's run's last checkpoint and train for a third of the
    book's CPU time; while the last of them trains, a core idles. So where the training
    chapter is asked and trains E15's runs in this build (`plan`), it executes in a process
    of its own (`_execute_apart`), and once its kernel says that every run but E15's is
    complete (the file READY names), the chapters that read neither E15's runs nor other
    chapters' records (`waits_for_trainer`) execute beside it. Not where scorecard.json
    cannot be locked (`scorecard.CAN_LOCK`: Windows)."""
    names = [t.stem for t in templates]
    trainer = next((n for n in runs.trainers if n in names), None)
    if trainer is None or not scorecard.CAN_LOCK:
        return None
    return trainer if any(run.startswith("E15") and where == trainer for run, where in runs.train.items()) else None


def waits_for_trainer(template: Path, cfg) -> bool:
    """Whether a chapter waits for the training chapter executing beside it to end: it reads
    E15's runs (`runs_read`) or the records other chapters write (its notebook declares
    reads, `declared_reads`: the scorecard)."""
    reads = runs_read(cfg, [template.stem]).get(template.stem)
    return bool(reads is not None and reads.e15) or bool(declared_reads(template))


def _execute_in_process(template: Path, output: Path, params: dict, timeout: float | None, paths: dict,
                        env: dict) -> str | None:
    os.environ.update(env)
    try:
        _execute(template, output, params, timeout, False, paths=paths)
    except BaseException as e:  # noqa: BLE001 - handed back as one line
        return _why(e)
    return None


def _execute_apart(template: Path, output: Path, params: dict, timeout: float | None, paths: dict,
                   ready: Path) -> str | None:
    """`_execute` in a process of its own (its kernel's stderr, papermill's cell bar and the
    redirected file descriptor 2 are that process's, not this one's, where other chapters
    execute meanwhile), its kernel told where to say that only E15's runs still train (READY);
    None, or why it failed (`_why`)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_execute_in_process, template, output, params, timeout, paths,
                           {READY: str(ready)}).result()


def _beside(state: dict, work, ready: Path, poll: float = 1.0) -> None:
    """Start `work` on a thread (`state["thread"]`) and return once the file `ready` exists or
    the work has ended."""
    ready.unlink(missing_ok=True)
    state["thread"] = thread = threading.Thread(target=work, daemon=True)
    thread.start()
    while thread.is_alive() and not ready.exists():
        time.sleep(poll)


# --- what the training chapter is doing ---------------------------------------------

def expected_steps(folder: Path, cfg=None) -> int:
    """The step a run is expected to end at, as far as its rules fix it now: where it ended
    (end.json at its newest checkpoint); an E15 run (RUN/freeze/GROUP) that has not dropped,
    at the main run's drop, where that came before its cap; with the book's profile `cfg`,
    another seed that stops `analysis.after_drop` steps after its drop, there once it has
    dropped; else its cap, `train.steps` (a run that converges ends sooner)."""
    from ..core.checkpoints import resumable_steps
    from ..core.metrics import find_drop
    from ..core.runs import END, METRICS, load_metrics, run_profile

    folder, profile = Path(folder), run_profile(folder)
    steps, cap = resumable_steps(folder), profile.train.steps
    if steps and (folder / END).is_file():
        end = json.loads((folder / END).read_text())
        if end.get("step") == steps[-1] and end.get("ended") != "cut":
            return steps[-1]
    drop = lambda run: find_drop(load_metrics(run), rank=profile.data.rank) if (run / METRICS).is_file() else None
    if folder.parent.name == "freeze" and drop(folder) is None and (main := drop(folder.parent.parent)) is not None:
        return min(cap, main)
    after = cfg.analysis.after_drop if cfg is not None and profile.seed != cfg.seed else None
    if after is not None and (own := drop(folder)) is not None:
        return min(cap, own + after)
    return cap


def step_ms(folder: Path, over: int = 1000) -> float | None:
    """The run's measured step, in ms: its training time (metrics.csv's `wall`, which resumes
    with the run) over its last `over` steps or so; None before two timed rows."""
    from ..core.runs import load_metrics

    m = load_metrics(folder)
    timed = m.loc[m["wall"].notna(), ["step", "wall"]] if "wall" in m else m.iloc[:0]
    if len(timed) < 2:
        return None
    last = timed.iloc[-1]
    first = timed[timed["step"] <= last["step"] - over]
    first = first.iloc[-1] if len(first) else timed.iloc[0]
    return 1000 * float(last["wall"] - first["wall"]) / float(last["step"] - first["step"])


def training_status(root: Path, since: float, cfg=None) -> list[str]:
    """"NAME step/expected at N ms a step" for every run folder under `root` (one holding
    profile.yaml) that saved a checkpoint after `since` (a time.time()), NAME relative to
    root; expected: `expected_steps`, the step measured by `step_ms` (left out before it is)."""
    from ..core.checkpoints import resumable_steps
    from ..core.runs import METRICS, PROFILE, checkpoint_dir

    out = []
    for prof in sorted(Path(root).glob(f"**/{PROFILE}")):
        folder = prof.parent
        try:  # a run may be writing its folder right now, or be an old one that no longer loads: skip it
            steps = resumable_steps(folder)  # the newest checkpoint always has its train state
            if steps and checkpoint_dir(folder, steps[-1]).stat().st_mtime >= since:
                ms = step_ms(folder) if (folder / METRICS).is_file() else None
                out.append(f"{folder.relative_to(root).as_posix()} {steps[-1]:,}/{expected_steps(folder, cfg):,}"
                           + (f" at {ms:.0f} ms a step" if ms else ""))
        except (OSError, ValueError, KeyError, ConfigError, yaml.YAMLError):
            continue
    return out


def time_left(runs: dict[str, Path], cfg, workers: int) -> float | None:
    """Seconds of training left to the runs `runs` ({name: folder}, `Plan.train`'s with
    `Plan.runs`), from each one's measured step (`step_ms`; a run not started or not yet timed
    takes the mean of the others) and its steps left to `expected_steps` (a run not started: to
    its cap): the longer of the
    work spread over `workers` and the book's run followed by its longest E15 run (E15 starts
    from its end). None before any step is measured."""
    from ..core.checkpoints import resumable_steps
    from ..core.runs import METRICS, PROFILE

    left, ms = {}, {}
    for name, folder in runs.items():
        try:
            started = (folder / PROFILE).is_file()
            steps = resumable_steps(folder) if started else []
            if started:
                expected = expected_steps(folder, cfg)
            else:  # its cap: E15's, or the profile's
                expected = cfg.analysis.freeze_steps if name.startswith("E15") else cfg.train.steps
            left[name] = max(0, expected - (steps[-1] if steps else 0))
            if started and (folder / METRICS).is_file() and (t := step_ms(folder)):
                ms[name] = t
        except (OSError, ValueError, KeyError, ConfigError, yaml.YAMLError):
            continue
    if not ms:
        return None
    mean = sum(ms.values()) / len(ms)
    seconds = {name: n * ms.get(name, mean) / 1000 for name, n in left.items()}
    e15 = [t for name, t in seconds.items() if name.startswith("E15")]
    chain = seconds.get(f"seed {cfg.seed}", 0.0) + max(e15, default=0.0)
    return max(chain, sum(seconds.values()) / max(1, workers))


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


@contextlib.contextmanager
def _report_training(root: Path, every: float = 60.0, runs: Plan | None = None, cfg=None):
    """While a chapter runs, print on the terminal, at most every `every` seconds, one line:
    the runs under `root` that saved a checkpoint since the last line, each with its step out
    of its expected steps and its measured step (`training_status`; a finished run is named
    once, at its last step), and, given the build's `runs` and profile `cfg`, the training
    left to them (`time_left`), while one of them moved (a run a chapter trains on its own,
    such as chapter 08's, has no expected end here). Runs train in the kernel or its workers, whose progress bars
    nobody sees; their folders are what this process can see."""
    from tqdm.auto import tqdm

    from ..core.jobs import local_workers

    # file times come from a coarser clock than time.time() and can lag it by a tick:
    # a second of slack, so a checkpoint saved just after the start is not missed
    done, since = threading.Event(), time.time() - 1.0
    pending = {name: runs.runs[name] for name in runs.train} if runs is not None and cfg is not None else {}
    names = set()
    for folder in pending.values():
        with contextlib.suppress(ValueError):  # a run folder outside root is not among the lines
            names.add(Path(folder).relative_to(root).as_posix())
    workers = local_workers(cfg.train.threads) if cfg is not None else 1

    def watch():
        shown: set[str] = set()
        while not done.wait(every):
            moved = [s for s in training_status(root, since, cfg) if s not in shown]  # a finished run drops out
            if moved:
                # the training left is the build's runs' (`pending`): said only while one of them moved, never
                # "0 s" beside a run a chapter trains on its own (chapter 08's GPT runs)
                planned = any(s.split(" ", 1)[0] in names for s in moved)
                left = time_left(pending, cfg, workers) if planned else None
                tqdm.write("  training: " + ", ".join(moved)
                           + (f"; about {_minutes(left)} of training left" if left is not None else ""),
                           file=sys.stdout)
                shown.update(moved)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# --- the whole book -----------------------------------------------------------------

def _stage(out: Path) -> list[Path]:
    """Copy the book's non-notebook sources into `out` (a no-op when out is the repo)."""
    sources = [REPO / "_config.yml", REPO / "_toc.yml"] + sorted(
        p for p in (REPO / "book").rglob("*")
        if p.is_file() and p.suffix != ".ipynb" and "_executed" not in p.parts
        and "__pycache__" not in p.parts)  # book/_ext's extensions: their bytecode is no source
    staged = [out / p.relative_to(REPO) for p in sources]
    if out != REPO:
        for src, dst in zip(sources, staged):
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return staged


def _warn_if_slow(profile, device: str, run_dir: Path) -> None:
    from ..core.checkpoints import saved_steps

    paper = paper_profile()
    if device == "cpu" and profile.model == paper.model and profile.train.batch >= paper.train.batch:
        left = profile.train.steps - (saved_steps(run_dir) or [0])[-1]
        if left > 0:
            days = left * SECONDS_PER_PAPER_STEP_CPU / 86400
            print(f"warning: the paper's model on a CPU: ~{SECONDS_PER_PAPER_STEP_CPU:.0f} s a step x {left} steps "
                  f"= about {days:.1f} days; running anyway (interrupt and rerun to resume; a GPU takes hours)",
                  file=sys.stderr)


def build(profile: str, seed: int | None = None, out_dir: str | Path | None = None,
          run_dir: str | Path | None = None, device: str | None = None, *, timeout: float | None = None,
          templates: list[Path] | None = None, progress: bool = True, site: bool = True,
          ledger: Path | None = None) -> dict:
    """Execute the chapters (`templates`, default every chapter of _toc.yml) and build the
    site (site=False: not; a GPU lease executes chapters and the CPU machine builds the
    site); returns the manifest (raises BookError). Chapters left out keep their last
    records in the manifest as they were, so a later build can still reuse them. The site
    holds the chapters executed here, then the parts the chapters declare (`site_part(out,
    ledger)`, `declared`): the scorecard chapter's "The paper's own setting"
    (`mclib.lease.part`: the chapters GPU leases executed, from the slices done beside
    `ledger`, default results/paper-slices.yaml)."""
    from ..core.precision import resolve_device

    t_start = time.time()
    ppath = profile_path(profile).resolve()
    cfg = load_profile(ppath, **({} if seed is None else {"seed": seed}))
    out = Path(out_dir or REPO).resolve()
    run_dir = Path(run_dir or default_run_dir(cfg, out / "runs")).resolve()
    device = device or cfg.train.device
    resolved = resolve_device(device).type
    _warn_if_slow(cfg, resolved, run_dir)
    templates = chapters() if templates is None else [Path(t) for t in templates]
    try:
        runs = plan(cfg, run_dir, [t.stem for t in templates], out)
    except ValueError as e:  # e.g. an E15 folder started from another checkpoint
        raise BookError(f"the runs the chapters read: {' '.join(str(e).split())}") from None
    if runs.line:
        print(runs.line, flush=True)
    if runs.error:
        raise BookError(runs.error)
    b = _Build(cfg, out, run_dir, resolved, templates, runs, timeout, progress, t_start,
               {"profile": str(ppath), "seed": cfg.seed, "run_dir": str(run_dir), "device": device})
    b.execute()
    return b.site(ledger) if site else b.no_site()


class _Build:
    """One `build` under way: the manifest it writes (OUT/book/_executed/manifest.json) and
    the last build's, which it reuses; `chapters` executes them, `site` renders them."""

    def __init__(self, cfg, out: Path, run_dir: Path, device: str, templates: list[Path], runs: Plan,
                 timeout: float | None, progress: bool, t_start: float, params: dict):
        self.cfg, self.out, self.run_dir, self.templates, self.runs = cfg, out, run_dir, templates, runs
        self.timeout, self.progress, self.t_start, self.params = timeout, progress, t_start, params
        self.staged = _stage(out)
        self.exe = out / EXECUTED
        self.exe.mkdir(parents=True, exist_ok=True)
        self.path = self.exe / "manifest.json"
        self.prev = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.prev_nb = {r["name"]: r for r in self.prev.get("notebooks", [])}
        self.src = mclib_sha()
        self.manifest = {"profile": cfg.name, "seed": cfg.seed, "run_dir": str(run_dir), "device": device,
                         "git": git_revision(), "mclib": self.src, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                         "notebooks": [], "site": None}
        self.lock = threading.Lock()  # the manifest: written from this thread and from the one beside it
        self.ready = self.exe / READY_FILE

    def save(self) -> None:
        with self.lock:
            self.manifest["duration_s"] = round(time.time() - self.t_start, 1)
            self.path.write_text(json.dumps(self.manifest, indent=1))

    def key(self, template: Path) -> str:
        return _key(template, self.params, self.cfg.to_dict(), self.run_dir, self.src)

    def record(self, i: int, template: Path) -> dict | None:
        """The chapter's record, added to the manifest; None where the last build's executed
        copy is reused (same key, copy untouched), which it then says."""
        name, output = template.stem, self.exe / f"{template.stem}.ipynb"
        old = self.prev_nb.get(name, {})
        rec = {"name": name, "template": str(template), "output": str(output), "device": self.manifest["device"],
               "parameters": self.params, "git": self.manifest["git"]}
        with self.lock:
            self.manifest["notebooks"].append(rec)
        if (old.get("complete") and old.get("key") == self.key(template) and old.get("output_sha") == _file_sha(output)
                and not (name in self.runs.trainers and self.runs.train)):  # the training chapter runs while a run it trains is not complete
            rec.update({**old, "status": "reused", "duration_s": 0.0})  # executed_at/_s: when it did run
            print(f"[{i}/{len(self.templates)}] {name}: unchanged, reused")
            return None
        print(f"[{i}/{len(self.templates)}] {name}: running ({self.cfg.name}, seed {self.cfg.seed}, "
              f"{self.manifest['device']})", flush=True)
        return rec

    def run(self, template: Path, rec: dict, *, apart: bool = False, reporting: bool = True) -> str | None:
        """Execute one chapter and complete its record; None, or why it failed. apart: in a
        process of its own (`_execute_apart`), beside the chapters this thread executes;
        reporting: the training's progress line (`_report_training`) and papermill's cell bar."""
        output, t0, paths = Path(rec["output"]), time.time(), machine_paths(self.out, self.run_dir)
        scorecard.forget_chapter(self.run_dir, rec["name"])  # the chapter records its rows afresh
        report = self.progress and reporting
        try:
            with (_report_training(self.run_dir.parent, runs=self.runs, cfg=self.cfg) if report
                  else contextlib.nullcontext()):
                if apart:
                    error = _execute_apart(template, output, self.params, self.timeout, paths, self.ready)
                else:
                    _execute(template, output, self.params, self.timeout, report, paths=paths)
                    error = None
        except (Exception, KeyboardInterrupt) as e:
            error = _why(e)
        took = round(time.time() - t0, 1)
        if error is not None:
            rec.update({"status": "failed", "complete": False, "error": error, "duration_s": took})
            return error
        rec.update({"status": "executed", "complete": True, "duration_s": took, "execution_s": took,
                    "executed_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "key": self.key(template),
                    "output_sha": _file_sha(output)})
        self.save()
        return None

    def failed(self, i: int, name: str, error: str) -> BookError:
        """The error that ends the build at chapter `name` (index i); the chapters after it
        that did not run keep their last records, so the next build can still reuse them."""
        with self.lock:
            seen = {r["name"] for r in self.manifest["notebooks"]}
            self.manifest["notebooks"] += [{**self.prev_nb[t.stem], "status": "not run"} for t in self.templates[i:]
                                           if t.stem in self.prev_nb and t.stem not in seen]
        self.save()
        return BookError(f"notebook {name} failed ({error}); see {self.exe / f'{name}.ipynb'}")

    def execute(self) -> None:
        """Every chapter in order, each reused or executed; the training chapter, where it
        trains E15's runs, beside the others (`alongside`). Raises BookError at the first
        that fails."""
        trainer = alongside(self.templates, self.runs, self.cfg)
        beside: dict = {}  # the training chapter executing beside this thread: its thread, index, error
        with _asking([t.stem for t in self.templates]):
            for i, template in enumerate(self.templates, 1):
                if beside and waits_for_trainer(template, self.cfg):
                    print(f"[{i}/{len(self.templates)}] {template.stem}: waits for {trainer} (it reads what that "
                          "chapter trains or records)", flush=True)
                    beside["thread"].join()
                if beside.get("error"):
                    raise self.failed(beside["i"], trainer, beside["error"])
                rec = self.record(i, template)
                if rec is None:
                    continue
                if template.stem == trainer:
                    beside = {"i": i}
                    _beside(beside, lambda t=template, r=rec: beside.update(error=self.run(t, r, apart=True)),
                            self.ready)
                    if beside.get("error"):
                        raise self.failed(i, trainer, beside["error"])
                    if beside["thread"].is_alive():
                        print(f"  {trainer}: only E15's runs train now; the chapters that read neither them nor "
                              "other chapters' records execute beside it", flush=True)
                    continue
                error = self.run(template, rec, reporting=not (beside and beside["thread"].is_alive()))
                if error is not None:
                    if beside:
                        print(f"  {template.stem} failed; waiting for {trainer} to end", flush=True)
                        beside["thread"].join()
                    raise self.failed(i, template.stem, error)
            if beside:
                beside["thread"].join()
                self.ready.unlink(missing_ok=True)
                if beside.get("error"):
                    raise self.failed(beside["i"], trainer, beside["error"])
        ran = {r["name"]: r for r in self.manifest["notebooks"]}  # chapters left out keep their last records
        order = [t.stem for t in chapters()]
        self.manifest["notebooks"] = sorted(
            [*ran.values(), *(r for name, r in self.prev_nb.items() if name not in ran)],
            key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))

    def no_site(self) -> dict:
        self.manifest["site"] = {"status": "skipped"}
        self.save()
        print(f"book: {len(self.templates)} chapter(s), no site ({self.manifest['duration_s']:.0f} s; "
              f"manifest {self.path})")
        return self.manifest

    def site(self, ledger: Path | None) -> dict:
        """The site: the chapters executed, then the parts the chapters declare; skipped when its
        inputs are exactly those of the last good build."""
        out, manifest = self.out, self.manifest
        parts = [site_part(out, ledger) for site_part in declared("site_part")]
        executed = [(EXECUTED / r["name"]).as_posix() for r in manifest["notebooks"]
                    if r.get("complete") and Path(r["output"]).is_file()]
        toc = site_toc(out, executed, parts)
        pages = [p for part in parts for p in part]
        site_key = short_sha([_file_sha(p) for p in self.staged + pages + [toc]],
                             [r.get("output_sha") for r in manifest["notebooks"]])
        html = out / "_build" / "html"
        if (self.prev.get("site") or {}).get("key") == site_key and (html / "index.html").is_file():
            manifest["site"] = {**self.prev["site"], "status": "reused"}
            print("site: unchanged, reused")
        else:
            order = [t.stem for t in chapters()]
            shown = [n for n in order if (EXECUTED / n).as_posix() in executed]
            partial = len(shown) < len(order)
            print("site: jupyter-book build" + (f" of {len(shown)} of the {len(order)} chapters (links to the "
                                                 "others left out)" if partial else ""), flush=True)
            manifest["site"] = _build_site(out, toc, partial)
            if manifest["site"]["status"] != "ok":
                self.save()
                raise BookError(f"jupyter-book build failed ({manifest['site']['error']}); see {manifest['site']['log']}")
            manifest["site"]["key"] = site_key
        self.save()
        print(f"book: {html / 'index.html'} ({manifest['duration_s']:.0f} s; manifest {self.path})")
        return manifest


def site_toc(out: Path, executed: list[str], parts: list[list[Path]]) -> Path:
    """OUT/_build/_toc.yml (jupyter-book build --toc): the book's chapters that have an
    executed copy (`executed`, their toc entries), then each part of `parts` (files under OUT,
    its first page first): that page, the others as its sections."""
    entry = lambda page: Path(page).relative_to(out).with_suffix("").as_posix()
    book = parse_yaml((REPO / "_toc.yml").read_text())
    book["chapters"] = [c for c in book["chapters"] if c["file"] in executed]
    for pages in parts:
        part = {"file": entry(pages[0])}
        if pages[1:]:
            part["sections"] = [{"file": entry(p)} for p in pages[1:]]
        book["chapters"].append(part)
    path = Path(out) / SITE_TOC
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    return path


# What a site of some chapters only may leave unresolved: links to the chapters not in it, and
# the landing page's numbers glued by the scorecard chapter when that is not in it.
PARTIAL_WARNINGS = ["myst.xref_missing", "mystnb.glue_ref"]


def partial_config(out: Path) -> Path:
    """OUT/_build/_config.partial.yml: _config.yml with `PARTIAL_WARNINGS` let through, for a
    site of some of the book's chapters (`--chapters` into a fresh folder); its relative paths
    made absolute, since jupyter-book reads them from the config file's folder."""
    config = parse_yaml((Path(out) / "_config.yml").read_text())
    sphinx = config["sphinx"]
    sphinx["config"]["suppress_warnings"] = PARTIAL_WARNINGS
    sphinx["config"]["html_static_path"] = [str(Path(out) / p) for p in sphinx["config"]["html_static_path"]]
    sphinx["local_extensions"] = {k: str(Path(out) / v) for k, v in sphinx["local_extensions"].items()}
    path = Path(out) / "_build" / "_config.partial.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _build_site(out: Path, toc: Path, partial: bool = False) -> dict:
    """Jupyter Book 1, every page re-read (--all: an incremental Sphinx build would not
    repeat the warnings of unchanged pages), warnings are errors; partial (some of the toc's
    chapters only): but links to the others and the scorecard's glued numbers (`partial_config`)."""
    t0 = time.time()
    log = out / "_build" / "jupyter-book.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "_build" / "html", ignore_errors=True)  # no stale pages or images
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(out), "--path-output", str(out), "--toc", str(toc), "-W", "-n", "--keep-going", "--all"]
    if partial:
        cmd += ["--config", str(partial_config(out))]
    p = subprocess.run(cmd, capture_output=True, text=True)
    log.write_text(p.stdout + p.stderr)
    warnings = [l for l in (p.stdout + p.stderr).splitlines() if "WARNING" in l or "ERROR" in l]
    for w in warnings:
        print(w, file=sys.stderr)
    rec = {"status": "ok" if p.returncode == 0 else "failed", "duration_s": round(time.time() - t0, 1),
           "log": str(log), "warnings": len(warnings)}
    if p.returncode:
        rec["error"] = f"exit {p.returncode}, {len(warnings)} warnings/errors"
    return rec
