"""Where several training runs go: Dask distributed, on this machine or on many.

    with cluster() as client:            # or cluster("tcp://HOST:8786"), cluster("slurm.yaml")
        folders = run_all(client, train_seed, [(profile, folder, None), ...])

The cluster is `cluster`'s argument, else $MCLIB_CLUSTER (set by the CLI's `--cluster`, so
the book's chapter kernels use it too), else local: worker processes on 127.0.0.1, one task
each, as many as the cores hold (`local_workers`). A scheduler address must answer within
`connect_timeout` s; a jobqueue YAML (`jobqueue_spec`) starts SLURM/PBS/... workers. A task
whose worker died is retried by Dask, and training resumes from the run folder's newest
checkpoint (folders must be on a file system every worker sees). CUDA runs ask for the
resource `GPU: 1` (`resources_for`): a cluster's GPU workers need `--resources GPU=1`.
Nothing here imports torch or distributed at import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import ValidationError

from .schema import POSITIVE, Int, Schema, Str, one_of, problems

ENV = "MCLIB_CLUSTER"
CONNECT_TIMEOUT = 10.0  # seconds to reach a running scheduler
JOBQUEUE_KINDS = ("slurm", "pbs", "sge", "lsf", "htcondor", "moab", "oar")


class ClusterError(RuntimeError):
    """The cluster cannot be used (unreachable scheduler, bad jobqueue file); one line."""


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def local_workers(threads_per_run: int, gpu: bool = False) -> int:
    """How many runs the local cluster trains at once: as many as the cores hold at
    `threads_per_run` threads each (small models run faster one thread a run:
    benchmarks/cores.py); one with torch's default threads (0); one per GPU with `gpu`."""
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
    import torch  # noqa: PLC0415 - torch: at use (module doc)

    return torch.cuda.is_available()


def resources_for(profile) -> dict[str, float] | None:
    """The worker resources a run of `profile` asks for: one GPU on CUDA, none on the CPU."""
    return {"GPU": 1} if needs_gpu(profile) else None


class _Jobqueue(Schema):
    """A jobqueue file's keys (`jobqueue_spec`)."""

    jobqueue: Annotated[Str, one_of(JOBQUEUE_KINDS)]
    workers: Annotated[Int, POSITIVE] = 1
    options: dict[str, Any] | None = None  # dask_jobqueue's, passed to its cluster as they are


def jobqueue_spec(path: str | Path) -> tuple[type, dict[str, Any], int]:
    """Read a jobqueue YAML: (dask_jobqueue cluster class, its keyword arguments, workers).

        jobqueue: slurm             # slurm, pbs, sge, lsf, htcondor, moab or oar
        workers: 4                  # worker jobs to start (cluster.scale(jobs=...))
        options: {queue: gpu, cores: 1, memory: 16GB, worker_extra_args: ["--resources", "GPU=1"]}

    A missing file, an unknown key or kind, or a bad value raises ClusterError, one line naming
    the file, the key and the value (the schema: `_Jobqueue`)."""
    from .config import read_yaml  # noqa: PLC0415 - config loads torch (module doc)

    try:
        spec = _Jobqueue.model_validate(read_yaml(path, "jobqueue", ClusterError))
    except ValidationError as e:
        raise ClusterError(f"{path}: {problems(e, _Jobqueue, 'jobqueue')[0][1]}") from None
    kind, options, workers = spec.jobqueue, spec.options or {}, spec.workers
    import dask_jobqueue  # noqa: PLC0415 - optional, a jobqueue file only

    cls = getattr(
        dask_jobqueue,
        {
            "slurm": "SLURMCluster",
            "pbs": "PBSCluster",
            "sge": "SGECluster",
            "lsf": "LSFCluster",
            "htcondor": "HTCondorCluster",
            "moab": "MoabCluster",
            "oar": "OARCluster",
        }[kind],
    )
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
    from distributed import Client  # noqa: PLC0415 - distributed: at use (module doc)

    try:
        return Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise ClusterError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s ({type(e).__name__})"
        ) from None


@contextlib.contextmanager
def cluster(
    address: str | None = None,
    threads_per_run: int = 1,
    gpu: bool = False,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> Iterator:
    """A `distributed.Client` for the block. address: None (local, unless $MCLIB_CLUSTER), a
    scheduler's "tcp://HOST:PORT", or a jobqueue .yaml/.yml file. threads_per_run, gpu: size
    the local cluster only (`local_workers`; gpu: workers offer GPU=1)."""
    from distributed import Client  # noqa: PLC0415 - distributed: at use (module doc)

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
    import torch  # noqa: PLC0415 - torch: at use (module doc)

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_workers(n_gpus: int, env: dict[str, str]) -> dict[str, dict]:
    """The local cluster's worker specs (distributed.SpecCluster) on `n_gpus` GPUs: one per GPU,
    each seeing only its own (CUDA_VISIBLE_DEVICES) and offering GPU=1."""
    from distributed import Nanny  # noqa: PLC0415 - distributed: at use (module doc)

    return {
        f"gpu{i}": {
            "cls": Nanny,
            "options": {
                "nthreads": 1,
                "memory_limit": 0,
                "host": "127.0.0.1",
                "resources": {"GPU": 1},
                "env": {**env, "CUDA_VISIBLE_DEVICES": str(i)},
            },
        }
        for i in range(max(1, n_gpus))
    }


def _local(threads_per_run: int, gpu: bool):
    import dask  # noqa: PLC0415 - distributed: at use (module doc)
    from distributed import Client, LocalCluster, Scheduler, SpecCluster  # noqa: PLC0415 - distributed: at use (module doc)

    threads = str(threads_per_run or cores())
    # Dask's nanny sets MALLOC_TRIM_THRESHOLD_ in every worker; any explicit malloc setting turns
    # off glibc's adaptive mmap threshold and slows the step (docs/performance.md): not passed on.
    spawn_env = {
        k: v
        for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()
        if k != "MALLOC_TRIM_THRESHOLD_"
    }
    # Dask sets OMP_NUM_THREADS=1 (and MKL's, OpenBLAS's) in a worker; a run with torch's
    # default threads (0) should have the cores instead
    env = {k: threads for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn_env}):
        if gpu and gpu_count() > 1:
            local = SpecCluster(
                workers=gpu_workers(gpu_count(), env),
                silence_logs=logging.ERROR,
                scheduler={
                    "cls": Scheduler,
                    "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
                },
            )
        else:
            local = LocalCluster(
                n_workers=local_workers(threads_per_run, gpu),
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
                memory_limit=0,
                silence_logs=logging.ERROR,
                resources={"GPU": 1} if gpu else None,
                # no dashboard; the scheduler's small HTTP server (health) on any free loopback port
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                env=env,
            )
    with local, Client(local, set_as_default=False) as client:
        yield client


def submit(
    client, fn: Callable, jobs: list[tuple], resources: dict | None = None, names: list[str] | None = None
) -> list:
    """`client.submit(fn, *job)` for each job: futures, in the order of `jobs`. `fn` must
    be importable (module-level). names: readable task keys (made unique here)."""
    names = names or [getattr(fn, "__name__", "job")] * len(jobs)
    return [
        client.submit(fn, *job, key=f"{name}-{uuid.uuid4().hex[:8]}", pure=False, resources=resources)
        for name, job in zip(names, jobs)
    ]


def slots(client) -> int:
    """How many tasks the cluster's workers run at once (their threads, at least 1)."""
    return max(1, sum(w["nthreads"] for w in client.scheduler_info()["workers"].values()))


def submit_when_free(
    client,
    fn: Callable,
    jobs: list[tuple],
    resources: dict | None = None,
    names: list[str] | None = None,
    *,
    busy: list = (),
    poll: float = 1.0,
) -> list:
    """`submit` each job only once a worker thread is free (`slots`, counting the `busy` futures),
    so each job starts on the first worker that frees instead of queueing behind a long one on
    the worker Dask placed it on; the futures, in the order of `jobs`. poll: seconds between looks."""
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
    from distributed import as_completed  # noqa: PLC0415 - distributed: at use (module doc)

    with contextlib.suppress(TimeoutError, StopIteration):
        next(as_completed(futures, loop=client.loop, timeout=timeout))


def _free_slot(client, running: list, poll: float, until=None) -> list:
    """Wait until fewer of `running` still run than the workers have threads, or until `until` has
    ended; returns those still running. Woken by the first of them to end (`first_done`), and every
    `poll` seconds all the same, so that workers that join meanwhile count."""
    running = [f for f in running if not f.done()]
    while len(running) >= slots(client) and not (until is not None and until.done()):
        watched = running + ([until] if until is not None else [])
        if not watched:  # no worker yet and nothing running: only a joining worker frees a slot
            time.sleep(poll)
        else:
            first_done(client, watched, poll)  # none ended within poll: count the workers again
        running = [f for f in running if not f.done()]
    return running


def submit_while(
    client,
    tasks: list[tuple[Callable, tuple, str]],
    until,
    resources: dict | None = None,
    *,
    busy: list = (),
    poll: float = 1.0,
) -> list:
    """While the future `until` runs, submit each task (fn, args, name) in order once a worker
    thread is free of the `busy` futures; the futures of those submitted (a prefix of `tasks`).
    The book fills idle workers this way while its long run trains (`mclib.book.chapter.idle_tasks`)."""
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
    """Wait for every future, then their results in order; the first that failed raises its own
    exception, after the others have ended."""
    wait_ended(futures)
    return [f.result() for f in futures]


def run_all(client, fn: Callable, jobs: list[tuple], resources: dict | None = None) -> list:
    """`[fn(*job) for job in jobs]` on the cluster, each started when a worker frees; results in order."""
    return results(submit_when_free(client, fn, jobs, resources))


def run_profile_jobs(profile, fn: Callable, jobs: list[tuple], address: str | None = None) -> list:
    """`run_all` of jobs that train runs of `profile`, on a cluster sized for it; no cluster is
    started without jobs."""
    if not jobs:
        return []
    with cluster(address, threads_per_run=profile.train.threads, gpu=needs_gpu(profile)) as client:
        return run_all(client, fn, jobs, resources_for(profile))
