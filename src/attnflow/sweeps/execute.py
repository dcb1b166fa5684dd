"""Execution: a sweep's tasks on Dask (a LocalCluster, a running cluster) or in this
process, their results written into the store as they finish.

Schedulers and resume: the `attnflow.sweeps` docstring ("Execution", "Store and resume").
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import xarray as xr

from attnflow._checks import fail, integer
from attnflow._progress import progress_bar
from attnflow.sweeps.spec import SweepSpec, parse_spec
from attnflow.sweeps.store import open_store, pending, write
from attnflow.sweeps.tasks import Task, TaskResult, message, plan, run_task

UNTRIM = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
HEALTH_ROUTE = "distributed.http.health"  # the only HTTP route without a dashboard
WORKERS_PER_CPU = 4  # the most worker processes a local cluster starts, per CPU


class SweepIncompleteError(RuntimeError):
    """Some tasks did not finish (their workers kept dying, say); the store holds all the
    others, and rerunning the same sweep retries exactly the missing ones."""

    def __init__(self, errors: list[tuple[str, BaseException]], total: int):
        self.errors = errors
        label, first = errors[0]
        super().__init__(f"{len(errors)} of {total} tasks did not finish (task {label}: "
                         f"{message(first)}); rerun the same sweep to retry them")


Outcomes = Iterator[tuple[Task, "TaskResult | BaseException"]]


def _check_scheduler(scheduler: Any, workers: int | None, dashboard: str | None,
                     security: Any = None) -> None:
    own_cluster = scheduler is None
    if isinstance(scheduler, str):
        known = scheduler == "serial" or "://" in scheduler
    else:
        from distributed import Client

        known = own_cluster or isinstance(scheduler, Client)
    if not known:
        raise fail("scheduler", "None, 'serial', an address like tcp://host:8786 or a "
                   "distributed.Client", repr(scheduler))
    if not own_cluster and (workers is not None or dashboard is not None):
        raise fail("workers/dashboard", "None unless sweep starts its own local cluster "
                   "(scheduler=None)", f"workers={workers}, dashboard={dashboard}")
    if workers is not None:
        cpus = len(os.sched_getaffinity(0))
        integer("workers", workers, 1, WORKERS_PER_CPU * cpus, expected="a number of worker "
                f"processes in [1, {WORKERS_PER_CPU * cpus}] ({WORKERS_PER_CPU} per CPU here)")
    if security is not None:
        from distributed.security import Security

        if not (isinstance(scheduler, str) and "://" in scheduler):
            raise fail("security", "None unless scheduler is an address (the local cluster "
                       "makes its own credentials; a Client has its own)",
                       f"a security object with scheduler={scheduler!r}")
        if not isinstance(security, Security):
            raise fail("security", "a distributed.security.Security", repr(security))


def local_cluster(workers: int | None = None, dashboard: str | None = None) -> Any:
    """The LocalCluster a sweep starts by default: `workers` single-threaded worker processes
    (default: one per CPU), each with one kernel thread (ATTNFLOW_THREADS=1), listening on
    127.0.0.1 only, with a dashboard only at `dashboard` (e.g. "127.0.0.1:8787"); without
    one, the scheduler's and the workers' HTTP ports serve /health alone.

    Its scheduler and workers talk TLS with temporary credentials made for this cluster
    (`distributed.security.Security.temporary()`: a self-signed certificate held in memory
    and handed to the worker processes), so another process on the machine cannot join it or
    submit work: it must present that certificate. `Client(cluster)` gets them from
    ``cluster.security``."""
    import dask
    from distributed import LocalCluster
    from distributed.security import Security

    # Without a dashboard the scheduler still serves HTTP (plain, unauthenticated), by default
    # on 8787: an ephemeral loopback port instead leaves 8787 alone, and its routes, and the
    # workers', are /health only (Dask's defaults add the logs, the call stacks, the workers'
    # pages, the identity, the event stream and the Prometheus metrics). Dask's nanny sets
    # MALLOC_TRIM_THRESHOLD_=65536 in its workers, which turns glibc's adaptive mmap threshold
    # off: every (batch, n, n) temporary is then mmapped and page-faulted afresh, 1.8x slower
    # here; None unsets it.
    routes = {} if dashboard else {f"distributed.{who}.http.routes": [HEALTH_ROUTE]
                                   for who in ("scheduler", "worker")}
    with dask.config.set({UNTRIM: None, **routes}):
        return LocalCluster(
            n_workers=len(os.sched_getaffinity(0)) if workers is None else workers,
            threads_per_worker=1, processes=True, host="127.0.0.1", protocol="tls://",
            security=Security.temporary(),
            dashboard_address=dashboard, worker_dashboard_address=None,
            scheduler_kwargs={"dashboard_address": dashboard or "127.0.0.1:0"},
            env={"ATTNFLOW_THREADS": "1"})  # the workers share the CPUs


@contextlib.contextmanager
def _executor(scheduler: Any, workers: int | None, dashboard: str | None, security: Any
              ) -> Iterator[Callable[[list[Task]], Outcomes]]:
    """A function mapping tasks to (task, result or exception) in order of completion."""
    if isinstance(scheduler, str) and scheduler == "serial":
        yield lambda tasks: ((t, _attempt(t)) for t in tasks)
        return
    from distributed import Client, as_completed

    with contextlib.ExitStack() as stack:
        if isinstance(scheduler, Client):
            client = scheduler
        elif scheduler is None:
            cluster = stack.enter_context(local_cluster(workers, dashboard))
            client = stack.enter_context(Client(cluster, set_as_default=False))  # its TLS
        else:
            client = stack.enter_context(Client(scheduler, timeout="30s", security=security,
                                                set_as_default=False))
        session = os.urandom(4).hex()

        def run(tasks: list[Task]) -> Outcomes:
            by_key = {f"attnflow-sweep-{session}-{t.label}": t for t in tasks}
            futures = client.map(run_task, tasks, key=list(by_key), pure=False)
            for future in as_completed(futures, loop=client.loop):
                try:
                    yield by_key[future.key], future.result()
                except Exception as err:
                    yield by_key[future.key], err
                future.release()

        yield run


def _attempt(task: Task) -> TaskResult | BaseException:
    try:
        return run_task(task)
    except Exception as err:
        return err


def sweep(
    grid: Mapping[str, Any] | SweepSpec,
    keep: Mapping[str, Any] | None = None,
    *,
    batch: int | None = None,
    entropy: int = 0,
    out: str | os.PathLike | None = None,
    scheduler: Any = None,
    workers: int | None = None,
    dashboard: str | None = None,
    security: Any = None,
    progress: bool | Callable[[int, int], None] = False,
) -> xr.Dataset:
    """Run a parameter sweep and return its results as an xarray Dataset.

    Parameters
    ----------
    grid : the [grid] table of the spec as a dict (see the `attnflow.sweeps` docstring), e.g.
        ``{"beta": [1, 4, 16], "n": 32, "d": 2, "t_end": 20, "seeds": 8}``; or a SweepSpec
        from `load_spec` (then keep, batch and entropy come from it).
    keep : the [keep] table (default: every metric, no states).
    batch, entropy : runs per task and root seed (the `attnflow.sweeps` docstring).
    out : the Zarr store (``.zarr`` directory), created or resumed. None: a temporary store,
        loaded into memory and deleted.
    scheduler : None (a LocalCluster on 127.0.0.1; it spawns worker processes, so a script
        calling this needs the ``if __name__ == "__main__":`` guard), "serial" (this
        process, no Dask: best for small grids), a scheduler address such as
        "tls://10.0.0.5:8786", or a distributed.Client. The LocalCluster talks TLS with
        temporary credentials of its own, so no other process can join it (`local_cluster`).
    security : a `distributed.security.Security` with the credentials to connect to the
        scheduler at an address, e.g. ``Security(tls_ca_file="ca.pem",
        tls_client_cert="me.pem", tls_client_key="me.key", require_encryption=True)``;
        None: Dask's configuration (``distributed.comm.tls.*``). Only with an address.
    workers : worker processes of the LocalCluster (default: one per CPU).
    dashboard : address for the LocalCluster's dashboard, e.g. "127.0.0.1:8787" (default: none).
    progress : True for a progress bar on stderr, or a callable receiving (runs finished,
        runs in all), first with the runs an earlier attempt already finished.

    Returns
    -------
    xr.Dataset
        The Dataset of the store: one variable per metric on dims (grid axes..., seed,
        time), ``states`` on (..., seed, time, token, coord) if kept, ``status`` and
        ``error`` on (..., seed); the grid fields given as one value are scalar coordinates.
        Opened lazily from `out` when given.

    Raises
    ------
    ValueError
        For a bad spec (naming the field).
    SweepIncompleteError
        When tasks could not be finished (the rest is stored; rerun to retry).
    """
    if isinstance(grid, SweepSpec):
        if keep is not None or batch is not None or entropy != 0:
            raise fail("keep/batch/entropy", "None with a SweepSpec (they are part of it)",
                       f"keep={keep}, batch={batch}, entropy={entropy}")
        spec = grid
    else:
        raw = {"grid": grid, "keep": {} if keep is None else keep, "entropy": entropy}
        spec = parse_spec(raw if batch is None else {**raw, "batch": batch})
    if out is None:
        with tempfile.TemporaryDirectory(prefix="attnflow-sweep-") as tmp:
            return sweep(spec, out=Path(tmp) / "sweep.zarr", scheduler=scheduler,
                         workers=workers, dashboard=dashboard, security=security,
                         progress=progress).load()
    _check_scheduler(scheduler, workers, dashboard, security)
    path = Path(out)
    group = open_store(path, spec)
    tasks = pending(group, plan(spec))
    finished = spec.n_runs - sum(len(t.seeds) for t in tasks)
    lost: list[tuple[str, BaseException]] = []
    with contextlib.ExitStack() as stack:
        bar = stack.enter_context(progress_bar(
            progress, spec.n_runs, "sweeping", "{task.completed:.0f} / {task.total:.0f} runs",
            forward=lambda callback, done: callback(done, spec.n_runs)))
        report = bar or (lambda done: None)
        report(finished)
        run = (stack.enter_context(_executor(scheduler, workers, dashboard, security))
               if tasks else list)
        for task, outcome in run(tasks):
            if isinstance(outcome, BaseException):
                lost.append((task.label, outcome))
                continue
            write(group, task, outcome)
            finished += len(task.seeds)
            report(finished)
    if lost:
        raise SweepIncompleteError(lost, len(tasks))
    ds = xr.open_zarr(path, consolidated=False)
    return ds[[*spec.keep.metrics, *(["states"] if spec.keep.states else []), "status", "error"]]
