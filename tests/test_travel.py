"""What travels to a GPU lease (docs/gpu.md): the tracked tree plus the kit, at most 16 MiB
today and at most 46 MiB once every slice's results are committed (each slice's budget,
`results_mib` in results/paper-slices.yaml). The device tool refuses a call over 64 MiB;
these limits leave the results room to grow."""

import importlib.util
import subprocess
from pathlib import Path

from mclib.lease import slices

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20
# 40 since 2026-11-27 (32 before): the slice A trained on the stacked path stays under results/ as the record
# of that path beside the A that replaces it. 46 since 2026-11-29: slice A50 (seed 1 to the paper's 50 000
# steps)
# adds a third executed set of chapters 01-04 and 07 beside the two A's; a call still has 18 MiB of room under
# the device tool's 64.
NOW_MIB, ALL_SLICES_MIB = 16, 46


def tracked_mib(under: Path | None = None) -> float:
    where = [str(under.relative_to(ROOT))] if under is not None else []
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", *where], capture_output=True, check=True
    ).stdout
    return (
        sum((ROOT / f).stat().st_size for f in files.decode().split("\0") if f and (ROOT / f).is_file()) / MIB
    )


def kit_ceiling_mib() -> float:
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.KIT_MAX_MIB  # the script fails a kit above it (tests/test_wheelhouse.py builds one)


def results_to_come(ledger: dict, have: dict) -> float:
    """MiB the slices not done will add: a slice that joins others (seeds 2 and 3 in one lease) is
    one way of doing them, so the larger of it and what they would add alone, not both."""
    open_ = {s.name: s for s in ledger["slices"] if not slices.is_done(ledger, s, have)}
    members = {m for s in ledger["slices"] for m in s.joins}
    alone = sum(s.results_mib for n, s in open_.items() if n not in members and not s.joins)
    joint = sum(
        max(s.results_mib, sum(open_[m].results_mib for m in s.joins if m in open_))
        for s in open_.values()
        if s.joins
    )
    return alone + joint


def test_what_travels_fits_today_and_with_every_slice_committed():
    """16 MiB for the tree without the leases' results (the project itself) plus the kit; 46 MiB
    for everything once the slices still to come have added their budgets."""
    tree, kit = tracked_mib(), kit_ceiling_mib()
    ledger = slices.read_ledger()
    done = slices.done(slices.LEDGER.parent, ledger["name"])
    # every lease's results, the newest of each slice and the records kept beside them (an earlier path's A)
    leases = {
        f.parent
        for pattern in ("*/" + slices.STATE, "*/device.json")
        for f in slices.LEDGER.parent.glob(pattern)
    }
    results = sum(tracked_mib(folder) for folder in leases)
    to_come = results_to_come(ledger, done)
    assert tree - results + kit <= NOW_MIB, (
        f"tracked {tree:.1f} MiB less the leases' results "
        f"{results:.1f} + kit {kit:g} MiB is over {NOW_MIB} MiB"
    )
    assert tree + kit + to_come <= ALL_SLICES_MIB, (
        f"tracked {tree:.1f} + kit {kit:g} + the slices to come {to_come:g} MiB is over {ALL_SLICES_MIB} MiB"
    )
    for name, folder in done.items():  # a done slice kept within what the ledger gave it
        planned = next(s for s in ledger["slices"] if s.name == name)
        assert tracked_mib(folder) <= planned.results_mib, (
            f"slice {name}: {tracked_mib(folder):.1f} MiB over its budget"
        )
