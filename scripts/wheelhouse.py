"""A folder of wheels that installs mclib on an offline GPU node which already has a CUDA PyTorch.

    python scripts/wheelhouse.py --python 3.12 --platform manylinux_2_28_x86_64 --out wheelhouse \
        [--have have.txt] [--max-mib 64] [--newest]

Run it on a machine that reaches PyPI; carry the folder to the node and install there with

    pip install --no-index --find-links wheelhouse -e .

pip does the work: `pip download --only-binary=:all: --python-version ... --implementation cp
--platform ...` of pyproject.toml's dependencies, with the node's versions as constraints (-c).
Of what it downloads, the script keeps the wheels that the node lacks: those reached from
mclib's dependencies without passing through a package the node has (read from each wheel's
METADATA, markers evaluated for the node's Python and platform).

What the node has comes from --have (the node's `python3 -m pip list --format=freeze`); by
default scripts/wheelhouse-have.txt, a typical CUDA PyTorch image. Those packages stay out of
the wheelhouse, and so do torch, triton and nvidia-* whatever the list says: the node keeps its
own CUDA PyTorch (the list must name torch). A dependency of mclib that the node has in a version
pyproject.toml refuses (an older transformers, say) stops the script with a one-line error naming
both. The build backend ([build-system] requires: setuptools) is always shipped, resolved without
the node's constraints: pip builds `-e .` in an isolated environment that sees none of the node's
packages. By default three packages are taken in older, smaller releases (SMALLER below).

--platform names the node's platform: `manylinux_2_28_x86_64` (glibc 2.28 or newer) also takes
every older manylinux wheel (pip matches --platform exactly, so the script names each tag down
to manylinux1). manylinux2014_x86_64 is too old for the default list: numpy 2.5 has no wheel for it.

Writes OUT/requirements.txt (name==version of every package the node will install), removes
wheels of earlier runs that this one does not need, and prints a table: package, version, size,
and the total, which must stay under --max-mib (64: what the device tool carries with the
working tree); over it the script ends with a one-line error naming the size.
"""

from __future__ import annotations

import argparse
import datetime
import email.parser
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
    from pip._vendor.packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HAVE = ROOT / "scripts" / "wheelhouse-have.txt"
DEFAULT_PYTHON = "3.12"  # the GPU image's python3 (3.12.3)
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"  # its glibc is newer; numpy 2.5 has no manylinux2014 wheel
MIB = 1024 * 1024
# Older, smaller releases of three packages, within what mclib and its dependencies accept, so that
# the default wheelhouse stays under 64 MiB with room for the checkout beside it (--newest drops
# them; 111 MiB then): scs 3.3 bundles MKL beside OpenBLAS (41 MiB; 3.2.11 is 11.5); cvxpy 1.9 adds
# sparsediffpy (11.6 MiB, OpenBLAS again) and qdldl (1.4), cvxpy 1.8 highspy (3.1); jedi 0.20 (IPython's
# completion, unused by papermill) is 4.7 MiB, 0.19.2 1.5. mclib's baselines solve with Clarabel or
# SCS in every one of these releases (tests/test_baselines.py passes with cvxpy 1.7.5 and scs 3.2.11).
SMALLER = ("scs<3.3", "cvxpy<1.8", "jedi<0.20")


class WheelhouseError(Exception):
    """A one-line message for the user."""


def is_gpu_stack(name: str) -> bool:
    """torch and what comes with a CUDA build: never in the wheelhouse."""
    name = canonicalize_name(name)
    return name in {"torch", "triton"} or name.startswith("nvidia-")


# --- the target ----------------------------------------------------------------------

_MANYLINUX_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_LEGACY_OF = {v: k for k, v in _MANYLINUX_LEGACY.items()}
_LINUX_ARCHES = {"x86_64", "i686", "aarch64", "ppc64le", "s390x", "armv7l", "riscv64"}


def platform_tags(platform: str) -> list[str]:
    """Every platform tag a node of `platform` installs, newest first (pip's --platform values).

    pip matches --platform exactly (it adds only manylinux2010/manylinux1 to manylinux2014 and
    the older macOS releases to a macosx tag), so a manylinux_2_N or musllinux_1_N target is
    spelled out down to the oldest glibc / musl that has wheels."""
    m = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014|manylinux_(\d+)_(\d+))_(\w+)", platform)
    if m and m.group(4) in _LINUX_ARCHES:
        arch = m.group(4)
        major, minor = _MANYLINUX_LEGACY.get(m.group(1)) or (int(m.group(2)), int(m.group(3)))
        if major != 2 or minor < 5:
            raise WheelhouseError(f"unknown platform {platform!r}: manylinux_2_N needs N >= 5")
        tags = []
        for n in range(minor, 4, -1):
            tags.append(f"manylinux_2_{n}_{arch}")
            if (n == 17 and arch != "riscv64") or (n in (12, 5) and arch in ("x86_64", "i686")):
                tags.append(f"{_LEGACY_OF[(2, n)]}_{arch}")
        return tags
    m = re.fullmatch(r"musllinux_1_(\d+)_(\w+)", platform)
    if m and m.group(2) in _LINUX_ARCHES:
        return [f"musllinux_1_{n}_{m.group(2)}" for n in range(int(m.group(1)), 0, -1)]
    if re.fullmatch(r"macosx_\d+_\d+_(x86_64|arm64|universal2|intel)", platform):
        return [platform]  # pip adds the older macOS releases itself
    if platform in {"win_amd64", "win32", "win_arm64"}:
        return [platform]
    raise WheelhouseError(
        f"unknown platform {platform!r} (expected e.g. manylinux2014_x86_64, manylinux_2_28_x86_64, "
        "musllinux_1_2_x86_64, macosx_11_0_arm64, win_amd64)"
    )


def marker_environment(python: str, platform: str) -> dict[str, str]:
    """PEP 508 marker values on the node (pip itself evaluates markers for the Python it runs on)."""
    full = python if python.count(".") == 2 else python + ".0"
    if platform.startswith(("manylinux", "musllinux")):
        system, machine = (
            ("linux", "Linux", "posix"),
            next(a for a in _LINUX_ARCHES if platform.endswith("_" + a)),
        )
    elif platform.startswith("macosx"):
        system, machine = ("darwin", "Darwin", "posix"), platform.rsplit("_", 1)[-1]
    else:
        system, machine = (
            ("win32", "Windows", "nt"),
            {"win_amd64": "AMD64", "win32": "x86", "win_arm64": "ARM64"}[platform],
        )
    return {
        "python_version": ".".join(full.split(".")[:2]),
        "python_full_version": full,
        "implementation_name": "cpython",
        "implementation_version": full,
        "platform_python_implementation": "CPython",
        "sys_platform": system[0],
        "platform_system": system[1],
        "os_name": system[2],
        "platform_machine": machine,
        "platform_release": "",
        "platform_version": "",
        "extra": "",
    }


def check_python(python: str) -> str:
    if not re.fullmatch(r"3\.\d{1,2}(\.\d{1,2})?", python):
        raise WheelhouseError(f"unknown Python version {python!r} (expected e.g. 3.12)")
    return python


# --- what the node has, what the project needs ------------------------------------------


def read_have(path: Path) -> dict[str, str | None]:
    """`name==version` lines (pip list --format=freeze; also `name @ url` or a bare name) ->
    {canonical name: version or None}."""
    if not path.is_file():
        raise WheelhouseError(f"--have file not found: {path}")
    have: dict[str, str | None] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-e "):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+)|@\s*\S+)?", line)
        if not m:
            raise WheelhouseError(f"{path}:{number}: not a `name==version` line: {line!r}")
        if m.group(2):
            try:
                Version(m.group(2))
            except InvalidVersion:
                raise WheelhouseError(f"{path}:{number}: not a version: {m.group(2)!r}") from None
        have[canonicalize_name(m.group(1))] = m.group(2)
    return have


def project_requirements(pyproject: Path) -> tuple[list[Requirement], list[Requirement]]:
    """(the project's dependencies, its build backend's requirements)."""
    data = tomllib.loads(pyproject.read_text())
    deps = [Requirement(r) for r in data["project"].get("dependencies", [])]
    build = [Requirement(r) for r in data.get("build-system", {}).get("requires", ["setuptools"])]
    return deps, build


def applies(req: Requirement, env: dict[str, str], extras=("",)) -> bool:
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras)


def check_node_versions(deps: list[Requirement], have: dict[str, str | None]) -> None:
    """A dependency the node has in a version mclib does not accept, or no torch: one-line error."""
    if "torch" not in have:
        raise WheelhouseError(
            "the node's list names no torch: the wheelhouse never holds torch, so "
            "install the node's CUDA build first and list it (pip list --format=freeze)"
        )
    for req in deps:
        version = have.get(canonicalize_name(req.name))
        if version and not req.specifier.contains(Version(version), prereleases=True):
            raise WheelhouseError(
                f"the node's {req.name} {version} does not satisfy the project's requirement {req} "
                "(pyproject.toml); the wheelhouse never replaces a package the node has"
            )


# --- pip ----------------------------------------------------------------------------------


def pip_target_args(python: str, platforms: list[str]) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for p in platforms:
        args += ["--platform", p]
    return args


def run_pip(args: list[str], what: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        errors = [l.strip() for l in proc.stderr.splitlines() if l.startswith("ERROR:")]
        errors += [l.strip() for l in proc.stderr.splitlines() if l.strip()] or ["(no output)"]
        hint = ""
        if "conflicting dependencies" in errors[0] or "No matching distribution" in errors[0]:
            hint = " (is --platform the node's? a version the node has may have no wheel for it)"
        raise WheelhouseError(f"pip failed to {what}: {errors[0]}{hint}")


def resolve(roots: list[str], constraints: list[str], target: list[str], stage: Path) -> dict[str, dict]:
    """`pip download` of `roots` and everything they need, for the target, into `stage`
    -> {name: {"version", "requires_dist", "path"}}, read from each wheel's METADATA."""
    stage.mkdir(parents=True, exist_ok=True)
    (stage / "roots.txt").write_text("\n".join(roots) + "\n")
    (stage / "constraints.txt").write_text("\n".join(constraints) + "\n")
    run_pip(
        [
            "download",
            "--quiet",
            "--quiet",
            "--dest",
            str(stage / "wheels"),
            *target,
            "-c",
            str(stage / "constraints.txt"),
            "-r",
            str(stage / "roots.txt"),
        ],
        "download the project's dependencies for the node",
    )
    resolved = {}
    for whl in (stage / "wheels").glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            meta_name = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            meta = email.parser.Parser().parsestr(z.read(meta_name).decode("utf-8"), headersonly=True)
        resolved[canonicalize_name(meta["Name"])] = {
            "version": meta["Version"],
            "requires_dist": meta.get_all("Requires-Dist") or [],
            "path": whl,
        }
    return resolved


def walk(
    roots: list[Requirement], resolved: dict[str, dict], skip, env, leaves: frozenset[str] = frozenset()
) -> tuple[dict[str, str], list[Requirement]]:
    """The packages of pip's resolution reached from `roots`, not going through a package for
    which skip(name) is true, nor past one of `leaves` (taken without what it requires)
    -> ({name: version}, requirements that pip did not resolve)."""
    out: dict[str, str] = {}
    missing: list[Requirement] = []
    seen: set[tuple[str, frozenset]] = set()
    queue = list(roots)
    while queue:
        req = queue.pop()
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen or skip(name):
            continue
        seen.add((name, frozenset(req.extras)))
        item = resolved.get(name)
        if item is None:
            missing.append(req)
            continue
        out[name] = item["version"]
        if name in leaves:
            continue
        extras = ("",) + tuple(canonicalize_name(e) for e in req.extras)
        queue += [sub for sub in map(Requirement, item["requires_dist"]) if applies(sub, env, extras)]
    return out, missing


# --- the wheelhouse -----------------------------------------------------------------------


def wheel_table(out: Path, pins: dict[str, str]) -> list[tuple[str, str, int, Path]]:
    """(name, version, bytes, path) of the wheels of `pins` in `out`, biggest first; removes
    any other wheel there (an earlier run's): two versions of one package confuse the node's pip."""
    rows, wanted = [], {(n, Version(v)) for n, v in pins.items()}
    for whl in sorted(out.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(whl.name)
        if (canonicalize_name(name), version) in wanted:
            rows.append((canonicalize_name(name), str(version), whl.stat().st_size, whl))
        else:
            print(f"removed {whl.name} (not part of this wheelhouse)")
            whl.unlink()
    got = {r[0] for r in rows}
    if got != set(pins):
        raise WheelhouseError(f"pip did not download {', '.join(sorted(set(pins) - got))}")
    return sorted(rows, key=lambda r: (-r[2], r[0]))


def print_table(rows) -> int:
    total = sum(r[2] for r in rows)
    w = max([len("package")] + [len(r[0]) for r in rows])
    v = max([len("version")] + [len(r[1]) for r in rows])
    print(f"{'package':<{w}}  {'version':<{v}}  {'size':>9}")
    for name, version, size, _ in rows:
        print(f"{name:<{w}}  {version:<{v}}  {size / MIB:>5.2f} MiB")
    print(f"{'total: ' + str(len(rows)) + ' wheels':<{w + v + 2}}  {total / MIB:>5.2f} MiB")
    return total


# --kit: what a lent GPU machine needs to train and execute the paper book's chapters from the
# checkout (PYTHONPATH=., no install of mclib, so no build backend): papermill and the kernel it
# runs, and myst-nb for its `glue` alone (mclib.book.chapter.glue_all), without the Sphinx stack
# that myst-nb requires for building sites, which the GPU side never does (the site is built on
# the CPU machine). Everything else the chapters import is in the GPU image
# (scripts/wheelhouse-have.txt), tabulate included; jupyter-book, cvxpy and dask stay out. glue
# itself imports docutils (myst_nb.core.loggers), which myst-nb's leaf status would leave out: the
# lease of 2026-11-26 failed its first chapter on it (tests/test_wheelhouse.py checks the closure).
KIT = ["papermill==2.7.0", "ipykernel", "myst-nb", "docutils"]
KIT_LEAVES = frozenset({"myst-nb", "docutils"})
# Left out: the kernel runs without them (ipykernel guards both imports): debugpy serves an
# interactive debugger, jedi (and its parso) tab completion; 6.7 of the kit's 11.2 MiB. The node
# installs the kit with --no-deps, so pip does not ask for them.
KIT_OMIT = frozenset({"debugpy", "jedi", "parso"})
KIT_MAX_MIB = 8.0  # docs/gpu.md: the tracked tree plus the kit travel in at most 16 MiB


def build(
    python: str,
    platform: str,
    out: Path,
    have_file: Path,
    max_mib: float,
    newest: bool = False,
    pyproject: Path = ROOT / "pyproject.toml",
    kit: bool = False,
) -> list[tuple[str, str, int, Path]]:
    python = check_python(python)
    platforms = platform_tags(platform)
    have = read_have(have_file)
    deps, build_reqs = project_requirements(pyproject)
    if kit:
        deps, build_reqs = [Requirement(r) for r in KIT], []
    env = marker_environment(python, platform)
    deps = [r for r in deps if applies(r, env)]
    check_node_versions(deps, have)
    target = pip_target_args(python, platforms)
    # The node's versions, where known, bind what is downloaded; no version of torch exists below
    # 0, so a dependency that pulled torch (a CUDA build: GBs) stops pip instead.
    constraints = sorted(f"{n}=={Version(v).public}" for n, v in have.items() if v and not is_gpu_stack(n))
    constraints.append("torch<0")
    if not newest:
        constraints += [c for c in SMALLER if canonicalize_name(Requirement(c).name) not in have]
    roots = [str(r) for r in deps if not is_gpu_stack(r.name)]
    (out / "requirements.txt").unlink(missing_ok=True)  # written again only if this run succeeds
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        # pip evaluates markers for the Python it runs on: a requirement that only the node's
        # Python has (python_version >= "3.12", say) is added as a root and resolved again.
        for _ in range(3):
            resolved = resolve(roots, constraints, target, Path(tmp) / "run")
            runtime, missing = walk(
                deps,
                resolved,
                lambda n: n in have or is_gpu_stack(n) or (kit and n in KIT_OMIT),
                env,
                KIT_LEAVES if kit else frozenset(),
            )
            if not missing:
                break
            roots += [str(r) for r in missing if str(r) not in roots]
        else:
            raise WheelhouseError(f"pip did not resolve {', '.join(map(str, missing))} for Python {python}")
        # The build backend, resolved apart and unconstrained by the node: pip builds `-e .` in an
        # isolated environment, which sees none of the node's packages.
        built = (
            resolve([str(r) for r in build_reqs], ["torch<0"], target, Path(tmp) / "build")
            if build_reqs
            else {}
        )
        backend, missing = walk(build_reqs, built, is_gpu_stack, env)
        if missing:
            raise WheelhouseError(f"pip did not resolve {', '.join(map(str, missing))} for Python {python}")
        backend = {n: v for n, v in backend.items() if n not in runtime}
        pins = {**backend, **runtime}
        out.mkdir(parents=True, exist_ok=True)
        for name in backend:
            shutil.copy2(built[name]["path"], out)
        for name in runtime:
            shutil.copy2(resolved[name]["path"], out)
    rows = wheel_table(out, pins)
    total = print_table(rows)
    if total > max_mib * MIB:
        raise WheelhouseError(
            f"the wheelhouse is {total / MIB:.1f} MiB, over the {max_mib:g} MiB limit (--max-mib)"
        )
    backend_pins = ", ".join(f"{n}=={v}" for n, v in sorted(backend.items()))
    (out / "requirements.txt").write_text(
        f"# What the node lacks of mclib's dependencies (Python {python}, {platform}, "
        f"the node's list: {have_file.name}).\n"
        f"# Beside them, for pip's build of `-e .` only: {backend_pins or 'nothing'}.\n"
        "# pip install --no-index --find-links wheelhouse -e .    (or: -r wheelhouse/requirements.txt)\n"
        + "".join(f"{n}=={runtime[n]}\n" for n in sorted(runtime))
    )
    return rows


def write_kit_record(kit: Path) -> str:
    """The tree the kit is built from, recorded in it (mclib.core.repo.KIT_RECORD): its revision and
    the hash of its mclib sources. A lease's copy of the tree has no .git; mclib.core.repo.git_revision
    takes the revision from here where the sources that run still hash the same."""
    sys.path.insert(0, str(ROOT))
    from mclib.core.atomic import write_atomic  # noqa: PLC0415 - only --kit reads the checkout's mclib
    from mclib.core.repo import KIT_RECORD, git_revision, mclib_sha  # noqa: PLC0415 - ditto

    record = {
        "git": git_revision(),
        "mclib": mclib_sha(),
        "built": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    write_atomic(kit / KIT_RECORD, json.dumps(record, indent=1) + "\n")
    return f"wrote {kit / KIT_RECORD}: revision {record['git']}, mclib {record['mclib']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--python", default=DEFAULT_PYTHON, help=f"the node's Python, X.Y (default {DEFAULT_PYTHON})"
    )
    ap.add_argument(
        "--platform",
        default=DEFAULT_PLATFORM,
        help=f"the node's platform tag, e.g. manylinux2014_x86_64 (default {DEFAULT_PLATFORM})",
    )
    ap.add_argument("--out", default="wheelhouse", help="the folder of wheels (default ./wheelhouse)")
    ap.add_argument(
        "--have",
        default=str(DEFAULT_HAVE),
        help="the node's `pip list --format=freeze` (default scripts/wheelhouse-have.txt)",
    )
    ap.add_argument("--max-mib", type=float, help="fail above this total size (default 64; with --kit 8)")
    ap.add_argument(
        "--kit",
        action="store_true",
        help="only what a GPU lease needs to train and execute chapters from the checkout "
        f"({', '.join(KIT)}; myst-nb without its Sphinx stack); --max-mib defaults to {KIT_MAX_MIB:g}; "
        "install: pip install --no-index --no-deps DIR/*.whl",
    )
    ap.add_argument(
        "--newest",
        action="store_true",
        help=f"take the newest releases of {', '.join(c.split('<')[0] for c in SMALLER)} too (over 64 MiB)",
    )
    args = ap.parse_args(argv)
    try:
        max_mib = args.max_mib if args.max_mib is not None else KIT_MAX_MIB if args.kit else 64.0
        build(args.python, args.platform, Path(args.out), Path(args.have), max_mib, args.newest, kit=args.kit)
    except WheelhouseError as e:
        print(f"wheelhouse: error: {e}", file=sys.stderr)
        return 1
    if args.kit:
        print(write_kit_record(Path(args.out)))
    print(
        f"wrote {Path(args.out) / 'requirements.txt'}; on the node: "
        + (
            f"pip install --no-index --no-deps {args.out}/*.whl (mclib runs from the checkout)"
            if args.kit
            else f"pip install --no-index --find-links {args.out} -e ."
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
