"""Where several training runs go: Dask distributed, on this machine or on many.

    from mclib.core.jobs import cluster, run_all
    with cluster() as client:                     # or cluster("tcp://HOST:8786"), cluster("slurm.yaml")
        folders = run_all(client, train_seed, [(profile, folder, None), ...])

Three kinds of cluster, one code path (a `distributed.Client`):

- **local** (the default): an embedded `LocalCluster` of worker processes, one task
  each (`threads_per_worker=1`), as many as the cores hold at `threads_per_run` threads
  a run (`local_workers`); listening on 127.0.0.1 only, no dashboard. A worker process
  ends with the process that started it (Dask's nanny watches its parent).
- **a running scheduler**, `tcp://HOST:8786`: started by hand with `dask scheduler` and
  `dask worker` (README, "More than one machine"). One that cannot be reached within
  `connect_timeout` seconds raises `ClusterError`, one line naming the address.
- **a batch system** (SLURM, PBS, ...): a YAML file read by `jobqueue_spec` and started
  with dask-jobqueue (README; `sweeps/slurm.example.yaml`).

The address comes from the argument, else the environment variable MCLIB_CLUSTER (the
CLI's `--cluster` sets it, so that the book's chapters, run by papermill in their own
kernels, submit to the same cluster), else the local cluster.

A task that was running on a worker that died is run again on another worker (Dask's
own retry, up to `distributed.scheduler.allowed-failures` times). Training resumes from
the newest checkpoint of its run folder, so a retried run continues where it stopped
(the folders must be on a file system that every worker sees). A run asks for a worker
resource `GPU: 1` when it trains on CUDA (`resources_for`); workers of a cluster that
has GPUs must be started with `--resources GPU=1`, else such a run waits forever.

Every place that trains several runs gets its cluster and submits here: the seeds
(`mclib.core.train.train_seeds`), E15's runs (`mclib.analyses.freezing.freeze_runs`),
the book's schedule of both (`mclib.book.chapter.train_runs`) and the sweeps
(`mclib.core.sweep`, which polls its futures itself to report progress). What a job
does is theirs; where and when it runs is this module's.

This module imports neither torch nor distributed at import time.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

ENV = "MCLIB_CLUSTER"
CONNECT_TIMEOUT = 10.0  # seconds to reach a running scheduler
JOBQUEUE_KINDS = ("slurm", "pbs", "sge", "lsf", "htcondor", "moab", "oar")
JOBQUEUE_KEYS = ("jobqueue", "workers", "options")


class ClusterError(RuntimeError):
    """The cluster cannot be used (unreachable scheduler, bad jobqueue file); one line."""


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def local_workers(threads_per_run: int, gpu: bool = False) -> int:
    """How many runs of the local cluster train at once: as many as the cores hold at
    `threads_per_run` threads each (the cpu profile's matrices are too small to keep two
    threads busy, so two one-thread runs finish a pair sooner than one two-thread run
    after another: benchmarks/cores.py). With torch's default threads (0), one run at a
    time: it has the whole machine. On GPUs, one run per GPU (`gpu_workers`)."""
    if gpu:
        return max(1, gpu_count())
    if not threads_per_run:
        return 1
    return max(1, cores() // threads_per_run)


def needs_gpu(profile) -> bool:
    """Whether a run of `profile` trains on CUDA (as seen from the submitting process:
    `train.device: cuda`, or `auto` where this process has a CUDA device)."""
    device = profile.train.device
    if device == "cuda":
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def resources_for(profile) -> dict[str, float] | None:
    """The worker resources a run of `profile` asks for: one GPU on CUDA, none on the CPU."""
    return {"GPU": 1} if needs_gpu(profile) else None


def jobqueue_spec(path: str | Path) -> tuple[type, dict[str, Any], int]:
    """Read a jobqueue YAML: (dask_jobqueue cluster class, its keyword arguments, workers).

        jobqueue: slurm             # slurm, pbs, sge, lsf, htcondor, moab or oar
        workers: 4                  # how many worker jobs to start (cluster.scale(jobs=...))
        options:                    # passed as they are to dask_jobqueue.SLURMCluster(...)
          queue: gpu
          cores: 1
          memory: 16GB
          walltime: "08:00:00"
          job_extra_directives: ["--gres=gpu:1"]
          worker_extra_args: ["--resources", "GPU=1"]

    A missing file, an unknown key or kind raises ClusterError naming it."""
    from .config import read_yaml

    path = Path(path)
    raw = read_yaml(path, "jobqueue", ClusterError)
    if not isinstance(raw, dict):
        raise ClusterError(f"jobqueue file {str(path)!r} is not a mapping")
    for key in raw:
        if key not in JOBQUEUE_KEYS:
            raise ClusterError(f"{path}: unknown key {key} (known: {', '.join(JOBQUEUE_KEYS)})")
    kind = raw.get("jobqueue")
    if kind not in JOBQUEUE_KINDS:
        raise ClusterError(f"{path}: jobqueue = {kind!r} is not one of {', '.join(JOBQUEUE_KINDS)}")
    workers = raw.get("workers", 1)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ClusterError(f"{path}: workers = {workers!r} is not a positive integer")
    options = raw.get("options") or {}
    if not isinstance(options, dict):
        raise ClusterError(f"{path}: options = {options!r} is not a mapping")
    import dask_jobqueue

    cls = getattr(dask_jobqueue, {"slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster",
                                  "lsf": "LSFCluster", "htcondor": "HTCondorCluster", "moab": "MoabCluster",
                                  "oar": "OARCluster"}[kind])
    return cls, options, workers


def resolve_address(address: str | None) -> str | None:
    """The cluster to use: `address`, else $MCLIB_CLUSTER, else None (the local cluster).
    "local" (or an empty string) also means the local cluster."""
    if address is None:
        address = os.environ.get(ENV)
    if not address or address == "local":
        return None
    return address


def _connect(address: str, timeout: float):
    from distributed import Client

    try:
        return Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"cannot reach the Dask scheduler at {address} within {timeout:g} s "
                           f"({type(e).__name__})") from None


@contextlib.contextmanager
def cluster(address: str | None = None, threads_per_run: int = 1, gpu: bool = False,
            connect_timeout: float = CONNECT_TIMEOUT) -> Iterator:
    """A `distributed.Client` for as long as the block runs (see the module's doc).

    address: None (the local cluster, unless $MCLIB_CLUSTER names one), "tcp://HOST:PORT"
    (a running scheduler) or a jobqueue YAML file (a path ending in .yaml or .yml).
    threads_per_run, gpu: the size of the local cluster (`local_workers`); with gpu its
    worker offers the resource GPU=1. Ignored for other clusters, whose workers were sized
    when they were started."""
    from distributed import Client

    address = resolve_address(address)
    if address is None:
        yield from _local(threads_per_run, gpu)
        return
    if address.endswith((".yaml", ".yml")):
        cls, options, workers = jobqueue_spec(address)
        with cls(**options) as batch:
            batch.scale(jobs=workers)
            with Client(batch, set_as_default=False) as client:
                yield client
        return
    client = _connect(address, connect_timeout)
    try:
        yield client
    finally:
        client.close()


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_workers(n_gpus: int, env: dict[str, str]) -> dict[str, dict]:
    """The local cluster's workers on a machine with `n_gpus` GPUs: one per GPU, each seeing
    only its own (CUDA_VISIBLE_DEVICES), so every run's `cuda` is a different device, and each
    offering the resource GPU=1 that GPU runs ask for. As distributed.SpecCluster specs."""
    from distributed import Nanny

    return {f"gpu{i}": {"cls": Nanny, "options": {"nthreads": 1, "memory_limit": 0, "host": "127.0.0.1",
                                                   "resources": {"GPU": 1},
                                                   "env": {**env, "CUDA_VISIBLE_DEVICES": str(i)}}}
            for i in range(max(1, n_gpus))}


def _local(threads_per_run: int, gpu: bool):
    import dask
    from distributed import Client, LocalCluster, Scheduler, SpecCluster

    threads = str(threads_per_run or cores())
    # Dask's nanny sets MALLOC_TRIM_THRESHOLD_ in every worker. Any explicit malloc setting
    # turns off glibc's adaptive mmap threshold, so every large tensor of every training
    # step is mapped and faulted in afresh: 1.4x the cpu profile's step time (sys time
    # 3 -> 30 ms a step; docs/performance.md). The workers keep glibc's own behaviour.
    spawn_env = {k: v for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()
                 if k != "MALLOC_TRIM_THRESHOLD_"}
    # Dask sets OMP_NUM_THREADS=1 (and MKL's, OpenBLAS's) in a worker; a run with torch's
    # default threads (0) should have the cores instead
    env = {k: threads for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn_env}):
        if gpu and gpu_count() > 1:
            local = SpecCluster(workers=gpu_workers(gpu_count(), env), silence_logs=logging.ERROR,
                                scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1",
                                                                         "dashboard_address": "127.0.0.1:0"}})
        else:
            local = LocalCluster(n_workers=local_workers(threads_per_run, gpu), threads_per_worker=1,
                                 processes=True, host="127.0.0.1", dashboard_address=None, memory_limit=0,
                                 silence_logs=logging.ERROR, resources={"GPU": 1} if gpu else None,
                                 # no dashboard; the scheduler's small HTTP server (health) on any free loopback port
                                 scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}, env=env)
    with local, Client(local, set_as_default=False) as client:
        yield client


def submit(client, fn: Callable, jobs: list[tuple], resources: dict | None = None,
           names: list[str] | None = None) -> list:
    """`client.submit(fn, *job)` for each job: futures, in the order of `jobs`. `fn` must
    be importable (module-level). names: readable task keys (made unique here)."""
    names = names or [getattr(fn, "__name__", "job")] * len(jobs)
    return [client.submit(fn, *job, key=f"{name}-{uuid.uuid4().hex[:8]}", pure=False, resources=resources)
            for name, job in zip(names, jobs)]


def slots(client) -> int:
    """How many tasks the cluster's workers run at once (their threads, summed; at least 1,
    for a batch system whose workers are still starting)."""
    return max(1, sum(w["nthreads"] for w in client.scheduler_info()["workers"].values()))


def submit_when_free(client, fn: Callable, jobs: list[tuple], resources: dict | None = None,
                     names: list[str] | None = None, *, busy: list = (), poll: float = 1.0) -> list:
    """`submit` each job only once a worker thread is free (`slots`, counting the `busy`
    futures still running); returns once every job is submitted, the futures in the
    order of `jobs`. Dask places a task on a worker when it is submitted, and a task of
    unknown length can wait there behind a long one while another worker idles (measured
    on 2026-11-23: E15's attention run waited ~5 minutes behind the positional run while
    the other worker idled); submitted this way, each job starts on the first worker that
    frees. poll: seconds between looks at the running jobs and the workers."""
    names = names or [getattr(fn, "__name__", "job")] * len(jobs)
    running, futures = list(busy), []
    for job, name in zip(jobs, names):
        running = _free_slot(client, running, poll)
        (f,) = submit(client, fn, [job], resources, [name])
        futures.append(f)
        running.append(f)
    return futures


def first_done(client, futures: list, timeout: float) -> None:
    """Return once one of `futures` has ended, or after `timeout` seconds (distributed's
    `as_completed` on `client`'s loop: the client need not be the process's default one)."""
    from distributed import as_completed

    with contextlib.suppress(TimeoutError, StopIteration):
        next(as_completed(futures, loop=client.loop, timeout=timeout))


def _free_slot(client, running: list, poll: float, until=None) -> list:
    """Wait until fewer of the futures `running` still run than the workers have threads
    (`slots`), or until the future `until` has ended; the ones still running. Woken by the
    first of them to end (`distributed.wait`, FIRST_COMPLETED), and every `poll` seconds
    all the same, to count the workers that join meanwhile, as a batch system's do."""
    running = [f for f in running if not f.done()]
    while len(running) >= slots(client) and not (until is not None and until.done()):
        watched = running + ([until] if until is not None else [])
        if not watched:  # no worker yet and nothing running: only a joining worker frees a slot
            time.sleep(poll)
        else:
            first_done(client, watched, poll)  # none ended within poll: count the workers again
        running = [f for f in running if not f.done()]
    return running


def submit_while(client, tasks: list[tuple[Callable, tuple, str]], until, resources: dict | None = None, *,
                 busy: list = (), poll: float = 1.0) -> list:
    """Fill the workers that `busy` futures leave idle, for as long as the future `until`
    runs: each task (fn, args, name) is submitted once a worker thread is free, in order,
    and none once `until` has ended. Returns the futures of the tasks submitted (a prefix
    of `tasks`); the rest are left to whoever needs them later. The book uses it to do,
    while its long run trains alone, work that later chapters would otherwise do after it
    (`mclib.book.chapter.idle_tasks`)."""
    running, futures = list(busy), []
    for fn, args, name in tasks:
        running = _free_slot(client, running, poll, until)
        if until.done():
            break
        (f,) = submit(client, fn, [args], resources, [name])
        futures.append(f)
        running.append(f)
    return futures


def wait_ended(futures: list) -> None:
    """Return once every future has ended, whether it failed or not."""
    for f in futures:
        with contextlib.suppress(Exception):
            f.exception()  # blocks until the task has ended, either way


def results(futures: list) -> list:
    """Wait for every future, then their results in order; the first that failed (in
    that order) raises its own exception here, after the others have ended."""
    wait_ended(futures)
    return [f.result() for f in futures]


def run_all(client, fn: Callable, jobs: list[tuple], resources: dict | None = None) -> list:
    """`[fn(*job) for job in jobs]` on the cluster's workers, each job started by the first
    worker that frees (`submit_when_free`); results in order of `jobs`."""
    return results(submit_when_free(client, fn, jobs, resources))


def run_profile_jobs(profile, fn: Callable, jobs: list[tuple], address: str | None = None) -> list:
    """`run_all` of jobs that train runs of `profile`, on a cluster sized for it (its
    threads a run, a GPU resource on CUDA); no cluster is started when there is no job."""
    if not jobs:
        return []
    with cluster(address, threads_per_run=profile.train.threads, gpu=needs_gpu(profile)) as client:
        return run_all(client, fn, jobs, resources_for(profile))
