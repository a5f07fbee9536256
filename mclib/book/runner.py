"""`python -m mclib book`: a profile in, a browsable HTML report out (`build`).

    _toc.yml               the chapters in order (`chapters()`)
    book/NAME.ipynb        chapter templates, stored without outputs
    OUT/runs/P-seedS/      the run every chapter reads; the training chapter trains it
    OUT/book/_executed/    executed chapters + manifest.json  (OUT: --out, default the repository)
    OUT/_build/html/       the site

Papermill runs each template with the same parameters (profile, seed, run_dir, device). A
chapter is reused when its key (template, parameters, profile, mclib sources and the tables they
read, the run's state and the files its notebook declares it reads, `declared_reads`) is as stored
right after its last run and its executed copy is untouched; taking the key after the run lets the
training chapter, which creates the run, be reused. `plan` says first which runs train, where and
why. A chapter that fails ends the build (`BookError`, one line) with no site. Functions that read
the chapters' declarations take their `specs` (mclib.chapters.registry.specs) from the caller.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from pathlib import Path

import yaml

from ..core.checkpoints import saved_steps
from ..core.config import load_profile, parse_yaml, profile_path
from ..core.packaged import data_sha
from ..core.paper import profile as paper_profile
from ..core.precision import resolve_device
from ..core.repo import REPO, git_revision, mclib_sha, require_checkout, short_sha
from ..core.runs import default_run_dir, write_atomic
from . import scorecard
from .runner_beside import READY_FILE, _beside, _execute_apart, alongside
from .runner_execute import _execute, _file_sha, _key, _why, declared_reads, machine_paths
from .runner_plan import Plan, Reads, _asking, plan_runs
from .runner_progress import _report_training
from .runner_site import _build_site, _stage, site_toc
from .spec import Specs, among

log = logging.getLogger(__name__)

# mclib.core.train (torch, tqdm) is imported inside the functions: the CLI imports this
# module for BookError, and should stay light.

EXECUTED = Path("book") / "_executed"
BOOK_NEEDS = "the book (its notebooks in book/, _toc.yml)"  # what an installed wheel lacks
SECONDS_PER_PAPER_STEP_CPU = 12.4  # measured on 2 cores (docs/protocol.md, §4)


class BookError(RuntimeError):
    """A chapter or the site build failed; the message is one line."""


def select_chapters(names: str, toc: Path = REPO / "_toc.yml") -> list[Path]:
    """The templates `names` names ("01_train,03_heads"), in toc order; an unknown one is a BookError."""
    known = {t.stem: t for t in chapters(toc)}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    bad = [n for n in wanted if n not in known]
    if bad or not wanted:
        raise BookError(
            f"--chapters {names!r}: unknown chapter {', '.join(bad) or '(none named)'}; "
            f"chapters: {', '.join(known)}"
        )
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

    require_checkout(BOOK_NEEDS)
    out = []
    for f in files(parse_yaml(toc.read_text())):
        if Path(f).parent == EXECUTED:
            template = REPO / "book" / f"{Path(f).name}.ipynb"
            if not template.is_file():
                raise BookError(f"{toc.name} lists {f} but {template.relative_to(REPO)} does not exist")
            out.append(template)
    return out


# --- which runs a build trains (runner_plan) -----------------------------------------


def runs_read(cfg, names: list[str] | None = None, *, specs: Specs) -> dict[str, Reads]:
    """{chapter: `Reads`} of the chapters `names` (default all of `specs`) that declare `runs_read`."""
    return {s.notebook: s.runs_read(cfg) for s in among(specs, names) if s.runs_read is not None}


def plan(cfg, run_dir: Path, names: list[str], out: Path, *, specs: Specs) -> Plan:
    """The `Plan` of the chapters `names`: the runs they read, which are not complete, and who
    trains those (the training chapter where asked, else the chapters that declare the run, else
    nobody); nothing trains with `analysis.train_in_book: false`."""
    toc = [t.stem for t in chapters()]
    book = [n for n in names if n in specs]  # the chapters of the book among them
    return plan_runs(
        cfg,
        run_dir,
        out,
        toc=toc,
        book=book,
        every=runs_read(cfg, toc, specs=specs),
        trainers=[s.notebook for s in among(specs, book) if s.trains_runs],
        toc_trainers=[s.notebook for s in among(specs, toc) if s.trains_runs],
    )


def waits_for_trainer(template: Path, cfg, *, specs: Specs) -> bool:
    """Whether a chapter waits for the training chapter beside it: it reads E15's runs or records
    that other chapters write (`declared_reads`)."""
    reads = runs_read(cfg, [template.stem], specs=specs).get(template.stem)
    return bool(reads is not None and reads.e15) or bool(declared_reads(template))


# --- the whole book -----------------------------------------------------------------


def _warn_if_slow(profile, device: str, run_dir: Path) -> None:

    paper = paper_profile()
    if device == "cpu" and profile.model == paper.model and profile.train.batch >= paper.train.batch:
        left = profile.train.steps - (saved_steps(run_dir) or [0])[-1]
        if left > 0:
            days = left * SECONDS_PER_PAPER_STEP_CPU / 86400
            log.warning(
                f"warning: the paper's model on a CPU: ~{SECONDS_PER_PAPER_STEP_CPU:.0f} s a step x {left} "
                "steps "
                f"= about {days:.1f} days; running anyway (interrupt and rerun to resume; a GPU takes hours)"
            )


def build(
    profile: str,
    seed: int | None = None,
    out_dir: str | Path | None = None,
    run_dir: str | Path | None = None,
    device: str | None = None,
    *,
    timeout: float | None = None,
    templates: list[Path] | None = None,
    progress: bool = True,
    site: bool = True,
    ledger: Path | None = None,
    specs: Specs,
    overrides: dict | None = None,
) -> dict:
    """Execute `templates` (default every chapter of _toc.yml) and, unless site=False, build the
    site: the chapters executed, then each spec's `site_part(out, ledger, specs=specs)`. Chapters
    left out keep their last records in the manifest. `overrides`: dotted keys set on the profile
    (--set), which the chapters read from OUT/book/_executed/NAME-set.yaml. Returns the manifest;
    raises BookError."""

    require_checkout(BOOK_NEEDS)
    t_start = time.time()
    ppath = profile_path(profile).resolve()
    cfg = load_profile(
        ppath, overrides_from="--set", **{**(overrides or {}), **({} if seed is None else {"seed": seed})}
    )
    out = Path(out_dir or REPO).resolve()
    if overrides:  # the chapters' kernels read the profile from a file: the one with the overrides on it
        ppath = out / EXECUTED / f"{cfg.name}-set.yaml"
        ppath.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(ppath, lambda f: f.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False)))
    run_dir = Path(run_dir or default_run_dir(cfg, out / "runs")).resolve()
    device = device or cfg.train.device
    resolved = resolve_device(device).type
    _warn_if_slow(cfg, resolved, run_dir)
    templates = chapters() if templates is None else [Path(t) for t in templates]
    try:
        runs = plan(cfg, run_dir, [t.stem for t in templates], out, specs=specs)
    except ValueError as e:  # e.g. an E15 folder started from another checkpoint
        raise BookError(f"the runs the chapters read: {' '.join(str(e).split())}") from None
    if runs.line:
        log.info(runs.line)
    if runs.error:
        raise BookError(runs.error)
    params = {"profile": str(ppath), "seed": cfg.seed, "run_dir": str(run_dir), "device": device}
    b = _Build(
        cfg,
        out,
        run_dir,
        device=resolved,
        templates=templates,
        runs=runs,
        timeout=timeout,
        progress=progress,
        t_start=t_start,
        params=params,
        specs=specs,
    )
    b.execute()
    return b.site(ledger) if site else b.no_site()


class _Build:
    """One `build` under way: the manifest it writes and the last build's, which it reuses."""

    def __init__(
        self,
        cfg,
        out: Path,
        run_dir: Path,
        *,
        device: str,
        templates: list[Path],
        runs: Plan,
        timeout: float | None,
        progress: bool,
        t_start: float,
        params: dict,
        specs: Specs,
    ):
        self.cfg, self.out, self.run_dir, self.templates, self.runs = cfg, out, run_dir, templates, runs
        self.specs = specs
        self.timeout, self.progress, self.t_start, self.params = timeout, progress, t_start, params
        self.staged = _stage(out)
        self.exe = out / EXECUTED
        self.exe.mkdir(parents=True, exist_ok=True)
        self.path = self.exe / "manifest.json"
        self.prev = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.prev_nb = {r["name"]: r for r in self.prev.get("notebooks", [])}
        code = mclib_sha()
        self.src = short_sha(code, data_sha())  # the code and the tables it reads
        self.manifest = {
            "profile": cfg.name,
            "seed": cfg.seed,
            "run_dir": str(run_dir),
            "device": device,
            "git": git_revision(),
            "mclib": code,
            "sources": self.src,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "notebooks": [],
            "site": None,
        }
        self.lock = threading.Lock()  # the manifest: written from this thread and from the one beside it
        self.ready = self.exe / READY_FILE
        self.beside: dict = {}  # the training chapter executing beside this thread: its thread, error (`one`)

    def save(self) -> None:
        with self.lock:
            self.manifest["duration_s"] = round(time.time() - self.t_start, 1)
            self.path.write_text(json.dumps(self.manifest, indent=1))

    def key(self, template: Path) -> str:
        return _key(template, self.params, self.cfg.to_dict(), self.run_dir, self.src)

    def record(self, i: int, template: Path) -> dict | None:
        """The chapter's manifest record; None where the last build's copy is reused (same key, untouched)."""
        name, output = template.stem, self.exe / f"{template.stem}.ipynb"
        old = self.prev_nb.get(name, {})
        rec = {
            "name": name,
            "template": str(template),
            "output": str(output),
            "device": self.manifest["device"],
            "parameters": self.params,
            "git": self.manifest["git"],
        }
        with self.lock:
            self.manifest["notebooks"].append(rec)
        if (
            old.get("complete")
            and old.get("key") == self.key(template)
            and old.get("output_sha") == _file_sha(output)
            and not (name in self.runs.trainers and self.runs.train)
        ):  # the training chapter runs while a run it trains is not complete
            rec.update({**old, "status": "reused", "duration_s": 0.0})  # executed_at/_s: when it did run
            log.info(f"[{i}/{len(self.templates)}] {name}: unchanged, reused")
            return None
        log.info(
            f"[{i}/{len(self.templates)}] {name}: running ({self.cfg.name}, seed {self.cfg.seed}, "
            f"{self.manifest['device']})"
        )
        return rec

    def run(self, template: Path, rec: dict, *, apart: bool = False, reporting: bool = True) -> str | None:
        """Execute one chapter and complete its record; None, or why it failed. apart: in a process
        of its own (`_execute_apart`); reporting: the training's progress line and the cell bar."""
        output, t0, paths = Path(rec["output"]), time.time(), machine_paths(self.out, self.run_dir)
        scorecard.forget_chapter(self.run_dir, rec["name"])  # the chapter records its rows afresh
        report = self.progress and reporting
        try:
            with (
                _report_training(self.run_dir.parent, runs=self.runs, cfg=self.cfg)
                if report
                else contextlib.nullcontext()
            ):
                if apart:
                    error = _execute_apart(
                        template, output, self.params, self.timeout, paths=paths, ready=self.ready
                    )
                else:
                    _execute(template, output, self.params, self.timeout, report, paths=paths)
                    error = None
        except (Exception, KeyboardInterrupt) as e:
            error = _why(e)
        took = round(time.time() - t0, 1)
        if error is not None:
            rec.update({"status": "failed", "complete": False, "error": error, "duration_s": took})
            return error
        rec.update(
            {
                "status": "executed",
                "complete": True,
                "duration_s": took,
                "execution_s": took,
                "executed_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "key": self.key(template),
                "output_sha": _file_sha(output),
            }
        )
        self.save()
        return None

    def failed(self, name: str, error: str) -> BookError:
        """The BookError that ends the build at `name`; chapters not run keep their last records."""
        with self.lock:
            seen = {r["name"] for r in self.manifest["notebooks"]}
            self.manifest["notebooks"] += [
                {**self.prev_nb[t.stem], "status": "not run"}
                for t in self.templates
                if t.stem in self.prev_nb and t.stem not in seen
            ]
        self.save()
        return BookError(f"notebook {name} failed ({error}); see {self.exe / f'{name}.ipynb'}")

    def execute(self) -> None:
        """Every chapter, reused or executed, in toc order, but the training chapter beside the others
        where `alongside` says so, and the chapters that `waits_for_trainer` after it has ended."""
        trainer = alongside(self.templates, self.runs, self.cfg)
        later = []  # the chapters that wait for the training chapter: (index, template)
        with _asking([t.stem for t in self.templates]):
            for i, template in enumerate(self.templates, 1):
                if self.beside and waits_for_trainer(template, self.cfg, specs=self.specs):
                    log.info(
                        f"[{i}/{len(self.templates)}] {template.stem}: waits for {trainer} (it reads what "
                        "that "
                        "chapter trains or records)"
                    )
                    later.append((i, template))
                    continue
                self.one(i, template, trainer)
            if self.beside:
                self.beside["thread"].join()
                self.ready.unlink(missing_ok=True)
                if self.beside.get("error"):
                    raise self.failed(trainer, self.beside["error"])
            for i, template in later:
                self.one(i, template, trainer)
        ran = {r["name"]: r for r in self.manifest["notebooks"]}  # chapters left out keep their last records
        order = [t.stem for t in chapters()]
        self.manifest["notebooks"] = sorted(
            [*ran.values(), *(r for name, r in self.prev_nb.items() if name not in ran)],
            key=lambda r: order.index(r["name"]) if r["name"] in order else len(order),
        )

    def one(self, i: int, template: Path, trainer: str | None) -> None:
        """Chapter i: reused, executed, or (`trainer`) started beside this thread until only E15's
        runs train; raises BookError where it or the training chapter failed."""
        beside = self.beside
        if beside.get("error"):
            raise self.failed(trainer, beside["error"])
        rec = self.record(i, template)
        if rec is None:
            return
        if template.stem == trainer:
            _beside(beside, lambda: beside.update(error=self.run(template, rec, apart=True)), self.ready)
            if beside.get("error"):
                raise self.failed(trainer, beside["error"])
            if beside["thread"].is_alive():
                log.info(
                    f"  {trainer}: only E15's runs train now; the chapters that read neither them nor other "
                    "chapters' records execute beside it"
                )
            return
        error = self.run(template, rec, reporting=not (beside and beside["thread"].is_alive()))
        if error is not None:
            if beside:
                log.info(f"  {template.stem} failed; waiting for {trainer} to end")
                beside["thread"].join()
            raise self.failed(template.stem, error)

    def no_site(self) -> dict:
        self.manifest["site"] = {"status": "skipped"}
        self.save()
        log.info(
            f"book: {len(self.templates)} chapter(s), no site ({self.manifest['duration_s']:.0f} s; "
            f"manifest {self.path})"
        )
        return self.manifest

    def site(self, ledger: Path | None) -> dict:
        """The site: the chapters executed, then the specs' parts; reused where its inputs are the
        last good build's."""
        out, manifest = self.out, self.manifest
        parts = [
            s.site_part(out, ledger, specs=self.specs) for s in self.specs.values() if s.site_part is not None
        ]
        executed = [
            (EXECUTED / r["name"]).as_posix()
            for r in manifest["notebooks"]
            if r.get("complete") and Path(r["output"]).is_file()
        ]
        toc = site_toc(out, executed, parts)
        pages = [p for part in parts for p in part]
        site_key = short_sha(
            [_file_sha(p) for p in self.staged + pages + [toc]],
            [r.get("output_sha") for r in manifest["notebooks"]],
        )
        html = out / "_build" / "html"
        if (self.prev.get("site") or {}).get("key") == site_key and (html / "index.html").is_file():
            manifest["site"] = {**self.prev["site"], "status": "reused"}
            log.info("site: unchanged, reused")
        else:
            order = [t.stem for t in chapters()]
            shown = [n for n in order if (EXECUTED / n).as_posix() in executed]
            partial = len(shown) < len(order)
            log.info(
                "site: jupyter-book build"
                + (
                    f" of {len(shown)} of the {len(order)} chapters (links to the others left out)"
                    if partial
                    else ""
                )
            )
            manifest["site"] = _build_site(out, toc, partial)
            if manifest["site"]["status"] != "ok":
                self.save()
                raise BookError(
                    f"jupyter-book build failed ({manifest['site']['error']}); see {manifest['site']['log']}"
                )
            manifest["site"]["key"] = site_key
        self.save()
        log.info(f"book: {html / 'index.html'} ({manifest['duration_s']:.0f} s; manifest {self.path})")
        return manifest
