"""Sweeps: spec validation, per-run seeds, metrics against independent computations, failure
recording, and real Dask processes on 127.0.0.1 (a `dask scheduler` with `dask worker`s, a
LocalCluster), with a worker and the driver killed mid-sweep."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import xarray as xr
from typer.testing import CliRunner

import attnflow
from attnflow import sweep as sweep_fn
from attnflow.analysis.clusters import cluster_count
from attnflow.cli import app
from attnflow.sweeps import DEFAULT_METRICS, load_spec, parse_spec, sweep_status

pytestmark = pytest.mark.timeout(120)

# The sweep the process tests share: 3 x 16 = 48 runs in 24 tasks of ~0.05 s.
SHARED_SPEC = """\
batch = 2
[grid]
beta = [1, 4, 16]
n = 32
d = 2
V = "identity"
t_end = 15
dt = 0.05
save_at = 11
seeds = 16
"""


def _spec(tmp_path: Path, text: str = SHARED_SPEC) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> xr.Dataset:
    """The shared sweep run serially in this process: the truth every cluster run must equal
    bit for bit."""
    tmp = tmp_path_factory.mktemp("reference")
    return sweep_fn(load_spec(_spec(tmp)), scheduler="serial").load()


def _store(path: Path) -> xr.Dataset:
    with xr.open_zarr(path, consolidated=False) as ds:
        return ds.load()


def _assert_same(store: Path, reference: xr.Dataset) -> None:
    got = _store(store)
    assert (got.status.values == 1).all()
    xr.testing.assert_identical(got[list(reference.data_vars)], reference)


# ---------------------------------------------------------------------------- the spec
GOOD = {"beta": [1.0, 4.0], "n": 8, "d": 2, "t_end": 1.0, "seeds": 2}


@pytest.mark.parametrize("grid, keep, field", [
    ({**GOOD, "bta": 1.0}, {}, "grid.bta"),  # unknown field
    ({**GOOD, "n": "8"}, {}, "grid.n"),  # wrong type
    ({**GOOD, "n": 8.5}, {}, "grid.n"),
    ({**GOOD, "beta": [1.0, "hot"]}, {}, "grid.beta[1]"),
    ({**GOOD, "beta": []}, {}, "grid.beta"),  # empty grid axis
    ({**GOOD, "seeds": []}, {}, "grid.seeds"),
    ({**GOOD, "seeds": 0}, {}, "grid.seeds"),
    ({k: v for k, v in GOOD.items() if k != "beta"}, {}, "grid.beta"),  # missing
    ({**GOOD, "beta": [1.0, 1.0]}, {}, "grid.beta"),  # duplicates
    ({**GOOD, "t_end": [1.0, 2.0]}, {}, "grid.t_end"),
    ({**GOOD, "save_at": [0.5, 2.0]}, {}, "grid.save_at"),  # beyond t_end
    ({**GOOD, "method": "leapfrog"}, {}, "grid.method"),
    ({**GOOD, "mask": "window:0"}, {}, "grid.mask"),
    ({**GOOD, "d": [2, 3], "V": "diag:1,2"}, {}, "grid.V"),  # 2 eigenvalues for d = 3
    ({**GOOD, "dt": -0.1}, {}, "grid.dt"),
    ({**GOOD, "backend": "cuda"}, {}, "grid.backend"),
    (GOOD, {"metrics": ["cluster_count", "entropy"]}, "keep.metrics[1]"),
    (GOOD, {"states": "yes"}, "keep.states"),
    (GOOD, {"radius": 1.0}, "keep.radius"),
])
def test_malformed_spec_names_the_field(grid, keep, field):
    with pytest.raises(ValueError, match=rf"^{re.escape(field)}: expected "):
        parse_spec({"grid": grid, "keep": keep})


def test_malformed_toml_through_the_cli(tmp_path):
    path = _spec(tmp_path, SHARED_SPEC.replace("seeds = 16", "seeds = 16\nsedes = 3"))
    result = CliRunner().invoke(app, ["sweep", str(path), "--scheduler", "serial"])
    assert result.exit_code == 2
    assert "grid.sedes: expected a known field" in result.output
    assert not (tmp_path / "spec.zarr").exists()
    empty = _spec(tmp_path, SHARED_SPEC.replace("beta = [1, 4, 16]", "beta = []"))
    result = CliRunner().invoke(app, ["sweep", str(empty), "--scheduler", "serial"])
    assert result.exit_code == 2 and "grid.beta: expected a value or a non-empty list" in \
        result.output


def test_equivalent_specs_have_one_record():
    a = parse_spec({"grid": {**GOOD, "seeds": 3, "save_at": 3}})
    b = parse_spec({"grid": {**GOOD, "seeds": [0, 1, 2], "save_at": [0, 0.5, 1]},
                    "keep": {"metrics": list(DEFAULT_METRICS)}, "entropy": 0})
    assert a.record() == b.record()
    assert a.shape == (2, 3) and a.n_runs == 6


# ---------------------------------------------------------------------------- seeds
def test_initial_tokens_come_from_the_documented_seed_streams():
    """x0 of run (point, seed s) is uniform(n, d) from SeedSequence(entropy, (s, 0)), whatever
    the grid point, the batch or the other seeds in the sweep."""
    grid = {"beta": [0.5, 2.0], "n": 6, "d": 3, "t_end": 0.5, "seeds": [7, 2, 11]}
    ds = sweep_fn(grid, {"states": True, "metrics": ["max_distance_to_first"]}, batch=2,
                  entropy=5, scheduler="serial")
    for s in (7, 2, 11):
        ss = np.random.SeedSequence(5, spawn_key=(s, 0))
        x0 = attnflow.sphere.uniform(6, 3, np.random.default_rng(ss))
        for beta in (0.5, 2.0):
            np.testing.assert_array_equal(ds.states.sel(beta=beta, seed=s, time=0.0).values, x0)


def test_causal_prefix_across_n():
    """Causality is triangular (docs/science.md §1) and a run's first tokens do not depend on n:
    the first 8 tokens of the n = 16 runs move exactly as the n = 8 runs."""
    ds = sweep_fn({"beta": 4.0, "n": [8, 16], "d": 2, "t_end": 3.0, "dt": 0.05, "seeds": 3},
                  {"states": True, "metrics": ["max_distance_to_first"]}, scheduler="serial")
    small = ds.states.sel(n=8).values
    big = ds.states.sel(n=16).values
    assert np.isnan(small[..., 8:, :]).all() and np.isfinite(big).all()
    np.testing.assert_allclose(big[..., :8, :], small[..., :8, :], rtol=0, atol=1e-12)
    assert np.abs(big[:, -1] - big[:, 0]).max() > 0.1  # the tokens did move


# ---------------------------------------------------------------------------- metrics
def _greedy_centers(X: np.ndarray, delta: float, strong: bool) -> list[int]:
    """Rényi centers by their definition (docs/science.md §4), with arccos distances."""
    dist = np.arccos(np.clip(X @ X.T, -1, 1))
    centers: list[int] = []
    for i in range(len(X)):
        earlier = range(i) if strong else centers
        if all(dist[i, j] > delta for j in earlier):
            centers.append(i)
    return centers


def test_metrics_at_time_zero_match_direct_computations():
    beta, n, d = 9.0, 30, 3
    ds = sweep_fn({"beta": beta, "n": n, "d": d, "t_end": 1.0, "dt": 0.1, "seeds": 4},
                  {"states": True}, scheduler="serial")
    delta, r, tol = 4 / 3, 1 / 3, 1 / 12  # 4 beta^-1/2, beta^-1/2, beta^-1/2 / 4
    for s in range(4):
        run = ds.sel(seed=s, time=0.0)
        X = run.states.values
        dist_first = np.arccos(np.clip(X @ X[0], -1, 1))
        assert float(run.max_distance_to_first) == pytest.approx(dist_first.max(), abs=1e-7)
        assert int(run.cluster_count) == int(cluster_count(X, tol))
        renyi = _greedy_centers(X, delta, strong=False)
        strong = _greedy_centers(X, delta, strong=True)
        assert int(run.renyi_count) == len(renyi)
        assert int(run.strong_renyi_count) == len(strong)
        dist = np.arccos(np.clip(X @ X.T, -1, 1))
        for name, centers in (("consumed_renyi", renyi), ("consumed_strong", strong)):
            assert float(run[name]) == pytest.approx(np.mean(dist[:, centers].min(1) <= r))
    assert "delta = 4 |beta|^-1/2; r = 1 |beta|^-1/2" in ds.attrs["radii"]


def test_one_cluster_at_the_first_token_for_identity_values():
    """Theorem 4.1: with V = I every token tends to x_1(0); token 1 never moves."""
    ds = sweep_fn({"beta": 1.0, "n": 5, "d": 2, "t_end": 60.0, "dt": 0.1, "save_at": 4,
                   "seeds": 3}, {"states": True}, scheduler="serial")
    dist = ds.max_distance_to_first.values  # (seed, time)
    assert (dist[:, 0] > 0.5).all() and (dist[:, -1] < 1e-3).all()
    first = ds.states.values[:, :, 0]  # (seed, time, coord)
    assert np.abs(first - first[:, :1]).max() < 1e-13
    assert (ds.cluster_count.values[:, -1] == 1).all()


# ---------------------------------------------------------------------------- failures
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_failing_run_is_recorded_and_the_sweep_goes_on():
    """V = diag(1e308, 1e308) overflows at the first step: those runs fail, the rest finish."""
    ds = sweep_fn({"beta": 1.0, "n": 6, "d": 2, "V": ["identity", "diag:1e308,1e308"],
                   "t_end": 1.0, "dt": 0.1, "seeds": 3}, scheduler="serial")
    assert (ds.status.sel(V="identity") == 1).all()
    assert (ds.status.sel(V="diag:1e308,1e308") == 2).all()
    assert all(e.startswith("NonFiniteStateError: the state became non-finite")
               for e in ds.error.sel(V="diag:1e308,1e308").values)
    assert np.isnan(ds.cluster_count.sel(V="diag:1e308,1e308")).all()
    assert np.isfinite(ds.cluster_count.sel(V="identity")).all()


def test_a_failing_run_does_not_take_its_batch_mates(monkeypatch):
    """A batch with one failing run is redone run by run: only that run fails, and the others
    equal a sweep without the failure."""
    module = importlib.import_module("attnflow.sweeps.tasks")
    real = module.simulate
    grid = {"beta": 2.0, "n": 6, "d": 2, "t_end": 1.0, "dt": 0.1, "seeds": 4}
    clean = sweep_fn(grid, scheduler="serial")
    bad = attnflow.sphere.uniform(6, 2, np.random.default_rng(
        np.random.SeedSequence(0, spawn_key=(2, 0))))

    def flaky(model, x0, *args, **kwargs):
        if np.any(np.all(x0 == bad, axis=(-1, -2))):
            raise attnflow.NonFiniteStateError(0.5, [(0,)])
        return real(model, x0, *args, **kwargs)

    monkeypatch.setattr(module, "simulate", flaky)
    ds = sweep_fn(grid, batch=4, scheduler="serial")
    assert ds.status.values.tolist() == [1, 1, 2, 1]
    assert ds.error.values[2].startswith("NonFiniteStateError: the state became non-finite")
    for s in (0, 1, 3):
        xr.testing.assert_identical(ds.drop_vars(["status", "error"]).isel(seed=s),
                                    clean.drop_vars(["status", "error"]).isel(seed=s))


def test_resume_refuses_a_store_of_another_sweep(tmp_path):
    out = tmp_path / "s.zarr"
    sweep_fn(GOOD, {"metrics": ["max_distance_to_first"]}, out=out, scheduler="serial")
    with pytest.raises(ValueError, match=r"^out: .*differing in grid.beta"):
        sweep_fn({**GOOD, "beta": [2.0]}, {"metrics": ["max_distance_to_first"]}, out=out,
                 scheduler="serial")
    with pytest.raises(ValueError, match=r"^scheduler: expected"):
        sweep_fn(GOOD, scheduler="localhost")


# ---------------------------------------------------------------------------- real processes
class Cluster:
    """A `dask scheduler` and `dask worker` processes on 127.0.0.1, started by the test."""

    def __init__(self, tmp: Path):
        self.procs: list[subprocess.Popen] = []
        self.log = open(tmp / "dask.log", "wb")  # noqa: SIM115
        file = tmp / "scheduler.json"
        self._start("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                    "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(file))
        deadline = time.monotonic() + 60
        while not file.exists() or not file.read_text().strip():
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        self.address = json.loads(file.read_text())["address"]
        assert self.address.startswith("tcp://127.0.0.1:")

    def _start(self, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=self.log,
                                stderr=self.log, start_new_session=True)
        self.procs.append(proc)
        return proc

    def add_workers(self, count: int, wait: bool = True) -> None:
        from distributed import Client

        for _ in range(count):
            self._start("worker", self.address, "--host", "127.0.0.1", "--nthreads", "1",
                        "--no-nanny", "--no-dashboard", "--dashboard-address", "127.0.0.1:0")
        if wait:
            with Client(self.address, timeout="30s", set_as_default=False) as client:
                client.wait_for_workers(count, timeout=60)
            assert all(ip == "127.0.0.1" for ip, _ in _listeners()), _listeners()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("dask"))
    try:
        c.add_workers(2)
        yield c
    finally:
        c.close()


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from attnflow.cli import app; app()",
                             "sweep", *args, "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_sweep_through_a_running_cluster(cluster, reference, tmp_path):
    out = tmp_path / "s.zarr"
    proc = _cli(str(_spec(tmp_path)), "--scheduler", cluster.address, "--out", str(out))
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0, stderr
    assert "48 (0 finished before, 48 computed now)" in stdout
    _assert_same(out, reference)


def test_killing_a_busy_worker_loses_nothing(cluster, reference, tmp_path):
    from distributed import Client

    out = tmp_path / "s.zarr"
    driver = _cli(str(_spec(tmp_path)), "--scheduler", cluster.address, "--out", str(out))
    mine = {p.pid for p in cluster.procs}
    with Client(cluster.address, timeout="30s", set_as_default=False) as client:
        deadline = time.monotonic() + 60
        victim = None
        while victim is None:
            assert time.monotonic() < deadline and driver.poll() is None, \
                "the sweep ended before a busy worker could be killed"
            busy = [w for w, keys in client.processing().items() if keys]
            if len(busy) > 1 and out.exists() and sweep_status(out)["done"] >= 2:
                victim = client.run(os.getpid, workers=busy[:1])[busy[0]]
            time.sleep(0.05)
    assert victim in mine
    os.kill(victim, signal.SIGKILL)
    cluster.add_workers(1, wait=False)  # a replacement, for the tests that follow
    finished = _status_chunks(out)
    assert 0 < len(finished) < 24
    stdout, stderr = driver.communicate(timeout=90)
    assert driver.returncode == 0, stderr
    assert all(p.stat().st_ino == ino for p, ino in finished.items())  # each written once
    _assert_same(out, reference)


def _status_chunks(out: Path) -> dict[Path, int]:
    """The status chunk files (one per finished task) and their inodes."""
    return {p: p.stat().st_ino for p in (out / "status" / "c").rglob("*") if p.is_file()}


def test_killed_driver_resumes_without_recomputing(cluster, reference, tmp_path):
    out = tmp_path / "s.zarr"
    spec = str(_spec(tmp_path))
    first = _cli(spec, "--scheduler", cluster.address, "--out", str(out))
    deadline = time.monotonic() + 60
    while not (out.exists() and sweep_status(out)["done"] >= 4):
        assert time.monotonic() < deadline and first.poll() is None, "the sweep did not start"
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=30)
    status = sweep_status(out)
    assert 0 < status["done"] < 48 and status["failed"] == 0
    finished = _status_chunks(out)
    assert len(finished) == status["done"] // 2  # one status chunk per finished task

    second = _cli(spec, "--scheduler", cluster.address, "--out", str(out))
    stdout, stderr = second.communicate(timeout=90)
    assert second.returncode == 0, stderr
    assert f"48 ({status['done']} finished before, {status['pending']} computed now)" in stdout
    assert all(p.stat().st_ino == ino for p, ino in finished.items())  # not rewritten
    assert not list(out.rglob("*.partial"))
    _assert_same(out, reference)


def _alive(procs: list[psutil.Process], read) -> list:
    """read(p) for each process still alive (dead workers of other tests may linger)."""
    out = []
    for p in procs:
        try:
            out.append(read(p))
        except psutil.Error:
            pass
    return out


def _listeners() -> set[tuple[str, int]]:
    """The listening sockets (ip, port) of this process and its descendants."""
    procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
    return {tuple(c.laddr) for conns in _alive(procs, lambda p: p.net_connections("inet"))
            for c in conns if c.status == psutil.CONN_LISTEN}


def test_local_cluster_listens_on_loopback_only():
    grid = {"beta": [1.0, 4.0], "n": 12, "d": 2, "t_end": 2.0, "dt": 0.1, "seeds": 6}
    before = _listeners()  # the module's external cluster, if it is up
    seen: list = []
    ds = sweep_fn(grid, batch=3, workers=2, progress=lambda done, total: seen.append(
        (done, total, _listeners() - before)))
    assert [s[:2] for s in seen] == [(3 * i, 12) for i in range(5)]
    for _, _, listeners in seen[1:]:
        assert len(listeners) >= 3  # the scheduler and two workers, at least
        assert all(ip == "127.0.0.1" for ip, _ in listeners), listeners
        assert all(port != 8787 for _, port in listeners)  # no dashboard's default port
    xr.testing.assert_identical(ds, sweep_fn(grid, batch=3, scheduler="serial"))


def test_local_cluster_workers_use_one_kernel_thread_each():
    """ATTNFLOW_THREADS=1 in each worker, and no MALLOC_TRIM_THRESHOLD_ (Dask's nanny default
    65536 makes the kernels 1.8x slower, benchmarks/RESULTS.md)."""
    from distributed import Client

    from attnflow.sweeps import local_cluster

    def environ() -> tuple[str | None, str | None]:
        return os.environ.get("ATTNFLOW_THREADS"), os.environ.get("MALLOC_TRIM_THRESHOLD_")

    with local_cluster(workers=1) as cluster, Client(cluster, set_as_default=False) as client:
        assert list(client.run(environ).values()) == [("1", None)]
    assert "ATTNFLOW_THREADS" not in os.environ  # the driver keeps all its cores


def test_npy_matrices_are_read_relative_to_the_spec(tmp_path):
    """A .npy value matrix is read by the driver (workers need no file): V = -I gives the
    same run as the preset diag:-1,-1."""
    np.save(tmp_path / "V.npy", -np.eye(2))
    spec = _spec(tmp_path, "[grid]\nbeta = 2\nn = 6\nd = 2\nV = ['V.npy', 'diag:-1,-1']\n"
                 "t_end = 1\ndt = 0.1\nseeds = 2\n")
    ds = sweep_fn(load_spec(spec), scheduler="serial")
    a, b = (ds.drop_vars(["status", "error"]).sel(V=v) for v in ("V.npy", "diag:-1,-1"))
    xr.testing.assert_identical(a.drop_vars("V"), b.drop_vars("V"))
    assert np.isfinite(a.max_distance_to_first).all()
    (tmp_path / "V.npy").unlink()
    with pytest.raises(ValueError, match=r"^grid.V: expected an existing .npy file"):
        load_spec(spec)


def test_strong_center_counts_match_lemma_c1():
    """Lemma C.1: for n i.i.d. uniform tokens, E[#strong centers(delta)] =
    sum_{k=1}^{n} (1 - p)^{k-1}, p the normalised cap mass: delta / pi on the circle,
    sin^2(delta / 2) on S^2 (docs/science.md §2). Checks the metric and that the per-seed draws
    are independent uniform samples: the mean over 400 seeds is within 4 standard errors."""
    beta, n = 16.0, 50
    delta = 4 / np.sqrt(beta)
    ds = sweep_fn({"beta": beta, "n": n, "d": [2, 3], "t_end": 0.0, "seeds": 400},
                  {"metrics": ["strong_renyi_count"]}, scheduler="serial")
    for d, p in ((2, delta / np.pi), (3, np.sin(delta / 2) ** 2)):
        counts = ds.strong_renyi_count.sel(d=d, time=0.0).values
        exact = np.sum((1 - p) ** np.arange(n))
        se = counts.std(ddof=1) / np.sqrt(counts.size)
        assert abs(counts.mean() - exact) < 4 * se, (d, counts.mean(), exact, se)
