"""A GPU lease's faults, on the CPU: what the lease's plumbing (mclib.lease.slices, scripts/lease.sh,
benchmarks/lease_step.py) does when the trainer hangs, a variant of the step hangs or raises an
error that leaves the device unusable, `start` refuses and `finish` follows, the kit is missing,
or too little time is left; and the CUDA-only parts of the step (the graph's memory, a failed
capture's cause, the host's time a step) with CUDA's calls stubbed. Each ends with what ran kept
and a results.tgz that says why the rest did not."""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import weakref
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from sources import PLENTY_S, lease_step_args, load_script

from mclib.__main__ import main
from mclib.chapters.registry import specs as chapter_specs
from mclib.core import graphstep
from mclib.core.runs import write_atomic
from mclib.lease import slices, slices_run

SPECS = (
    chapter_specs()
)  # what the toc's chapters declare (mclib.book.spec), as the command line hands it down

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    return load_script(ROOT / "benchmarks" / "lease_step.py")


def _ledger(tmp_path, train_s=20, chapters=()):
    plan = {
        "profile": "smoke",
        "precision": "fp32",
        "step_ms": 5.0,
        "step_ms_source": "a test",
        "lease_s": 900,
        "start_s": 180,
        "slices": [
            {
                "name": "A",
                "what": "the smoke run under a deadline",
                "seeds": [1],
                "train_s": train_s,
                "chapters": list(chapters),
                "chapters_s": 200,
            }
        ],
    }
    path = tmp_path / "results" / "paper-slices.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(plan))
    return path


def _packed(tgz: Path) -> tuple[dict, list[str]]:
    with tarfile.open(tgz) as tar:
        return json.loads(tar.extractfile(slices.STATE).read()), tar.getnames()


# --- the trainer ---------------------------------------------------------------------------

TRAINER = (
    "import signal, sys, time\n"
    "if sys.argv[1] == 'hangs':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # a trainer stuck where no signal is taken
    "print('training', flush=True)\n"
    "time.sleep(300)\n"
)


@pytest.mark.parametrize("trainer", ["hangs", "stops"])
def test_a_trainer_past_its_deadline_is_asked_to_stop_then_killed_and_the_slice_packed(
    trainer, tmp_path, monkeypatch, smoke_profile
):
    """`finish` waits for the trainer until the deadline + FINISH_GRACE_S, asks it to stop
    (SIGTERM: the loop saves and ends "cut"), kills it STOP_S later, then packs all the same."""
    monkeypatch.setattr(slices, "FINISH_GRACE_S", 0.5, raising=False)
    monkeypatch.setattr(slices, "STOP_S", 0.5, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    ppath = work / "slice-A.yaml"
    ppath.write_text(yaml.safe_dump(smoke_profile.to_dict(), sort_keys=False))
    log = open(work / slices.TRAIN_LOG, "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, trainer],
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
        text=True,
    )
    assert proc.stdout.readline() == "training\n"  # its SIGTERM handling is in place
    state = {
        "slice": "A",
        "pid": proc.pid,
        "deadline": time.time(),
        "started": time.time(),
        "budget_s": 600.0,
        "profile": str(ppath),
        "chapters": [],
        "seeds": [1],
        "git": "abc1234",
        "train_step": "eager",
    }
    write_atomic(work / slices.STATE, json.dumps(state))
    done = []
    waiter = threading.Thread(
        target=lambda: done.append(slices_run.finish(work, tmp_path / "out", specs=SPECS)), daemon=True
    )
    t0 = time.time()
    waiter.start()
    waiter.join(timeout=30)
    try:
        assert done, "finish still waiting for the trainer 30 s after its deadline"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        waiter.join(timeout=10)
    assert time.time() - t0 < 15
    record, names = _packed(done[0])
    said = {"hangs": "killed", "stops": "asked to stop"}[trainer]
    assert record["training_stop"].startswith(said), record["training_stop"]
    assert proc.returncode == -(signal.SIGKILL if trainer == "hangs" else signal.SIGTERM)
    assert slices.TRAIN_LOG in names  # the trainer's log tail comes back


def test_a_chapter_that_fails_any_way_leaves_what_trained_packed(tmp_path, monkeypatch, slice_trained):
    from mclib.book import runner

    work = slice_trained(
        deadline=0.0, started=time.time(), budget_s=600.0, chapters=["01_train", "02_copying"]
    )
    monkeypatch.setattr(runner, "select_chapters", lambda name: name)
    monkeypatch.setattr(runner, "build", lambda *a, **kw: {}["a key no chapter has"])
    record, _ = _packed(slices_run.finish(work, tmp_path / "out", specs=SPECS))
    assert record["chapter_error"] == "01_train: KeyError: 'a key no chapter has'"
    assert record["chapters_not_run"] == ["02_copying"] and record["training_stop"] == slices_run.ENDED_ITSELF


# --- the step's measurement ----------------------------------------------------------------

STICKY = "CUDA error: an illegal memory access was encountered"


def test_a_variant_whose_error_leaves_the_device_unusable_keeps_every_row_measured_before_it(
    tmp_path, monkeypatch
):
    """bf16 raises an error that leaves the device unusable (a sticky CUDA error), and from
    then on the cleanup raises too: eager's row and the kernel table are kept, bf16's row
    names the error, the variants after it say why they did not run, the traceback is beside."""
    bench = _bench()
    broken = []
    real_trace, real_set = bench.trace, bench.set_precision

    def trace(profile, device, variant, steps):
        if profile.train.precision == "bf16":
            broken.append(True)
            raise RuntimeError(
                STICKY + "\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
            )
        return real_trace(profile, device, variant, steps)

    def set_precision(device, precision):
        if broken:
            raise RuntimeError(STICKY)
        real_set(device, precision)

    monkeypatch.setattr(bench, "trace", trace)
    monkeypatch.setattr(bench, "set_precision", set_precision)
    monkeypatch.setattr(
        bench, "device_error", lambda device: f"RuntimeError: {STICKY}" if broken else None, raising=False
    )
    out = tmp_path / "lease_step.csv"
    code = bench.main(lease_step_args(PLENTY_S, "eager,bf16,compile", tmp_path / "none.yaml", out))
    t = pd.read_csv(out).set_index("variant")
    assert list(t.index) == ["eager", "bf16", "compile"]
    assert t.loc["eager", "status"] == "ran" and bool(t.loc["eager", "passed"])
    assert t.loc["bf16", "status"] == f"failed: RuntimeError: {STICKY}"
    assert t.loc["compile", "status"] == (
        f"not run: the device is unusable after bf16's error (RuntimeError: {STICKY})"
    )
    assert code == bench.EXIT_STOPPED
    assert (tmp_path / "lease_step_kernels.csv").is_file()
    errors = (tmp_path / "lease_step_errors.log").read_text()
    assert "Traceback" in errors and "TORCH_USE_CUDA_DSA" in errors


HANG = """
import time
import mclib.core.variants as variants
real = variants.trace
def trace(profile, device, variant, steps=20):
    if profile.train.precision == "bf16":
        time.sleep(3600)  # a variant that never returns
    return real(profile, device, variant, steps)
variants.trace = trace
"""


@pytest.mark.slow  # a process of its own (torch's import), ~20 s
def test_a_variant_that_hangs_is_cut_at_its_cap_and_the_rows_before_it_are_kept(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HANG)
    out = tmp_path / "lease_step.csv"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    t0 = time.time()
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "lease_step.py"),
            *lease_step_args(20, "eager,bf16,compile", tmp_path / "none.yaml", out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.time() - t0 < 90
    t = pd.read_csv(out).set_index("variant")
    assert t.loc["eager", "status"] == "ran"
    assert t.loc["bf16", "status"].startswith("failed: still running at its cap of "), t.loc["bf16", "status"]
    assert t.loc["compile", "status"] == "not run: bf16 hung"
    assert p.returncode == _bench().EXIT_STOPPED, p.stderr[-2000:]


# --- start refused, then finish ------------------------------------------------------------


def test_finish_after_a_refused_start_packs_a_results_tgz_saying_why(tmp_path, capsys):
    ledger = _ledger(tmp_path, train_s=600)
    work, out = tmp_path / "work", tmp_path / "out"
    assert main(["slice", "start", "--out", str(work), "--budget-s", "300", "--ledger", str(ledger)]) == 2
    refusal = capsys.readouterr().err.strip()
    assert refusal.startswith("mclib: error: no slice fits this lease: slice A needs at least 830 s")
    assert main(["slice", "finish", "--out", str(work), "--dest", str(out), "--ledger", str(ledger)]) == 0
    record, _ = _packed(out / slices.RESULTS_TGZ)
    assert record["slice"] is None and record["refused"] == refusal.removeprefix("mclib: error: ")
    # back here: nothing to file, said in one line, nothing filed under results/
    assert main(["slice", "merge", str(out / slices.RESULTS_TGZ), "--ledger", str(ledger)]) == 0
    assert "the lease started no slice: no slice fits this lease" in capsys.readouterr().out
    assert not list(ledger.parent.glob("smoke-A-*"))


# --- scripts/lease.sh ----------------------------------------------------------------------

NO_KIT = "import sys\nfor _name in ('papermill', 'ipykernel', 'myst_nb'):\n    sys.modules[_name] = None\n"


def _lease(action, tmp_path, ledger, extra_env=None, timeout=300):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_KIT)
    env = {
        **os.environ,
        "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "OUT"),
        "WORK": str(tmp_path / "work"),
        "LEDGER": str(ledger),
        "KIT": str(tmp_path / "no-kit"),
        "BENCH_S": "15",
        "HOLD_S": "1",
        "BENCH_ARGS": "--profile smoke --batch 2 --steps 2 --check-steps 2 --variants eager,bf16",
        **(extra_env or {}),
    }
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "lease.sh"), action],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow  # two processes of their own, ~30 s
def test_without_the_kit_the_step_is_measured_and_the_slice_refused_in_one_line(tmp_path):
    ledger = _ledger(tmp_path)
    started = _lease("start", tmp_path, ledger)
    assert started.returncode == 3, started.stdout[-2000:] + started.stderr[-2000:]
    lines = [line for line in started.stderr.splitlines() if line.startswith("lease: no slice started")]
    assert lines == [
        f"lease: no slice started: no {tmp_path / 'no-kit'} and papermill, ipykernel or myst_nb is "
        "not installed (python scripts/wheelhouse.py --kit --out .kit, then carry .kit)"
    ]
    assert (
        pd.read_csv(tmp_path / "OUT" / "lease_step.csv")["status"].iloc[0] == "ran"
    )  # the table needs no kit
    finished = _lease("finish", tmp_path, ledger)
    assert finished.returncode == 0, finished.stderr[-2000:]
    record, names = _packed(tmp_path / "OUT" / slices.RESULTS_TGZ)
    assert record["slice"] is None and record["refused"].startswith("no slice started: no ")
    assert "lease_step.csv" in names and slices.START_LOG in names


# --- the CUDA-only parts of the step, CUDA's calls stubbed -----------------------------------


def _cpu_run():
    from mclib.core.config import load_profile, profile_path
    from mclib.core.step import TrainingRun

    p = load_profile(profile_path("smoke")).replace(
        **{"train.compile": False, "train.step": "eager", "train.batch": 2}
    )
    return TrainingRun.in_memory(p, torch.device("cpu"), capture_ready=True)


def test_a_runs_step_graph_and_its_memory_go_when_the_run_goes_without_waiting_for_the_collector():
    from mclib.core.step import device_step

    run = _cpu_run()
    run.graph = graphstep.StepGraph(run, device_step)
    pool = object()  # stands for the captured graph (torch.cuda.CUDAGraph), which holds its memory pool
    run.graph.graph = pool
    gone = weakref.ref(run.graph)
    gc.disable()
    try:
        del run
        assert gone() is None, "the step graph outlived its run: a reference cycle waits for the collector"
    finally:
        gc.enable()


class _FakeCapture:
    """torch.cuda.graph as it behaves when the step fails inside a capture: its exit (capture_end)
    raises its own error, which hides the step's."""

    def __init__(self, graph, **kw):
        self.capturing = False

    def __enter__(self):
        _FakeCapture.on = True
        return self

    def __exit__(self, *exc):
        _FakeCapture.on = False
        if exc[0] is not None:
            raise RuntimeError(
                "CUDA error: operation failed due to a previous error during capture\n"
                "(the capture was invalidated)"
            )
        return False


def test_a_capture_that_fails_names_the_steps_own_error_not_capture_ends(monkeypatch, logged):
    def step(run, batch):
        if getattr(_FakeCapture, "on", False):
            raise RuntimeError("operation not permitted when stream is capturing")
        return torch.zeros(4)

    run = _cpu_run()
    batch = run.batch()  # the run's fixed input buffers (here on the CPU)
    run.device = torch.device("cuda")
    monkeypatch.setattr(graphstep, "warm_up", lambda *a, **kw: None)
    monkeypatch.setattr(graphstep.torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(graphstep.torch.cuda, "graph", _FakeCapture)
    g = graphstep.StepGraph(run, step)
    g.replay(batch)
    assert run.fell_back == "RuntimeError: operation not permitted when stream is capturing", run.fell_back
    assert "operation not permitted when stream is capturing" in logged.err()


class _FakeGPU:
    """A device that runs each step for `device_ms` after the host enqueued it in `host_ms`, with
    a launch queue `depth` steps deep: once full, the host waits for room, as CUDA's does."""

    def __init__(self, host_ms, device_ms, depth=2):
        self.host, self.dev, self.depth, self.busy_until, self.queued = (
            host_ms / 1000,
            device_ms / 1000,
            depth,
            0.0,
            [],
        )

    def step(self):
        time.sleep(self.host)
        while len([t for t in self.queued if t > time.perf_counter()]) >= self.depth:
            time.sleep(0.0005)  # the queue is full: the launch blocks
        self.busy_until = max(self.busy_until, time.perf_counter()) + self.dev
        self.queued.append(self.busy_until)

    def synchronize(self, *a):
        time.sleep(max(0.0, self.busy_until - time.perf_counter()))

    def event(self, **kw):
        gpu = self

        class Event:
            def record(self):
                self.at = max(gpu.busy_until, time.perf_counter())

            def synchronize(self):
                gpu.synchronize()

            def elapsed_time(self, end):
                return 1000 * (end.at - self.at)

        return Event()


def test_the_hosts_time_a_step_is_its_own_not_the_queue_waiting_for_the_device(monkeypatch):
    """A GPU-bound step (device 20 ms, host 2 ms): host_ms_step reads the host's 2 ms, not the
    device's 20 that the host waits for once the launch queue is full."""
    from mclib.core import variants

    gpu = _FakeGPU(host_ms=2, device_ms=20)
    monkeypatch.setattr(variants.torch.cuda, "synchronize", gpu.synchronize)
    monkeypatch.setattr(variants.torch.cuda, "Event", gpu.event)
    t = variants.time_steps(gpu.step, 12, torch.device("cuda"))
    assert 18 < t.ms_min <= t.ms <= t.ms_max < 26 and t.repeats == variants.REPEATS
    assert t.host_ms < 8, f"host_ms_step {t.host_ms:.1f} reads the device's time"


# --- a whole lease, rehearsed on a scaled clock ---------------------------------------------

# the lease's clock: 900 s of device time -> 90, a 3-minute start -> 18, the 600 s command limit -> 60
SCALE = 0.1
LIMITS = ("COLLECT_S", "RETURN_S", "COMMAND_SPARE_S", "FINISH_GRACE_S", "STOP_S", "MEASURE_S", "CHECK_S")

# In every process of the rehearsal: mclib.lease.slices'
# limits scaled, and the fault named by REHEARSAL_FAULT.
REHEARSAL_SITE = f"""
import os, signal, sys, time
fault = os.environ.get("REHEARSAL_FAULT", "")
if fault == "no-kit":
    for _name in ("papermill", "ipykernel", "myst_nb"):
        sys.modules[_name] = None
import mclib.lease.slices as _slices
for _k in {LIMITS!r}:
    setattr(_slices, _k, getattr(_slices, _k) * {SCALE})
if fault in ("trainer-hangs", "variant-hangs", "variant-breaks"):
    import mclib.core.precision as _precision, mclib.core.train as _train, mclib.core.variants as _variants
    _real_trace, _real_set, _broken = _variants.trace, _precision.set_precision, []
    def _hangs(*a, **kw):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stuck where no signal is taken
        print("rehearsal: the trainer hangs", flush=True)
        time.sleep(3600)
    def _trace(profile, device, variant, steps=20):
        if profile.train.precision == "bf16":
            if fault == "variant-hangs":
                time.sleep(3600)
            _broken.append(1)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return _real_trace(profile, device, variant, steps)
    def _set(device, precision):
        if _broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        _real_set(device, precision)
    if fault == "trainer-hangs":
        _train.train = _hangs
    else:
        _variants.trace = _trace
        for _m in (_precision, _variants, _train):  # the switch as every caller of it reads it
            _m.set_precision = _set
        _variants.device_error = lambda device: (
            "RuntimeError: CUDA error: an illegal memory access" if _broken else None
        )
"""

# fault -> (LEFT_S as `start` begins, the slice's train_s); the lease as a whole: 900 s less a 3-minute start
FAULTS = {
    "none": (72, 25),
    "trainer-hangs": (72, 15),
    "variant-hangs": (72, 5),
    "variant-breaks": (72, 5),
    "too-little-time": (18, 5),
    "no-kit": (72, 5),
}


def _process_start_s() -> float:
    """Seconds a fresh Python process takes to import what benchmarks/lease_step.py imports, on this
    machine under its present load (the larger of two tries)."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
        "import torch, pandas, mclib.core.variants, mclib.lease.steptable"
    )
    took = []
    for _ in range(2):
        t0 = time.time()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
        took.append(time.time() - t0)
    return max(took)


@pytest.mark.slow  # six leases of ~25-70 s each
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_whole_lease_rehearsed_on_a_scaled_clock_ends_with_results_that_say_why(
    fault, tmp_path, smoke_profile
):
    """Each fault in a lease of 900 s with a 3-minute start and 600 s commands (times 0.1): both
    commands stay inside the command limit, and results.tgz holds what ran and says why the rest
    did not."""
    left, train_s = FAULTS[fault]
    long = tmp_path / "smoke-long.yaml"  # the smoke model, with steps enough for any deadline to cut
    long.write_text(
        yaml.safe_dump(
            smoke_profile.replace(
                **{"train.steps": 1_000_000, "train.save_every": 1000, "checkpoints.post": 1_000_000}
            ).to_dict(),
            sort_keys=False,
        )
    )
    plan = {
        "profile": str(long),
        "precision": "fp32",
        "step_ms": 5.0,
        "step_ms_source": "a test",
        "lease_s": 900 * SCALE,
        "start_s": 180 * SCALE,
        "slices": [
            {
                "name": "A",
                "what": "the smoke model under a deadline",
                "seeds": [1],
                "train_s": train_s,
                # too little time: a slice that needs more than the whole lease leaves, whatever the
                # machine's speed (on idle AMD cores, 2026-11-27,
                # a 3 s slice fitted after a quick measurement)
                "min_train_s": 30 if fault == "too-little-time" else 3,
                "chapters": [],
                "chapters_s": 0,
            }
        ],
    }
    ledger = tmp_path / "results" / "paper-slices.yaml"
    ledger.parent.mkdir(parents=True)
    ledger.write_text(yaml.safe_dump(plan))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(REHEARSAL_SITE)
    out, work = tmp_path / "OUT", tmp_path / "work"
    env = {
        **os.environ,
        "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
        "PYTHON": sys.executable,
        "OUT": str(out),
        "WORK": str(work),
        "LEDGER": str(ledger),
        "KIT": str(tmp_path / "no-kit"),
        "REHEARSAL_FAULT": fault,
        "LEFT_S": str(left),
        "COMMAND_S": str(int(600 * SCALE)),
        "RETURN_S": "2",
        "SPARE_S": "2",
        "PACK_S": "4",
        "MIN_BENCH_S": "2",
        "BENCH_S": str(int(110 * SCALE)),
        "HOLD_S": "420",
        "BENCH_ARGS": "--profile smoke --batch 2 --steps 2 --check-steps 2 "
        "--variants eager,cuda-graph,bf16,compile",
    }

    # The clock is scaled, a process's start is not: the measurement may take two processes (a
    # variant that leaves the device unusable, then the rest in a fresh one), each paying the imports
    # before its own budget begins. Their cost, measured here and now (a slow or a busy machine pays
    # more), is added to the scaled budget, so that what the rehearsal tests is the lease's logic.
    if fault == "variant-breaks":  # the one fault that needs the second process; a longer budget elsewhere
        boot = _process_start_s()  # would only let a hanging variant run longer (its cap is the budget's end)
        env["BENCH_S"] = str(int(110 * SCALE + 2 * boot + 1))

    def lease(action):
        t0 = time.time()
        p = subprocess.run(
            ["bash", str(ROOT / "scripts" / "lease.sh"), action],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600 * SCALE + 60,
        )
        wall = time.time() - t0
        assert wall <= 600 * SCALE + 1, f"{action} ran {wall:.0f} s, past the command limit"
        return p, p.stdout + p.stderr

    t0 = time.time()
    started, said = lease("start")
    env["LEFT_S"] = str(int(left - (time.time() - t0)))  # what the device tool's status says then
    finished, said_after = lease("finish")
    assert finished.returncode == 0, said + said_after
    record, names = _packed(out / slices.RESULTS_TGZ)
    assert slices.START_LOG in names, names
    table = (
        pd.read_csv(work / "lease_step.csv").set_index("variant")
        if fault != "too-little-time" or (work / "lease_step.csv").is_file()
        else None
    )
    if fault in ("none", "trainer-hangs", "variant-hangs", "variant-breaks"):
        assert started.returncode == 0, said
        assert record["slice"] == "A" and "lease_step.csv" in names and slices.TRAIN_LOG in names, (
            names,
            said,
        )
        assert table.loc["eager", "status"] == "ran"
    if fault == "none":
        assert record["training_stop"] == slices_run.ENDED_ITSELF
        assert record["ends"]["1"]["ended"] == "cut"
        assert record["train_step_ran"]["1"]["ran"] == "eager"
        assert "runs/smoke-seed1/metrics.csv.gz" in names and "runs/smoke-seed1/step.json" in names
    if fault == "trainer-hangs":
        assert record["training_stop"].startswith("killed (SIGKILL)"), record["training_stop"]
        assert record["ends"]["1"] is None  # nothing saved, and said so
    if fault == "variant-hangs":
        assert table.loc["bf16", "status"].startswith("failed: still running at its cap")
        assert table.loc["compile", "status"] == "not run: bf16 hung"
    if fault == "variant-breaks":
        assert (
            table.loc["bf16", "status"]
            == "failed: RuntimeError: CUDA error: an illegal memory access was encountered"
        )
        assert "compile: not run: the device is unusable after bf16's error" in said  # then a fresh process:
        assert table.loc["compile", "status"].startswith("skipped: needs about"), (
            said
        )  # (a compile's minute, not here)
        assert "lease_step_errors.log" in names
    if fault == "too-little-time":
        assert started.returncode == 2 and "the step's measurement cut to" in said, said
        assert record["slice"] is None and re.fullmatch(
            r"no slice fits this lease: slice A needs at least \d+ s "
            r"\(training 30 s .*\) but -?\d+ s are left",
            record["refused"],
        )
    if fault == "no-kit":
        assert (
            started.returncode == 3
            and record["slice"] is None
            and record["refused"].startswith("no slice started")
        )
        assert table.loc["eager", "status"] == "ran"
