"""Command line: `python -m mclib train --profile cpu`, `python -m mclib book --profile cpu` (see README);
installed, the same as `mclib train ...`.

One way to set a parameter: `--profile NAME|FILE.yaml` picks the profile, `--set KEY=VALUE`
(repeatable) changes one of its keys (`train.lr=1e-3`; the value read as YAML) and `--out`
says where a command writes, on every command that has them. `--params` and `--out-dir`,
their older spellings, still work and say so on stderr."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import __version__
from .book import runner  # light: papermill and nbformat are imported when a chapter runs
from .chapters.registry import specs
from .core.config import ConfigError, load_profile, parse_setting, profile_path
from .core.console import console_logging
from .core.ending import DivergedError
from .core.export import check_export, export_run, viewing
from .core.jobs import ENV, ClusterError
from .core.repo import CheckoutError, require_checkout
from .core.runs import LOSS_CURVE, default_run_dir, load_metrics


def cmd_train(args) -> None:
    from .book.plots_curves import run_loss_curve  # noqa: PLC0415 - matplotlib: --help stays light
    from .core.ending import run_end  # noqa: PLC0415 - the model stack: --help stays light
    from .core.train import train  # noqa: PLC0415 - the model stack: --help stays light

    overrides = dict(args.set)
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    profile = load_profile(profile_path(args.profile), overrides_from="--set", **overrides)
    run_dir = Path(args.out) if args.out else default_run_dir(profile)
    train(profile, run_dir, progress=not args.quiet)
    metrics = load_metrics(run_dir)
    fig, drop = run_loss_curve(metrics, profile)
    fig.savefig(run_dir / LOSS_CURVE, dpi=120)
    last = metrics.iloc[-1]
    print(
        f"{run_dir}: step {int(last.step)}, L_obs {last.L_obs:.2e}, L_mask {last.L_mask:.4f}, "
        f"drop {'at step ' + str(drop) if drop else 'not reached'}, {run_end(run_dir).text}; "
        f"plot: {run_dir / LOSS_CURVE}"
    )


def cmd_book(args) -> None:
    if args.cluster:
        os.environ[ENV] = args.cluster  # the chapters' kernels inherit it (mclib.core.jobs.cluster reads it)

    runner.build(
        args.profile,
        seed=args.seed,
        out_dir=args.out,
        run_dir=args.run_dir,
        device=args.device,
        timeout=args.timeout,
        progress=not args.quiet,
        templates=runner.select_chapters(args.chapters) if args.chapters else None,
        site=not args.no_site,
        overrides=dict(args.set),
        specs=specs(),
    )  # what the chapters declare, handed down to the runner (the rooms: README)


# mclib.core.export.TRACKERS, named here so that `--help` imports no plotting (tests/test_export.py
# checks that the two agree)
TRACKERS = ("tensorboard", "wandb")
CLUSTER_HELP = (
    "where several runs train: tcp://HOST:8786 (a running Dask scheduler), a jobqueue YAML "
    "(SLURM, PBS: README), or 'local' (default: $MCLIB_CLUSTER, else worker processes on this machine)"
)


def cmd_sweep(args) -> int:
    from .core.sweep import run_sweep  # noqa: PLC0415 - huggingface_hub: --help stays light

    return (
        1
        if run_sweep(
            args.file,
            cluster=args.cluster,
            runs=args.runs,
            results=args.results,
            figure=args.figure,
            threads=args.threads,
            progress_every=args.progress_every,
        )
        else 0
    )


def cmd_slice(args) -> int:
    from .lease import slices, slices_pack, slices_run  # noqa: PLC0415 - the model stack: --help stays light

    require_checkout("`slice` (the GPU lease's ledger results/paper-slices.yaml, the book)")

    ledger = Path(args.ledger) if args.ledger else slices.LEDGER
    if args.action in ("start", "run"):
        try:
            slices_run.start(
                args.out,
                budget_s=args.budget_s,
                hold_s=args.hold_s,
                ledger_path=ledger,
                began=args.began,
                command_s=args.command_s,
            )
        except slices.SliceError as e:
            slices_pack.refuse(args.out, str(e))  # `finish` packs why
            raise
    if args.action in ("finish", "run"):
        slices_run.finish(
            args.out,
            args.dest,
            chapters_s=args.chapters_s,
            left_s=args.left_s,
            began=args.began,
            command_s=args.command_s,
            specs=specs(),
        )
    if args.action == "merge":
        if not args.file:
            raise slices.SliceError("slice merge needs the results.tgz a lease sent back")
        slices_pack.merge(Path(args.file), root=ledger.parent, ledger_path=ledger, revision=args.revision)
    if args.action == "status":
        print(slices.status(ledger, device=args.device))
    return 0


def cmd_solvers(args) -> None:
    if not args.out:
        require_checkout("`solvers` without --out (it writes results/solvers-PROFILE.csv.gz there)")
    from .chapters.ch06_baselines import build_solver_cache  # noqa: PLC0415 - the model stack, matplotlib

    build_solver_cache(
        load_profile(profile_path(args.profile), overrides_from="--set", **dict(args.set)), args.out
    )


def cmd_export(args) -> None:
    check_export(args.run_dir, args.to)  # refused in one line before the figure is drawn
    from .book.plots_curves import loss_curve_image  # noqa: PLC0415 - matplotlib: --help stays light

    dest = export_run(
        args.run_dir, args.to, args.out, project=args.project, image=loss_curve_image(args.run_dir)
    )
    print(
        f"{args.run_dir} exported to {args.to} in {dest}; {'view' if args.to == 'tensorboard' else 'upload'} "
        f"it with: {viewing(dest, args.to)}"
    )


class _Alias(argparse.Action):
    """An older spelling of an option (`new`): stores into the same place and says, on
    stderr, in one line, which option it stands for."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"mclib: note: {option_string} is an alias of {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _setting(text: str) -> tuple:
    try:
        return parse_setting(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def profile_args(p: argparse.ArgumentParser, default: str) -> None:
    """--profile (and its older spelling --params) and --set, on every command that reads a profile."""
    p.add_argument(
        "--profile",
        default=default,
        help=f"profile name (params/NAME.yaml) or a YAML path (default {default})",
    )
    p.add_argument("--params", dest="profile", action=_Alias, new="--profile")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=_setting,
        metavar="KEY=VALUE",
        help="set one key of the profile, e.g. --set train.lr=1e-3 (repeatable; the value is read as YAML)",
    )


def out_arg(p: argparse.ArgumentParser, help: str, **kwargs) -> None:
    """--out (and its older spelling --out-dir): where the command writes."""
    p.add_argument("--out", help=help, **kwargs)
    p.add_argument("--out-dir", dest="out", action=_Alias, new="--out")


def train_args(p: argparse.ArgumentParser) -> None:
    profile_args(p, "cpu")
    out_arg(p, "run folder (default runs/<profile>-seed<seed>); rerun to resume")
    p.add_argument("--seed", type=int, help="the profile's seed (the same as --set seed=SEED)")
    p.add_argument("--steps", type=int, help="train.steps (the same as --set train.steps=STEPS)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def book_args(p: argparse.ArgumentParser) -> None:
    profile_args(p, "cpu")
    p.add_argument("--seed", type=int, help="the profile's seed (the same as --set seed=SEED)")
    out_arg(p, "where book/_executed/, _build/html/ and runs/ go (default: the repository)")
    p.add_argument("--run-dir", help="the run the chapters use (default OUT/runs/<profile>-seed<seed>)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), help="default: the profile's train.device")
    p.add_argument("--timeout", type=float, help="seconds a notebook cell may run (default: no limit)")
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress: neither papermill's cell bar nor the training runs' steps",
    )
    p.add_argument("--cluster", help=CLUSTER_HELP)
    p.add_argument(
        "--chapters",
        help="only these chapters, comma-separated (e.g. 01_train,03_heads; default every one "
        "of _toc.yml); the others keep their last executed copies",
    )
    p.add_argument("--no-site", action="store_true", help="execute the chapters, do not build the HTML site")


def sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a sweep file (sweeps/*.yaml; its format: mclib/core/sweep.py)")
    p.add_argument(
        "--cluster", help=CLUSTER_HELP + " (default: the sweep file's `cluster`, else this machine)"
    )
    p.add_argument("--runs", default="runs/sweep", help="where the run folders go (default runs/sweep)")
    p.add_argument(
        "--results", help="the results table, CSV; rows are appended (default RUNS/<file stem>.csv)"
    )
    p.add_argument("--figure", help="the figure, PNG (default RUNS/<file stem>.png)")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads a run (default: the sweep's `threads`, else the base "
        "profile's train.threads, else 1)",
    )
    p.add_argument(
        "--progress-every", type=float, default=30.0, help="seconds between progress lines (default 30)"
    )


def slice_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        nargs="?",
        default="run",
        choices=("run", "start", "finish", "merge", "status"),
        help="run (default): start and finish the next slice in one command; start: refuse it if it "
        "cannot fit, else train it detached; finish: wait, execute its chapters, pack results.tgz; "
        "merge FILE: file a lease's results.tgz under results/; status: the ledger",
    )
    p.add_argument("file", nargs="?", help="merge: the results.tgz")
    p.add_argument(
        "--revision",
        help="merge: the revision the lease ran, where it recorded a wrong or no one; "
        "accepted only where its mclib sources hash to the ones that ran",
    )
    out_arg(p, "the work folder on the GPU machine (default slice-work)", default="slice-work")
    p.add_argument(
        "--dest", default="kit-out", help="finish: where results.tgz goes (default kit-out; a lease: $OUT)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        help="start: device seconds left for the slice from now (default: the "
        "ledger's lease less the machine's start and the return)",
    )
    p.add_argument(
        "--left-s",
        type=float,
        help="finish: device seconds left on the lease as this command began (default: start's budget)",
    )
    p.add_argument(
        "--began",
        type=float,
        help="start, finish: when this command began (seconds since the epoch; "
        "default now): it ends before the command limit",
    )
    p.add_argument(
        "--command-s", type=float, help="start, finish: the command limit (default the device's, 600 s)"
    )
    p.add_argument(
        "--hold-s", type=float, default=0.0, help="start: keep this command this long while training runs"
    )
    p.add_argument(
        "--chapters-s",
        type=float,
        help="finish issued again (a chapter failed, a fix travelled): seconds "
        "from now for the chapters not yet executed",
    )
    p.add_argument(
        "--ledger", help="the slice plan (default results/paper-slices.yaml; done slices: folders beside it)"
    )
    p.add_argument(
        "--device",
        help="status: plan with this device kind's committed step table (default the ledger's "
        "`device`, the kind lent now: NVIDIA H200)",
    )


def solvers_args(p: argparse.ArgumentParser) -> None:
    profile_args(p, "paper")
    out_arg(p, "the file (default results/solvers-<profile>.csv.gz)")


def export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run folder (runs/NAME-seedS)")
    p.add_argument("--to", required=True, choices=TRACKERS, help="the tracker")
    out_arg(p, "where the export goes (default RUN_DIR/export/TRACKER; an earlier one is replaced)")
    p.add_argument("--project", help="the W&B project `wandb sync` puts the run in (default mclib)")


# the sub-commands, in the order `--help` lists them: name -> (help, its arguments, what it does)
COMMANDS = {
    "train": ("train (or resume) a profile", train_args, cmd_train),
    "book": ("execute the chapters (training first) and build the HTML book", book_args, cmd_book),
    "sweep": (
        "train profile overrides x seeds on a Dask cluster; a results table and a figure",
        sweep_args,
        cmd_sweep,
    ),
    "slice": ("the paper book on a GPU lease, one slice at a time (docs/gpu.md)", slice_args, cmd_slice),
    "solvers": (
        "chapter 06's solver results for a profile, solved here and saved for the chapter (a GPU lease "
        "has no cvxpy): results/solvers-PROFILE.csv.gz",
        solvers_args,
        cmd_solvers,
    ),
    "export": (
        "a run's metrics and loss curve to TensorBoard event files or an offline W&B run (the optional "
        "extra 'track')",
        export_args,
        cmd_export,
    ),
}


def parser() -> argparse.ArgumentParser:
    """`python -m mclib`'s arguments: a sub-parser for each of `COMMANDS`."""
    prog = "mclib" if Path(sys.argv[0]).name == "mclib" else "python -m mclib"  # the console script, or -m
    top = argparse.ArgumentParser(prog=prog, description=__doc__)
    top.add_argument("--version", action="version", version=f"mclib {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    for name, (summary, add_args, func) in COMMANDS.items():
        p = sub.add_parser(name, help=summary)
        add_args(p)
        p.set_defaults(func=func)
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    with console_logging():  # the library's lines, as it logs them: INFO on stdout, warnings on stderr
        return _run(args)


def _run(args) -> int:
    try:
        status = args.func(args)
    except (ConfigError, ClusterError, CheckoutError) as e:
        print(f"mclib: error: {e}", file=sys.stderr)
        return 2
    except (runner.BookError, DivergedError) as e:
        print(f"mclib: error: {e}", file=sys.stderr)
        return 1
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
