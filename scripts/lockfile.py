"""requirements.lock: the exact versions of everything mclib needs, read from an environment
that has it installed (the one the book was built with), not resolved afresh.

    /path/to/venv/bin/python scripts/lockfile.py [--extras test] [--out requirements.lock]

Run it with the environment's own interpreter. It walks pyproject.toml's dependencies (and
those of the extras named, `test` by default: the tests, the trackers, nnsight) through each
installed distribution's metadata, markers evaluated for this interpreter, and writes one
`name==version` a line, sorted, atomically. A dependency that is not installed, or installed in
a version pyproject.toml's range refuses, is a one-line error naming it. mclib itself is left
out: install it after the lock with `pip install --no-deps -e .` (README).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tomllib
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# torch's CPU builds (2.13.0+cpu) are on PyTorch's own index, not on PyPI
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


class LockError(RuntimeError):
    """A dependency is missing or out of range; the message is one line."""


def roots(pyproject: Path, extras: list[str]) -> list[Requirement]:
    """pyproject.toml's dependencies plus those of `extras` (an extra naming mclib[x] adds x's)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    out, todo, seen = [Requirement(r) for r in project["dependencies"]], list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise LockError(f"--extras {extra!r}: pyproject.toml has no such extra ({', '.join(optional)})")
        seen.add(extra)
        for line in optional[extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == canonicalize_name(project["name"]):
                todo += sorted(req.extras)
            else:
                out.append(req)
    return out


def closure(reqs: list[Requirement]) -> dict[str, str]:
    """{canonical name: installed version} of `reqs` and everything they need, here."""
    found: dict[str, str] = {}
    todo = [(r, "") for r in reqs]
    done: set[tuple[str, frozenset]] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in done:
            continue
        done.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise LockError(f"{req.name} is not installed in {sys.prefix} (needed as {req})") from None
        if not req.specifier.contains(dist.version, prereleases=True):
            raise LockError(f"{req.name} {dist.version} in {sys.prefix} is outside {req}")
        found[name] = dist.version
        for line in dist.requires or []:
            sub = Requirement(line)
            todo += [(sub, e) for e in (sorted(req.extras) or [""])]
    return found


def render(pins: dict[str, str], extras: list[str]) -> str:
    head = [
        f"# The exact set mclib[{','.join(extras)}] was installed as when the book was built: "
        "scripts/lockfile.py",
        f"# read it from that environment (Python {platform.python_version()}, {sys.platform} "
        f"{platform.machine()}, {datetime.date.today().isoformat()}).",
        "#   pip install -r requirements.lock && pip install --no-deps -e .",
        f"--extra-index-url {TORCH_CPU_INDEX}",
    ]
    return "\n".join(head + [f"{n}=={v}" for n, v in sorted(pins.items())]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--extras", default="test", help="pyproject.toml's extras to include, comma-separated (default test)"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "requirements.lock")
    ap.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    args = ap.parse_args(argv)
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    try:
        pins = closure(roots(args.pyproject, extras))
    except LockError as e:
        print(f"lockfile.py: error: {e}", file=sys.stderr)
        return 1
    tmp = args.out.with_name(f".tmp-{args.out.name}")
    tmp.write_text(render(pins, extras))
    tmp.replace(args.out)
    print(f"wrote {args.out}: {len(pins)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
