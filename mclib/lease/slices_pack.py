"""What a lease sends back and where it is filed: results.tgz packed from a slice's work folder
(`collect`: its runs' small files and executed chapters; the logs' tails; how its runs ended;
or, where no slice started, why: `pack_refused`), and, back on the CPU machine, `merge`, which
files it under results/."""

from __future__ import annotations

import datetime
import gzip
import json
import logging
import shutil
import tarfile
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from ..analyses.freezing import freeze_ends
from ..core.checkpoints import saved_steps
from ..core.config import Profile
from ..core.ending import run_end
from ..core.repo import commit, git_revision, mclib_sha, revisions_of_mclib, tree_mclib_sha
from ..core.runs import END, FREEZE, FREEZE_SOURCE, METRICS, PROFILE, freeze_dir, run_name, write_atomic
from ..core.step import STEP_RAN
from . import steptable
from .slices import (
    LEDGER,
    LOG_TAIL_KIB,
    LOGS,
    METRICS_GZ,
    REFUSED,
    RESULTS_TGZ,
    RETURN_MIB,
    RUN_FILES,
    STATE,
    STEP_TABLE,
    SliceError,
    done,
    is_done,
    read_ledger,
)

log = logging.getLogger(__name__)


def _read(what: str, read):
    """`read()`, or, where it raises (a run damaged by a kill), the error in one line: the rest is
    packed all the same."""
    try:
        return read()
    except Exception as e:
        log.warning(f"slice: {what} not read: {type(e).__name__}: {e}")
        return f"not read: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"


def pack_refused(out_dir: Path, dest: Path) -> Path:
    """results.tgz for a lease that started no slice: slice.json with `slice` null and `refused`
    (REFUSED's line, or why there is none), the step table and the logs' tails the work folder holds."""
    out_dir = Path(out_dir)
    why = (
        (out_dir / REFUSED).read_text().strip()
        if (out_dir / REFUSED).is_file()
        else f"no {STATE} in {out_dir}: `slice start` was not issued here, or ended before it started a slice"
    )
    log.warning(f"lease: no slice to finish: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "slice"
        folder.mkdir()
        record = {
            "slice": None,
            "refused": why,
            **device_record(),
            "date": datetime.date.today().isoformat(),
            "logs": _copy_logs(out_dir, folder),
        }
        (folder / STATE).write_text(json.dumps(record, indent=1))
        return _pack_into(folder, dest)


def refuse(out_dir: Path, why: str) -> None:
    """Write why no slice starts in this work folder (REFUSED), for `finish` to pack."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / REFUSED, why.strip() + "\n")


def _copy_logs(out_dir: Path, folder: Path) -> list[str]:
    """The step table and the tails (LOG_TAIL_KIB) of the lease's logs in `out_dir`, into `folder`;
    their names. A log cut to its tail says so in its first line."""
    names = []
    if (out_dir / STEP_TABLE).is_file():
        shutil.copy2(out_dir / STEP_TABLE, folder / STEP_TABLE)
        names.append(STEP_TABLE)
    for name in LOGS:
        src = out_dir / name
        if not src.is_file():
            continue
        size = src.stat().st_size
        with open(src, "rb") as f:
            f.seek(max(0, size - LOG_TAIL_KIB * 1024))
            tail = f.read()
        head = (
            f"[the last {LOG_TAIL_KIB} KiB of {size / 1024:.0f} KiB]\n".encode() if size > len(tail) else b""
        )
        (folder / name).write_bytes(head + tail)
        names.append(name)
    return names


def _steps_ran(out_dir: Path, profile: Profile, seeds: list[int]) -> dict:
    """{seed: the run's STEP_RAN (the step variant that ran, and why it fell back)}; None where none."""
    ran = {}
    for seed in seeds:
        f = out_dir / "runs" / run_name(profile.name, seed) / STEP_RAN
        ran[str(seed)] = json.loads(f.read_text()) if f.is_file() else None
    return ran


def _pack_into(folder: Path, dest: Path) -> Path:
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / RESULTS_TGZ
    record = json.loads((folder / STATE).read_text())
    left_out = []
    write_atomic(path, lambda tmp: left_out.extend(_pack(folder, tmp)))  # a cut pack never reads as whole
    what = f"slice {record['slice']}" if record.get("slice") else "lease (no slice)"
    log.info(
        f"{what}: packed {path} ({path.stat().st_size / 2**20:.1f} MiB)"
        + (f"; left out (over {RETURN_MIB} MiB): {', '.join(left_out)}" if left_out else "")
    )
    return path


# --- what a lease sends back: the results folder ---------------------------------------------


def device_record() -> dict:
    """What ran it: the GPU's name, torch and CUDA versions, the date, the revision of the tree
    (`git_revision`: git's where the tree is its own repository, else the kit's record) and the
    hash of its mclib sources, which identifies the code however the revision was known."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {
        "device": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%d"),
        "git": git_revision(),
        "mclib": mclib_sha(),
    }


def collect(out: str | Path, dest: str | Path, name: str = "paper", seeds=(1, 2, 3)) -> Path:
    """Copy the small files of a built book in `out` (its runs/ and book/_executed/) to
    `dest`: everything results/ holds, never a checkpoint."""
    out, dest = Path(out), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "device.json").write_text(json.dumps(device_record(), indent=1))
    for seed in seeds:
        src = out / "runs" / run_name(name, seed)
        if not src.is_dir():
            continue
        _copy_run(src, dest / "runs" / src.name, RUN_FILES)
        for group in sorted((src / FREEZE).glob("*")) if (src / FREEZE).is_dir() else []:
            _copy_run(group, freeze_dir(dest / "runs" / src.name, group.name), (END, PROFILE, FREEZE_SOURCE))
    executed = out / "book" / "_executed"
    if executed.is_dir():
        (dest / "book").mkdir(exist_ok=True)
        for f in sorted(executed.glob("*.ipynb")) + [executed / "manifest.json"]:
            if f.is_file():
                shutil.copy2(f, dest / "book" / f.name)
    return dest


def _copy_run(src: Path, dest: Path, files) -> None:
    """A run's metrics (gzipped, written whole, then renamed: a cut copy never reads as
    complete) and its small `files`, into `dest`."""
    if (src / METRICS).is_file():
        dest.mkdir(parents=True, exist_ok=True)
        write_atomic(dest / METRICS_GZ, gzip.compress((src / METRICS).read_bytes()))
    for f in files:
        if (src / f).is_file():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / f, dest / f)


def _ends(out_dir: Path, profile: Profile, seeds: list[int]) -> dict:
    ends = {}
    for seed in seeds:
        run = out_dir / "runs" / run_name(profile.name, seed)
        ends[str(seed)] = run_end(run).__dict__ if saved_steps(run) else None
    return ends


def _freeze_ends(out_dir: Path, profile: Profile, groups: list[str]) -> dict:
    """{group: how its E15 run ended (`mclib.analyses.freezing.freeze_end`, as a dict)} for
    the slice's E15 runs; None for a group that saved nothing."""

    if not groups:
        return {}
    run = out_dir / "runs" / run_name(profile.name, profile.seed)
    ends = freeze_ends(profile, run, tuple(groups)) if saved_steps(run) else {}
    return {g: asdict(ends[g]) if g in ends and ends[g].steps else None for g in groups}


def _pack(folder: Path, path: Path) -> list[str]:
    """tar.gz of `folder` at `path`, leaving out the largest executed chapters until it is
    under RETURN_MIB; returns what was left out (named in slice.json too)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    left: list[str] = []
    while True:
        with tarfile.open(path, "w:gz") as tar:
            for f in files:
                if f.relative_to(folder).as_posix() not in left:
                    tar.add(f, arcname=f.relative_to(folder).as_posix())
        if path.stat().st_size <= RETURN_MIB * 2**20:
            return left
        notebooks = sorted(
            (f for f in files if f.suffix == ".ipynb" and f.relative_to(folder).as_posix() not in left),
            key=lambda f: f.stat().st_size,
        )
        if not notebooks:
            raise SliceError(
                f"{path.name} is {path.stat().st_size / 2**20:.1f} MiB without any chapter, over {RETURN_MIB}"
            )
        left.append(notebooks[-1].relative_to(folder).as_posix())
        record = json.loads((folder / STATE).read_text())
        record["left_out"] = left
        (folder / STATE).write_text(json.dumps(record, indent=1))


# --- on the CPU machine ----------------------------------------------------------------------


def merge(
    tgz: Path, root: Path = LEDGER.parent, ledger_path: Path = LEDGER, revision: str | None = None
) -> Path | None:
    """File a lease's results.tgz under results/paper-SLICE-DEVICE-DATE/; a slice not open in the
    ledger, another profile or precision, a revision whose mclib sources are not the ones that ran
    (`true_revision`; `revision`: given by hand), or over its results_mib is merged with a note, kept
    in slice.json; files left out on the machine are named. A full step table in it is committed
    (`steptable.adopt`). A lease that started no slice files only that table and says why (None)."""
    ledger = read_ledger(ledger_path)
    have = done(root, ledger["name"])  # before this one is filed
    open_slices = [s.name for s in ledger["slices"] if not is_done(ledger, s, have)]
    with tarfile.open(tgz) as tar:
        member = next((m for m in tar.getmembers() if m.name.removeprefix("./") == STATE), None)
        if member is None:
            raise SliceError(f"{tgz}: no {STATE} at its top: not a slice's results.tgz")
        record = json.loads(tar.extractfile(member).read())
        if record.get("slice") is None:  # a lease that started no slice: its step table alone is kept
            with tempfile.TemporaryDirectory() as tmp:
                tar.extractall(tmp, filter="data")
                adopted = steptable.adopt(Path(tmp) / STEP_TABLE, root / steptable.COMMITTED)
            log.info(
                f"slice merge: the lease started no slice: {record.get('refused')}"
                + (f"; {adopted}" if adopted else "")
            )
            return None
        dest = (
            root
            / f"{record['profile']}-{record['slice']}-{record['device'].replace(' ', '-')}-{record['date']}"
        )
        tar.extractall(dest, filter="data")
    notes = []
    if record["profile"] != ledger["name"]:
        notes.append(f"profile {record['profile']!r}, the ledger's is {ledger['name']!r}")
    if record["slice"] not in open_slices:
        notes.append(
            f"slice {record['slice']} was not open in the ledger (open: {', '.join(open_slices) or 'none'})"
        )
    if record.get("precision") != ledger["precision"]:
        notes.append(f"trained in {record.get('precision')}, the ledger's precision is {ledger['precision']}")
    ran = record.get("mclib") or _manifest(dest).get("mclib")
    revision, why = true_revision(record.get("git") or "unknown", ran, given=revision)
    if why:
        notes.append(why)
        _set_revision(dest, record, revision)
    if ran:
        here = mclib_sha()
        log.info(
            f"slice merge: the lease ran mclib {ran}; this checkout's is "
            + ("the same" if ran == here else f"{here}: the library changed since")
        )
    planned = next((s for s in ledger["slices"] if s.name == record["slice"]), None)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file()) / 2**20
    if planned is not None and size > planned.results_mib:
        notes.append(
            f"{size:.1f} MiB under results/, over the slice's budget of {planned.results_mib:g} MiB "
            "(results_mib; what travels to a lease must stay under 46 MiB)"
        )
    for n in notes + [f"left out on the machine: {f}" for f in record.get("left_out", [])]:
        log.info(f"slice merge: note: {n}")
    adopted = steptable.adopt(dest / STEP_TABLE, root / steptable.COMMITTED)
    if adopted:
        log.info(f"slice merge: {adopted}")
    record["merge_notes"] = notes
    write_atomic(dest / STATE, json.dumps(record, indent=1))
    log.info(f"slice {record['slice']}: merged into {dest}")
    return dest


def _manifest(dest: Path) -> dict:
    f = Path(dest) / "book" / "manifest.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def true_revision(recorded: str, ran: str | None, given: str | None = None) -> tuple[str, str | None]:
    """(the revision of the code a lease ran, a note where it is not the one it recorded). `ran`: the
    hash of the mclib sources that ran (its record's, or its chapters' manifest's). The recorded
    revision stands where it is a commit of this repository whose sources hash to `ran`; `given`
    stands where its sources do; otherwise "unknown", with the commits whose sources match named."""
    if given is not None:
        found = commit(given)
        if found is None:
            raise SliceError(f"--revision {given!r} is not a commit of this repository")
        if ran and tree_mclib_sha(found) != ran:
            raise SliceError(
                f"--revision {given}: its mclib sources hash to {tree_mclib_sha(found)}, the lease ran {ran}"
            )
        return found, (
            f"revision {found}, given to merge: the lease recorded {recorded}, and {found}'s mclib "
            f"sources hash to the {ran} that ran"
            if ran
            else f"revision {found}, given to merge: the lease recorded {recorded} "
            "and no mclib hash to check it by"
        )
    own = commit(recorded) if recorded != "unknown" else None
    if own is not None and (ran is None or tree_mclib_sha(own) == ran):
        return recorded, None
    if recorded == "unknown":
        why = "the lease could not tell its revision"
    elif own is None:
        why = (
            f"the lease recorded revision {recorded}, not a commit of this repository "
            "(git answered for a folder above the tree)"
        )
    else:
        why = f"the lease recorded revision {recorded}, whose mclib sources are not the ones that ran"
    matches = revisions_of_mclib(ran) if ran else []
    found = (
        f"; its mclib sources ({ran}) are those of {', '.join(matches)} "
        "(give the one that ran with --revision)"
        if matches
        else f"; no recent commit has its mclib sources ({ran})"
        if ran
        else ""
    )
    return "unknown", why + found + ": revision unknown"


def _set_revision(dest: Path, record: dict, revision: str) -> None:
    """Write `revision` wherever the lease's files named the one it recorded (slice.json keeps that
    one as git_recorded): device.json, the chapters' manifest, the step table."""
    recorded = record.get("git")
    record["git_recorded"], record["git"] = recorded, revision
    for name in ("device.json", "book/manifest.json"):
        f = Path(dest) / name
        if f.is_file():
            data = json.loads(f.read_text())
            data["git"] = revision
            for nb in data.get("notebooks", []):
                if nb.get("git") == recorded:
                    nb["git"] = revision
            write_atomic(f, json.dumps(data, indent=1))
    table = Path(dest) / STEP_TABLE
    if table.is_file():
        t = pd.read_csv(table)
        if "git" in t.columns:
            t["git"] = t["git"].astype(str).where(t["git"].astype(str) != str(recorded), revision)
            write_atomic(table, lambda out: t.to_csv(out, index=False))
