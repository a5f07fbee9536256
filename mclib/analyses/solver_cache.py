"""The solvers' results, kept, for `mclib.analyses.comparisons`: a table needs only each
method's `matrix_stats` per matrix. `Solves` holds them keyed by method, `setting` and the
sha256 of the exact matrices and masks, and runs a method only for a key it lacks;
`Solves.save` writes them as one gzipped CSV, which `open_solves` reads (chapter 06 then
solves nothing where its draws match). `SESSION` is the tables' default, what this process
solved.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib
import inspect
import io
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.runs import write_atomic
from .per_matrix import STATS, matrix_stats


class SolverCacheError(ValueError):
    """A solver cache file that cannot be read as one; the message is one line naming the file."""


ABOUT = (
    "n",
    "rank",
    "p_mask",
    "dist",
    "seed",
    "matrices",
)  # the draw a block's matrices are the first rows of
CACHE_COLUMNS = ("method", "setting", *ABOUT, "digest", "index", *STATS)
UNCHANGING = ("workers", "progress")  # a solver's arguments that do not change its answer
NEEDS_CVXPY = ("nuclear_norm_complete", "regularised_nuclear_norm")


def digest(x: np.ndarray, mask: np.ndarray) -> str:
    """sha256 of a batch's exact matrices (float64) and masks (bool), their shape included."""
    x, mask = np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(mask, dtype=bool)
    return hashlib.sha256(str(x.shape).encode() + x.tobytes() + mask.tobytes()).hexdigest()


def setting(func: Callable, kwargs: dict) -> str:
    """'soft_impute(rank=2, decay=0.95, ..., lam=0.0005)': the solver and every argument that
    changes its answer, its defaults included, so that a changed default changes the key."""
    args = {
        k: p.default
        for k, p in inspect.signature(func).parameters.items()
        if p.default is not inspect.Parameter.empty and k not in UNCHANGING
    }
    args.update(kwargs)
    return f"{func.__name__}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def describe(about: dict, rows: int) -> str:
    """'7×7 rank 2, p_mask 0.3, uniform factors, seed 0, 512 matrices' (or 'the first 512 of 1024')."""
    size = (
        f"{rows} matrices"
        if rows == about["matrices"]
        else f"the first {rows} of {about['matrices']} matrices"
    )
    return (
        f"{about['n']}×{about['n']} rank {about['rank']}, p_mask {about['p_mask']:g}, {about['dist']} "
        "factors, "
        f"seed {about['seed']}, {size}"
    )


@dataclasses.dataclass
class Block:
    about: dict  # ABOUT: the draw (`_batch`) whose first rows the method saw
    stats: dict[str, np.ndarray]  # `matrix_stats`, `[rows]` each

    @property
    def rows(self) -> int:
        return len(self.stats["nuclear"])


class Solves:
    """The solvers' per-matrix results (`matrix_stats`), keyed by (method, `setting`, `digest`);
    `get` runs a method only for a key it does not hold. path: the cache file read (None:
    none); the first key it lacks is said in one line (`say`), with why. hint: how to build
    the file. log: say each block solved, with its time. reuse: another `Solves` asked first;
    its hits go to `reused`, not `blocks`, so `save` writes only this one's."""

    def __init__(
        self,
        blocks: dict | None = None,
        path: Path | None = None,
        *,
        note: str = "",
        hint: str = "",
        say: Callable = print,
        log: bool = False,
        reuse: Solves | None = None,
    ):
        self.blocks: dict[tuple[str, str, str], Block] = dict(blocks or {})
        self.read = frozenset(self.blocks)  # the keys read from the file
        self.path, self.note, self.hint, self.say, self.log, self.reuse = path, note, hint, say, log, reuse
        self.solved: list[tuple[str, str, str]] = []
        self.reused: dict[tuple[str, str, str], Block] = {}  # the keys read from `reuse`
        self.told = False

    def get(
        self, method: str, how: tuple[Callable, dict], x: np.ndarray, mask: np.ndarray, about: dict
    ) -> dict[str, np.ndarray]:
        """`matrix_stats` of method how = (func, kwargs), func(x, mask, **kwargs), on x, mask
        `[rows, n, n]`: the first rows of the draw `about` (`_batch`)."""
        func, kwargs = how
        key = self.key(method, how, x, mask)
        if self.reuse is not None and key in self.reuse.blocks:
            self.reused[key] = self.reuse.blocks[key]
            return self.reused[key].stats
        if key not in self.blocks:
            where, why = self._why(key, about, len(x))
            if why and not self.told:
                self.say(f"{where} does not hold what this chapter draws ({why}): solving here")
                self.told = True
            if func.__name__ in NEEDS_CVXPY:
                _need_cvxpy(method, describe(about, len(x)), why, self.hint)
            t = time.perf_counter()
            self.blocks[key] = Block(dict(about), matrix_stats(func(x, mask, **kwargs), x, mask))
            self.solved.append(key)
            if self.log:
                self.say(f"{method}, {describe(about, len(x))}: {time.perf_counter() - t:.1f} s")
        return self.blocks[key].stats

    @staticmethod
    def key(method: str, how: tuple[Callable, dict], x: np.ndarray, mask: np.ndarray) -> tuple[str, str, str]:
        """(method, `setting`, `digest`): what a block is held under."""
        return method, setting(*how), digest(x, mask)

    def _why(self, key: tuple[str, str, str], about: dict, rows: int) -> tuple[Path | None, str]:
        """The file to name for a key held nowhere, and why: `reuse`'s where it has a block of
        the same draw (it was built for it), else this one's (None, "" where none was read)."""
        r = self.reuse
        if r is not None and any(
            k[0] == key[0] and b.about == about and b.rows == rows for k, b in r.blocks.items()
        ):
            return r.path, r.why_not(key, about, rows)
        return (self.path, self.why_not(key, about, rows)) if self.path is not None else (None, "")

    def why_not(self, key: tuple[str, str, str], about: dict, rows: int) -> str:
        """Why the file does not hold `key` for this draw, in a few words."""
        method, how, dig = key
        here = describe(about, rows)
        mine = {k: b for k, b in self.blocks.items() if k in self.read and k[0] == method}
        same = [k for k, b in mine.items() if b.about == about and b.rows == rows]
        if any(k[2] == dig for k in same):
            there = next(k[1] for k in same if k[2] == dig)
            return f"it solved {method} on {here} with {there}, this chapter asks {how}"
        if same:
            return (
                f"its {method} matrices for {here} are other matrices (sha256 {same[0][2][:12]}… there, "
                f"{dig[:12]}… here): the matrices or masks drawn for it changed since the file was built"
            )
        if not mine:
            return f"it has no {method} results"
        nearest = min(
            mine.values(), key=lambda b: sum(b.about[f] != about[f] for f in ABOUT) + (b.rows != rows)
        )
        return (
            f"it has no {method} results for {here}; the nearest it has: "
            f"{describe(nearest.about, nearest.rows)}"
        )

    def frame(self) -> pd.DataFrame:
        """One row per matrix of every block held: CACHE_COLUMNS."""
        parts = [
            pd.DataFrame(
                {"method": m, "setting": how, **b.about, "digest": dig, "index": np.arange(b.rows), **b.stats}
            )
            for (m, how, dig), b in self.blocks.items()
        ]
        if not parts:  # everything read from another file (`reuse`)
            return pd.DataFrame(columns=list(CACHE_COLUMNS))
        return pd.concat(parts, ignore_index=True)[list(CACHE_COLUMNS)]

    def save(self, path: Path, note: str) -> None:
        """Every block held, as one gzipped CSV at `path` (written atomically), whose first line
        is `note` as a comment (what built it, when). Floats are written to round-trip exactly."""

        frame, note = self.frame(), " ".join(note.split())

        def write(tmp: Path) -> None:
            with (
                open(tmp, "wb") as raw,
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
                io.TextIOWrapper(gz, encoding="utf-8", newline="") as f,
            ):
                f.write(f"# {note}\n")
                frame.to_csv(f, index=False, lineterminator="\n")

        write_atomic(Path(path), write)


def _need_cvxpy(method: str, what: str, why: str, hint: str) -> None:
    try:
        importlib.import_module("cvxpy")  # the solvers import it when they first run
    except ImportError:
        raise ModuleNotFoundError(
            f"{method} on {what} needs cvxpy, which is not installed here"
            + (f" ({why})" if why else "")
            + (f"; {hint}" if hint else "")
        ) from None


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


def read_solves(path: Path, *, hint: str = "", say: Callable = print) -> Solves:
    """The `Solves` a cache file holds (`Solves.save`). A file that cannot be read as one:
    SolverCacheError, one line naming the file and what is wrong with it."""
    path = Path(path)
    bad = f"solver cache {path}"
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
            note = f.readline()
            if not note.startswith("# "):
                raise SolverCacheError(
                    f"{bad}: its first line is not the '# ...' note a solver cache starts with"
                )
            # every column as text: the numbers are parsed by Python's float(), which reads back exactly
            # what `save` wrote (pandas' own parser need not, and its precision option is going away)
            table = pd.read_csv(f, dtype=str, keep_default_na=False)
    except SolverCacheError:
        raise
    except (OSError, EOFError, UnicodeDecodeError, ValueError, zlib.error) as e:
        raise SolverCacheError(f"{bad}: unreadable ({_one_line(e)})") from None
    missing = [c for c in CACHE_COLUMNS if c not in table.columns]
    if missing:
        raise SolverCacheError(f"{bad}: no column {', '.join(missing)}")
    for c, kind in (
        ("n", int),
        ("rank", int),
        ("seed", int),
        ("matrices", int),
        ("index", int),
        ("p_mask", float),
        *((c, float) for c in STATS),
    ):
        try:
            table[c] = np.array([kind(v) for v in table[c]], dtype=kind)
        except ValueError:
            table[c] = np.nan
        if not np.isfinite(table[c].to_numpy(dtype=float)).all():
            raise SolverCacheError(f"{bad}: column {c} has a value that is not a finite number")
    blocks = {}
    for (method, how, dig), g in table.groupby(["method", "setting", "digest"], sort=False):
        if not (g["index"].to_numpy() == np.arange(len(g))).all() or (g[list(ABOUT)].nunique() > 1).any():
            raise SolverCacheError(
                f"{bad}: the block of {method} with sha256 {dig[:12]}… is damaged (its rows are "
                "not one draw's matrices 0, 1, 2, ... in order)"
            )
        first = g.iloc[0]
        about = {
            "n": int(first.n),
            "rank": int(first["rank"]),
            "p_mask": float(first.p_mask),
            "dist": str(first.dist),
            "seed": int(first.seed),
            "matrices": int(first.matrices),
        }
        blocks[(method, how, dig)] = Block(about, {s: g[s].to_numpy(dtype=float) for s in STATS})
    return Solves(blocks, path, note=note[2:].strip(), hint=hint, say=say)


_OPEN: dict[tuple, Solves] = {}


def open_solves(path: Path, *, hint: str = "", say: Callable = print, reuse: Path | None = None) -> Solves:
    """The solver results a chapter reads from `path`, read once per process (and version of
    the file; none there: solved here), each file said in one line. reuse: another cache
    file, asked first (`Solves`). A damaged file: SolverCacheError."""
    path = Path(path)

    def stamp(p: Path):
        return (
            (str(p.resolve()), p.stat().st_mtime_ns, p.stat().st_size)
            if p.is_file()
            else (str(p.resolve()), None)
        )

    reuse = (
        Path(reuse)
        if reuse is not None and Path(reuse).is_file() and stamp(Path(reuse)) != stamp(path)
        else None
    )
    key = (stamp(path), stamp(reuse) if reuse is not None else None)
    if key not in _OPEN:
        other = read_solves(reuse, say=say) if reuse is not None else None
        if key[0][1] is None:
            rest = (
                f"what {reuse} does not hold is solved here" if other is not None else "the solvers run here"
            )
            say(f"No solver cache at {path}: {rest}" + (f" ({hint})" if hint else ""))
            _OPEN[key] = Solves(
                hint=f"there is no solver cache at {path}" + (f"; {hint}" if hint else ""),
                say=say,
                reuse=other,
            )
        else:
            s = _OPEN[key] = read_solves(path, hint=hint, say=say)
            s.reuse = other
            say(
                f"Solver results read from {path} ({s.note}): {len(s.blocks)} blocks, "
                f"{sum(b.rows for b in s.blocks.values()):,} matrices"
            )
        if other is not None:
            say(
                f"Solver results read first from {reuse} where it holds the same matrices, masks and "
                "solver settings "
                f"({other.note}): {len(other.blocks)} blocks, "
                f"{sum(b.rows for b in other.blocks.values()):,} matrices"
            )
    return _OPEN[key]


SESSION = Solves()  # the tables' default: what this process solved, shared (E16 at the training p_mask and
#                     `classical_table` see the same matrices and solve them once)
