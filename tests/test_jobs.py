"""mclib.core.jobs and the sweep command on Dask: the local cluster, a real scheduler and two real
workers on 127.0.0.1 (started here, as separate processes), a worker killed mid-run, an
unreachable scheduler, bad sweep and jobqueue files. Every process a test starts is
stopped by that test (its process group, in a finally)."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from mclib.__main__ import main
from mclib.core.checkpoints import load_checkpoint, saved_steps
from mclib.core.config import ConfigError
from mclib.core.jobs import ClusterError, cluster, jobqueue_spec, local_workers, resources_for
from mclib.core.runs import load_metrics
from mclib.core.sweep import load_sweep
from mclib.core.train import train, train_seed

LOSS_COLS = ["step", "L", "L_obs", "L_mask", "mask_value", "eval_L", "eval_L_mask"]
REPO = Path(__file__).resolve().parent.parent
DASK = (
    str(Path(sys.executable).parent / "dask") if (Path(sys.executable).parent / "dask").is_file() else "dask"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """A process in its own process group (so that killing the group ends its children)."""
    with open(log, "w") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@contextlib.contextmanager
def dask_processes(tmp: Path, workers: int = 2):
    """A `dask scheduler` and `workers` `dask worker` processes (one thread each, no
    dashboard) on 127.0.0.1; yields (address, {worker name: Popen}). Stops them all."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["scheduler"] = _start(
            [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            tmp / "scheduler.log",
        )
        for i in range(workers):
            procs[f"w{i}"] = _start(
                [
                    DASK,
                    "worker",
                    address,
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--host",
                    "127.0.0.1",
                    "--name",
                    f"w{i}",
                ],
                tmp / f"w{i}.log",
            )
        with cluster(address, connect_timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
        yield address, procs
    finally:
        for proc in procs.values():
            _stop(proc)


def _sweep_file(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


SMOKE_SWEEP = """\
    base: smoke
    seeds: [1, 2]
    settings:
      - {name: base, overrides: {}}
      - {name: lr2e-3, overrides: {train.lr: 2.0e-3}}
"""


# --- fast: no process ------------------------------------------------------------------------


def test_local_workers_and_gpu_resource(smoke_profile):
    cores = len(os.sched_getaffinity(0))
    assert local_workers(1) == cores and local_workers(0) == 1 and local_workers(2 * cores) == 1
    assert local_workers(1, gpu=True) == 1  # a GPU run has the whole device
    assert resources_for(smoke_profile.replace(**{"train.device": "cpu"})) is None
    assert resources_for(smoke_profile.replace(**{"train.device": "cuda"})) == {"GPU": 1}


def test_unreachable_scheduler_is_one_line_naming_it_within_the_timeout():
    importlib.import_module(
        "distributed"
    )  # before the clock starts: the test times the connect, not the import

    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(ClusterError) as e:
        with cluster(address, connect_timeout=1):
            pass
    assert time.monotonic() - start < 10
    assert address in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "body, key",
    [
        ("base: smoke\nsetings: []\n", "setings"),
        ("base: smoke\nsettings:\n  - {name: a, overides: {}}\n", "overides"),
        ("base: smoke\nsettings:\n  - {name: a, overrides: {train.lrr: 1.0}}\n", "train.lrr"),
        ("base: smoke\nsettings:\n  - {name: a, overrides: {trian.lr: 1.0}}\n", "trian"),
        ("base: smoke\nseeds: one\nsettings:\n  - {name: a}\n", "seeds"),
        ("base: smoke\norder: by-sed\nsettings:\n  - {name: a}\n", "by-sed"),
    ],
)
def test_a_bad_sweep_key_is_one_line_naming_it_before_anything_runs(tmp_path, capsys, body, key):
    path = _sweep_file(tmp_path / "bad.yaml", body)
    assert main(["sweep", str(path), "--runs", str(tmp_path / "runs"), "--cluster", "tcp://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert key in err and len(err.splitlines()) == 1 and err.startswith("mclib: error:")
    assert not (tmp_path / "runs").exists()  # nothing ran, no cluster was reached for


@pytest.mark.parametrize(
    "body, line",
    [
        (
            "base: smoke\ncap_minutes: -1\nsettings:\n  - {name: a}\n",
            "cap_minutes = -1.0 must not be negative",
        ),
        ("base: smoke\nthreads: two\nsettings:\n  - {name: a}\n", "threads = 'two' is not an integer"),
        ("base: smoke\nresume: maybe\nsettings:\n  - {name: a}\n", "resume = 'maybe' is not true or false"),
        ("base: smoke\nsettings: []\n", "settings = [] must name at least one setting"),
        ("base: smoke\n", "settings is missing"),
        ("base: smoke\nsettings:\n  - {name: a/b}\n", "settings[0].name = 'a/b' is not a folder name"),
        (
            "base: smoke\nsettings:\n  - {name: a}\n  - {name: b, seeds: []}\n",
            "settings[1].seeds = [] must name at least one seed",
        ),
        ("base: smoke\nsettings:\n  - {name: a}\n  - {name: a}\n", "settings[1].name = 'a' is used twice"),
        (
            "base: smoke\nsettings:\n  - {name: a, overrides: 3}\n",
            "settings[0].overrides = 3 is not a mapping",
        ),
        (
            "base: smoke\nsettings:\n  - {name: a, after_drop: 1.5}\n",
            "settings[0].after_drop = 1.5 is not an integer",
        ),
        (
            "base: smoke\nsetings: []\n",
            "unknown key setings = [] (known: base, cap_minutes, after_drop, seeds, order, "
            "resume, threads, cluster, settings)",
        ),
        (
            "base: smoke\nsettings:\n  - {name: a, overrides: {train.lr: fast}}\n",
            "settings[0] (a): train.lr = 'fast' is not a number",
        ),
    ],
)
def test_a_bad_sweep_value_names_the_file_the_key_and_the_value(tmp_path, body, line):
    path = _sweep_file(tmp_path / "bad.yaml", body)
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert str(e.value) == f"{path}: {line}"


def test_a_settings_own_keys_override_the_sweeps_and_null_is_no_cap(tmp_path):
    path = _sweep_file(
        tmp_path / "s.yaml",
        """\
        base: smoke
        cap_minutes: 5
        resume: true
        settings:
          - {name: a}
          - {name: b, cap_minutes: null, resume: false, after_drop: 7}
    """,
    )
    a, b = load_sweep(path, tmp_path / "runs")
    assert (a.cap_minutes, a.after_drop, a.resume, a.seed) == (5.0, None, True, 1)
    assert (b.cap_minutes, b.after_drop, b.resume) == (None, 7, False)


def test_book_cluster_option_reaches_the_chapters(monkeypatch):
    """`book --cluster X` sets $MCLIB_CLUSTER, which the chapters' kernels inherit and
    mclib.core.jobs.cluster reads."""
    from mclib.book import runner as book
    from mclib.core.jobs import ENV, resolve_address

    seen = {}
    monkeypatch.setenv(ENV, "local")  # restored after the test (main sets it)
    monkeypatch.setattr(book, "build", lambda *a, **k: seen.setdefault("env", os.environ.get(ENV)))
    assert main(["book", "--profile", "smoke", "--cluster", "tcp://192.0.2.1:8786"]) == 0
    assert seen["env"] == "tcp://192.0.2.1:8786" == resolve_address(None)
    assert resolve_address("local") is None and resolve_address("tcp://h:1") == "tcp://h:1"


def test_sweep_file_format(tmp_path):
    path = _sweep_file(
        tmp_path / "s.yaml",
        """\
        base: smoke
        cap_minutes: 5
        after_drop: 100
        seeds: [1, 2]
        settings:
          - {name: a, overrides: {train.lr: 2.0e-3}}
          - {name: b, overrides: {}, seeds: [7], cap_minutes: 1}
    """,
    )
    runs = load_sweep(path, tmp_path / "runs", threads=1)
    assert [(r.setting, r.seed) for r in runs] == [("a", 1), ("a", 2), ("b", 7)]
    assert (
        runs[0].profile.train.lr == 2.0e-3
        and runs[0].profile.seed == 1
        and runs[0].profile.train.threads == 1
    )
    assert (runs[0].cap_minutes, runs[2].cap_minutes, runs[2].after_drop) == (5, 1, 100)
    assert runs[2].run_dir == tmp_path / "runs" / "b-seed7"


def test_a_sweep_by_seed_reads_every_setting_once_before_any_twice(tmp_path):
    body = """\
        base: smoke
        seeds: [1, 2, 3]
        order: {}
        settings:
          - {{name: a}}
          - {{name: b, seeds: [5, 4]}}
          - {{name: c, seeds: [9]}}
    """
    by_setting = load_sweep(_sweep_file(tmp_path / "s.yaml", body.format("by-setting")), tmp_path / "runs")
    by_seed = load_sweep(_sweep_file(tmp_path / "t.yaml", body.format("by-seed")), tmp_path / "runs")
    assert [r.label for r in by_setting] == ["a s1", "a s2", "a s3", "b s5", "b s4", "c s9"]
    assert [r.label for r in by_seed] == ["a s1", "b s5", "c s9", "a s2", "b s4", "a s3"]


def test_a_sweep_figure_gives_every_setting_its_own_colour():
    from mclib.core.sweep_figure import setting_colours

    for k in (3, 11, 20):  # the width/depth sweep has 11 settings: tab10 alone would repeat one
        colours = setting_colours([f"s{i}" for i in range(k)])
        assert len(set(colours.values())) == k, k


def _fake_run(runs: Path, name: str, steps: int, level: float) -> None:
    """A run folder holding only a metrics table: L_mask falls from 1 to `level` over `steps`."""
    (runs / name).mkdir(parents=True, exist_ok=True)
    step = pd.Series(range(1, steps + 1))
    pd.DataFrame({"step": step, "L_mask": 1 - (1 - level) * step / steps}).to_csv(
        runs / name / "metrics.csv", index=False
    )


def test_a_sweep_keeps_each_runs_curve_beside_its_table_and_draws_from_it(tmp_path, monkeypatch):
    """The curves outlive the run folders; a row trained again replaces its curve; a folder
    that is not the row's run (another last step) is not read; the figure's title counts
    the runs it draws."""
    from matplotlib.figure import Figure

    from mclib.core.sweep_figure import CURVE_POINTS, curves_path, draw_figure, keep_curves

    runs, results = tmp_path / "runs", tmp_path / "data" / "wd.csv"
    results.parent.mkdir()
    rows = pd.DataFrame(
        {
            "sweep": "wd.yaml",
            "setting": ["a", "b"],
            "seed": [1, 1],
            "steps_run": [1_000, 400],
            "drop_step": [None, 300],
            "matrices": [64_000, 25_600],
            "batch": 64,
        }
    )
    rows.to_csv(results, index=False)
    _fake_run(runs, "a-seed1", 1_000, 0.5)
    assert keep_curves(results, "wd.yaml", runs) == 1  # b's folder is not here
    kept = pd.read_csv(curves_path(results))
    a = kept[kept["setting"] == "a"]
    assert len(a) <= CURVE_POINTS and a["step"].iloc[0] == 1 and a["step"].iloc[-1] == 1_000
    assert a["step"].is_monotonic_increasing and (a["step"] < 100).sum() > 50  # dense where log(step) is
    full = 1 - 0.5 * pd.Series(range(1, 1_001)) / 1_000
    trailing = full.rolling(50, min_periods=1).mean()  # find_drop's reading of the curve
    assert a["L_mask"].to_numpy() == pytest.approx(trailing.iloc[a["step"] - 1].to_numpy(), abs=1e-6)

    titles = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: titles.append(fig.axes[0].get_title()))
    draw_figure(results, "wd.yaml", tmp_path / "wd.png")
    assert titles[-1] == "wd.yaml: 1 of 2 runs (the others' curves were not kept)"

    shutil.rmtree(runs / "a-seed1")  # the folder gone: the curve stays
    _fake_run(runs, "b-seed1", 999, 0.1)  # not b's run: it ended at 400
    assert keep_curves(results, "wd.yaml", runs) == 1
    pd.testing.assert_frame_equal(pd.read_csv(curves_path(results)), kept)
    _fake_run(runs, "b-seed1", 400, 0.1)
    assert keep_curves(results, "wd.yaml", runs) == 2
    draw_figure(results, "wd.yaml", tmp_path / "wd.png")
    assert titles[-1] == "wd.yaml: every run"

    rows.loc[0, "steps_run"] = 2_000  # a trained again, here, further
    rows.to_csv(results, index=False)
    _fake_run(runs, "a-seed1", 2_000, 0.01)
    keep_curves(results, "wd.yaml", runs)
    a = pd.read_csv(curves_path(results)).query("setting == 'a'")
    assert a["step"].iloc[-1] == 2_000 and a["L_mask"].iloc[-1] < 0.1


LEVER_LEFT = re.compile(r"^# To re-run: git checkout ([0-9a-f]{7,40});", re.M)  # a sweep whose lever left


def test_every_sweep_file_of_the_repository_loads():
    """Every sweep loads, except those that name the revision that ran them because a lever
    of theirs has left the library (c508192, 2026-11-26): each of those fails with a ConfigError
    naming the key."""
    left = []
    for path in sorted((REPO / "sweeps").glob("*.yaml")):
        if path.name.endswith(".example.yaml"):
            continue
        if LEVER_LEFT.search(path.read_text()):
            left.append(path.name)
            with pytest.raises(ConfigError, match=r"unknown key (model|data|train)\."):
                load_sweep(path)  # one line per unknown key (config's "N bad values:" for several)
            continue
        assert load_sweep(path), path
    assert left == ["mix-7x7.yaml", "round1.yaml", "round4.yaml", "round6.yaml", "round8.yaml", "round9.yaml"]


def test_a_sweep_whose_lever_left_names_it_and_its_revision():
    path = REPO / "sweeps" / "round1.yaml"
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert str(e.value).startswith(
        f"{path}: settings[2] (h64-lr1e-3-pos0.2): unknown key model.position_init_std "
    )
    assert "\n" not in str(e.value)
    assert LEVER_LEFT.search(path.read_text()).group(1) == "81fa31b"


def test_jobqueue_yaml(tmp_path):
    from dask_jobqueue import PBSCluster, SLURMCluster

    cls, options, workers = jobqueue_spec(REPO / "sweeps" / "slurm.example.yaml")
    assert cls is SLURMCluster and workers >= 1 and options["cores"] >= 1
    assert "GPU=1" in options["worker_extra_args"]
    path = tmp_path / "pbs.yaml"
    path.write_text("jobqueue: pbs\nworkers: 3\noptions: {cores: 2, memory: 4GB}\n")
    assert jobqueue_spec(path) == (PBSCluster, {"cores": 2, "memory": "4GB"}, 3)
    for body, word in [
        ("jobqueue: slurm\nworkrs: 2\n", "workrs"),
        ("jobqueue: kubernetes\n", "kubernetes"),
        ("jobqueue: slurm\nworkers: 0\n", "workers"),
    ]:
        path.write_text(body)
        with pytest.raises(ClusterError, match=word):
            jobqueue_spec(path)
    for body, line in [
        ("jobqueue: slurm\nworkers: 0\n", "workers = 0 must be positive"),
        (
            "jobqueue: kubernetes\n",
            "jobqueue = 'kubernetes' is not one of slurm, pbs, sge, lsf, htcondor, moab, oar",
        ),
        ("jobqueue: slurm\nworkrs: 2\n", "unknown key workrs = 2 (known: jobqueue, workers, options)"),
        ("jobqueue: slurm\noptions: [1]\n", "options = [1] is not a mapping"),
    ]:
        path.write_text(body)  # one line: the file, the key, the value
        with pytest.raises(ClusterError) as e:
            jobqueue_spec(path)
        assert str(e.value) == f"{path}: {line}"


def _sleep_then_time(seconds: float) -> float:
    """A task: sleep, then the moment it ended (one process, so one clock with the test's)."""
    time.sleep(seconds)
    return time.monotonic()


_RELEASE = threading.Event()  # the busy job of the test below runs until the test sets it


def _busy_until_released() -> float:
    """A task that holds its worker until `_RELEASE` is set (in-process workers share it), then
    the moment it ended."""
    _RELEASE.wait(timeout=120)
    return time.monotonic()


def test_a_job_is_handed_out_only_when_a_worker_is_free(monkeypatch):
    """submit_when_free: with one of two workers busy, the three jobs go out one at a time,
    each after the one before it ended, in order; none waits on the busy worker. The busy job
    holds its worker until the three have ended, however slow the machine."""
    from distributed import Client, LocalCluster

    from mclib.core import jobs

    handed = []
    real = jobs.submit
    monkeypatch.setattr(jobs, "submit", lambda *a, **k: handed.append(time.monotonic()) or real(*a, **k))
    _RELEASE.clear()
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as lc,
        Client(lc, set_as_default=False) as client,
    ):
        assert jobs.slots(client) == 2
        busy = client.submit(_busy_until_released, pure=False)
        try:
            futures = jobs.submit_when_free(
                client, _sleep_then_time, [(0.2,), (0.2,), (0.2,)], busy=[busy], poll=0.05
            )
            ends = jobs.results(futures)
        finally:
            _RELEASE.set()
        busy_end = busy.result()
    assert len(handed) == 3 and handed == sorted(handed)
    assert handed[1] >= ends[0] and handed[2] >= ends[1]  # one free slot: each waited for the one before
    assert ends[2] < busy_end  # all three ran beside the busy job, not behind it


_LONG_MAY_END = threading.Event()  # the long job of the test below runs until its third task sets it
_LONG_SEEN_ENDED = threading.Event()  # set once the client holds the long job as ended


def _long_job() -> float:
    _LONG_MAY_END.wait(timeout=120)
    return time.monotonic()


def _task(i: int) -> float:
    """The i-th task beside the long job: the third (i = 2) lets the long job end and ends only
    once the client has seen it end, so that the fourth's turn comes after it, however slow the
    machine; the moment it ended."""
    if i == 2:
        _LONG_MAY_END.set()
        _LONG_SEEN_ENDED.wait(timeout=120)
    return time.monotonic()


def test_idle_workers_take_tasks_only_while_the_long_job_runs():
    """submit_while: beside a long job on one of two workers, the tasks go out one at a time on
    the other; the long job ends while the third runs, so the fourth is not submitted. Events,
    not sleeps, order the jobs: a starved machine cannot reorder them."""
    from distributed import Client, LocalCluster

    from mclib.core import jobs

    _LONG_MAY_END.clear()
    _LONG_SEEN_ENDED.clear()
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as lc,
        Client(lc, set_as_default=False) as client,
    ):
        long = client.submit(_long_job, pure=False)
        long.add_done_callback(lambda _: _LONG_SEEN_ENDED.set())
        tasks = [(_task, (i,), f"task{i}") for i in range(4)]
        try:
            futures = jobs.submit_while(client, tasks, long, busy=[long], poll=0.05)
            ends, long_end = jobs.results(futures), long.result()
        finally:
            _LONG_MAY_END.set()
            _LONG_SEEN_ENDED.set()
    assert [f.key.split("-")[0] for f in futures] == ["task0", "task1", "task2"]  # a prefix, in order
    assert ends == sorted(ends) and ends[1] < long_end < ends[2]  # one at a time, beside it


# --- slow: real processes ------------------------------------------------------------------


@pytest.mark.slow
def test_local_cluster_one_single_threaded_worker_per_core_on_loopback():
    with cluster(None, threads_per_run=1) as client:
        info = client.scheduler_info()
        assert client.scheduler.address.startswith("tcp://127.0.0.1:")
        assert len(info["workers"]) == len(os.sched_getaffinity(0))
        assert all(w["nthreads"] == 1 for w in info["workers"].values())
        assert set(client.run(os.environ.get, "OMP_NUM_THREADS").values()) == {
            "1"
        }  # torch's threads: the run's
        # Dask's nanny would set MALLOC_TRIM_THRESHOLD_, which makes a CPU training step 1.4x slower
        assert set(client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_").values()) == {None}
        assert client.dashboard_link is None or "8787" not in client.dashboard_link
        import psutil

        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:  # every socket listens on loopback only
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    assert conn.laddr.ip == "127.0.0.1", (proc.pid, conn)


@pytest.mark.slow
def test_unreachable_scheduler_on_the_command_line(tmp_path, capsys):
    address = f"tcp://127.0.0.1:{free_port()}"
    path = _sweep_file(tmp_path / "s.yaml", SMOKE_SWEEP)
    importlib.import_module("distributed")  # before the clock, as above

    start = time.monotonic()
    assert main(["sweep", str(path), "--cluster", address, "--runs", str(tmp_path / "runs")]) == 2
    assert time.monotonic() - start < 20  # the default timeout is 10 s
    err = capsys.readouterr().err.strip()
    assert address in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_smoke_sweep_on_a_scheduler_and_two_workers_equals_runs_alone(tmp_path, capsys, monkeypatch):
    from mclib.core import sweep

    path = _sweep_file(tmp_path / "smoke.yaml", SMOKE_SWEEP)
    runs = tmp_path / "runs"
    drawn = []  # the rows in the table each time the figure is drawn: after every row, then at the end
    draw = sweep.draw_figure
    monkeypatch.setattr(
        sweep,
        "draw_figure",
        lambda results, *a, **k: (drawn.append(len(pd.read_csv(results))), draw(results, *a, **k))[1],
    )
    with dask_processes(tmp_path) as (address, _):
        args = ["sweep", str(path), "--cluster", address, "--runs", str(runs), "--progress-every", "0.5"]
        assert main(args) == 0
        assert drawn == [1, 2, 3, 4, 4]
        out = capsys.readouterr().out
        assert "4 of 4 runs done, 0 failed" in out and "running (" in out, out
        table = pd.read_csv(runs / "smoke.csv")
        assert sorted(zip(table.setting, table.seed)) == [
            ("base", 1),
            ("base", 2),
            ("lr2e-3", 1),
            ("lr2e-3", 2),
        ]
        assert {"drop_step", "matrices", "wall_minutes", "final_L_obs", "final_L_mask"} <= set(table.columns)
        assert (runs / "smoke.png").is_file()
        before = (runs / "smoke.csv").read_bytes()
        assert main(args) == 0  # resumable: finished runs are skipped
        assert "4 already in" in capsys.readouterr().out and (runs / "smoke.csv").read_bytes() == before
    for run in load_sweep(path, runs, threads=1):  # each run alone, in this process
        alone = train(run.profile, tmp_path / "alone" / run.run_dir.name, progress=False)
        pd.testing.assert_frame_equal(
            load_metrics(run.run_dir)[LOSS_COLS], load_metrics(alone)[LOSS_COLS], check_exact=True
        )


@pytest.mark.slow
def test_a_worker_killed_mid_run_the_run_finishes_on_the_other_from_its_checkpoint(tmp_path, smoke_profile):
    steps = 600
    profile = smoke_profile.replace(
        **{"train.steps": steps, "train.save_every": 20, "train.log_every": 10, "checkpoints.post": steps}
    )
    folder = tmp_path / "run"
    with dask_processes(tmp_path) as (address, procs), cluster(address) as client:
        future = client.submit(train_seed, profile, folder, None, key="train-killed", pure=False)
        deadline = time.monotonic() + 300
        while not [s for s in saved_steps(folder) if s >= 60] and time.monotonic() < deadline:
            time.sleep(0.05)
        processing = {w: keys for w, keys in client.processing().items() if "train-killed" in keys}
        (worker,) = processing
        name = client.scheduler_info()["workers"][worker]["name"]
        kept = {s: os.stat(folder / "checkpoints" / f"step_{s:06d}").st_ino for s in saved_steps(folder)}
        assert 60 <= max(kept) < steps  # the kill lands mid-run
        os.killpg(procs[name].pid, signal.SIGKILL)
        assert future.result(timeout=600) == folder
        (survivor,) = client.who_has(future)["train-killed"]
        assert client.scheduler_info()["workers"][survivor]["name"] != name
    for s, inode in kept.items():  # continued from its checkpoints: none of them was written again
        assert os.stat(folder / "checkpoints" / f"step_{s:06d}").st_ino == inode
    alone = train(profile, tmp_path / "alone", progress=False)
    pd.testing.assert_frame_equal(
        load_metrics(folder)[LOSS_COLS], load_metrics(alone)[LOSS_COLS], check_exact=True
    )
    a, b = load_checkpoint(folder, steps).state_dict(), load_checkpoint(alone, steps).state_dict()
    assert all((a[k] == b[k]).all() for k in a)


@pytest.mark.slow
def test_local_workers_end_with_the_process_that_started_them(tmp_path):
    """The old pool's incident: workers that outlived their parent. Kill the parent (-9):
    the local cluster's worker processes end too."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent("""\
        import os, sys, time
        from mclib.core.jobs import cluster
        if __name__ == "__main__":
            with cluster(None, threads_per_run=1) as client:
                pids = client.run(os.getpid)
                print(" ".join(str(p) for p in pids.values()), flush=True)
                time.sleep(600)
    """)
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids
        os.kill(proc.pid, signal.SIGKILL)  # the parent alone, not its group
        proc.wait(timeout=30)

        def alive(pid):
            try:
                os.kill(pid, 0)
                return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
            except (ProcessLookupError, FileNotFoundError):
                return False

        deadline = time.monotonic() + 60
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(p) for p in pids)
    finally:
        _stop(proc)


def test_the_paper_sizes_are_gpu_runs_of_12_layers_by_12_heads():
    runs = load_sweep(REPO / "sweeps" / "sizes-gpu.yaml")
    assert [(r.profile.data.n, r.profile.data.rank) for r in runs] == [(7, 2), (10, 3), (12, 3), (15, 4)]
    for r in runs:
        m = r.profile.model
        assert (m.layers, m.heads, m.hidden, r.profile.train.device) == (12, 12, 768, "cuda")
        assert (r.profile.train.lr, r.profile.checkpoints.keep) == (5e-5, "analysis")  # the protocol's lr
        assert resources_for(r.profile) == {"GPU": 1}


@pytest.mark.slow
def test_the_paper_sizes_train_a_few_steps_on_the_cpu(tmp_path):
    """Each setting of sweeps/sizes-gpu.yaml at its full model (12 x 12, hidden 768) on the
    CPU, 2 steps of 2 matrices, through the sweep's own worker function: its task, depth,
    heads and lr train, and only the newest checkpoint stays (the sweep's policy)."""
    import dataclasses

    from mclib.core.checkpoints import saved_steps
    from mclib.core.sweep_run import train_sweep_run

    few = {
        "train.device": "cpu",
        "train.batch": 2,
        "train.eval_batch": 2,
        "train.steps": 2,
        "train.save_every": 1,
        "train.log_every": 1,
        "train.eval_every": 1,
        "checkpoints.pre": 1,
        "checkpoints.transition": [],
        "checkpoints.post": 2,
    }
    for run in load_sweep(REPO / "sweeps" / "sizes-gpu.yaml", tmp_path, threads=1):
        run = dataclasses.replace(run, profile=run.profile.replace(**few))
        row = train_sweep_run(run)
        assert (row["n"], row["layers"], row["heads"], row["hidden"], row["lr"], row["steps_run"]) == (
            run.profile.data.n,
            12,
            12,
            768,
            5e-5,
            2,
        )
        assert row["final_L_mask"] == row["final_L_mask"]  # a number, not NaN
        assert saved_steps(run.run_dir) == [2]


def test_a_sweep_row_that_cannot_fit_is_refused_before_it_starts(tmp_path, monkeypatch):
    from mclib.core import sweep

    monkeypatch.setattr(sweep, "memory_here", lambda device: 4 * 2**30)  # a 4 GiB machine
    path = _sweep_file(
        tmp_path / "s.yaml",
        "base: paper\nseeds: [1]\nsettings:\n  - {name: big, overrides: "
        "{model.layers: 12, model.heads: 12, data.n: 15, data.rank: 4, "
        "train.device: cpu}}\n",
    )
    with pytest.raises(ConfigError, match=r"^sweep setting big: a run needs about 46\.8 GiB .* has 4\.0 GiB"):
        sweep.run_sweep(path, runs=tmp_path / "runs")
    assert not (tmp_path / "runs" / "big-seed1").exists()


@pytest.mark.slow
def test_a_cut_sweep_run_continues_and_a_folder_of_another_sweep_starts_afresh(tmp_path):
    """The sweep's worker function: a run cut in this sweep (here: trained to step 20 first)
    continues from its checkpoint and ends as an uninterrupted run; a folder that another
    sweep left is removed first (unless `resume: true`)."""
    import dataclasses

    from mclib.core.sweep_run import train_sweep_run

    path = _sweep_file(tmp_path / "s.yaml", "base: smoke\nseeds: [1]\nsettings:\n  - {name: a}\n")
    (run,) = load_sweep(path, tmp_path / "runs", threads=1)
    cut = dataclasses.replace(
        run,
        profile=run.profile.replace(
            **{"train.steps": 20, "checkpoints.transition": [], "checkpoints.post": 20}
        ),
    )
    train_sweep_run(cut)
    inode = os.stat(run.run_dir / "checkpoints" / "step_000020").st_ino
    row = train_sweep_run(run)
    assert row["steps_run"] == 60 and os.stat(run.run_dir / "checkpoints" / "step_000020").st_ino == inode
    alone = train(run.profile, tmp_path / "alone", progress=False)
    pd.testing.assert_frame_equal(
        load_metrics(run.run_dir)[LOSS_COLS], load_metrics(alone)[LOSS_COLS], check_exact=True
    )
    other = dataclasses.replace(cut, sweep="other.yaml")
    assert train_sweep_run(other)["steps_run"] == 20  # started afresh: not the 60-step folder resumed
    assert saved_steps(run.run_dir) == [20]


def test_a_sweep_row_names_the_rule_that_ended_its_run(smoke_profile):
    from mclib.core.sweep_run import end_rule

    assert end_rule(smoke_profile.replace(**{"train.until": "steps"})) == "steps"
    assert (
        end_rule(
            smoke_profile.replace(
                **{"train.until": "converged", "train.patience": 2000, "train.min_improvement": 0.05}
            )
        )
        == "slope 2000 0.05 confirmed"
    )


def test_sweep_runs_start_in_the_sweeps_order_not_by_name(tmp_path, monkeypatch):
    """One worker, every run submitted at once: they start in the file's order (here
    by-seed), not in the alphabetical order of their keys."""
    from distributed import Client, LocalCluster

    from mclib.core import sweep

    log = tmp_path / "started.txt"  # the worker runs a copy of the function: it tells the test through a file

    def fake_run(run):
        with open(log, "a") as f:
            f.write(run.label + "\n")
        time.sleep(0.1)  # every run is queued while the first one runs
        return {"setting": run.setting, "seed": run.seed, "sweep": run.sweep}

    monkeypatch.setattr(sweep, "train_sweep_run", fake_run)
    path = _sweep_file(
        tmp_path / "o.yaml",
        """\
        base: smoke
        seeds: [1, 2]
        order: by-seed
        settings:
          - {name: zeta, overrides: {}}
          - {name: alpha, overrides: {}}
          - {name: mid, overrides: {}}
    """,
    )
    pending = load_sweep(path, tmp_path / "runs")
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc,
        Client(lc, set_as_default=False) as client,
    ):
        sweep._drive(client, pending, tmp_path / "o.csv", "o.yaml", 0, every=1e9, redraw=lambda: None)
    assert log.read_text().splitlines() == ["zeta s1", "alpha s1", "mid s1", "zeta s2", "alpha s2", "mid s2"]
