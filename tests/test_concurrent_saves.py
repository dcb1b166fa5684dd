"""Saves and loads of one path from several processes at once: a directory's replace and its
recovery run under an advisory lock (`attnflow._files.locked`), loads of a store hold it
shared, so two savers never trip over each other's renames and a load never sees a store
half replaced; a save that cannot get the lock in time says so in one line."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import attnflow as af
from attnflow import _files


def _worker(role: str, path: Path, seconds: float, start, report) -> None:
    """Save run `role` (1 or 2) over `path`, or load it ("load"), until `seconds` after the
    start; send the outcomes (or the traceback) back."""
    import traceback

    outcomes = []
    try:
        runs = {seed: _small(seed, n=300, T=4) for seed in (1, 2)}
        start.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if role == "load":
                try:
                    back = af.load(path)
                    states = back.states
                except ValueError as err:  # replaced between the open and the read: says so
                    assert "a file replaced since (load it again)" in str(err), str(err)
                    outcomes.append("replaced")
                    continue
                assert back.seed in (1, 2) and np.array_equal(states, runs[back.seed].states)
                outcomes.append("complete")
            else:
                runs[int(role)].save(path)
                outcomes.append("saved")
    except BaseException:
        outcomes.append(traceback.format_exc())
    report.put((role, outcomes))


def _race(path: Path, seconds: float) -> dict[str, list[str]]:
    """Two savers and a loader, forked from this process (everything imported), started
    together."""
    import multiprocessing

    _small(1, n=300, T=4).save(path)
    af.load(path).states  # noqa: B018  (the loader's imports done before the fork)
    context = multiprocessing.get_context("fork")
    start, report = context.Event(), context.Queue()
    procs = [context.Process(target=_worker, args=(role, path, seconds, start, report))
             for role in ("1", "2", "load")]
    for proc in procs:
        proc.start()
    start.set()
    out = dict(report.get(timeout=seconds + 120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    for role, outcomes in out.items():
        assert all(o in ("saved", "complete", "replaced") for o in outcomes), (role, outcomes)
    return out


def _check_race(tmp_path: Path, seconds: float) -> None:
    path = tmp_path / "c.zarr"
    out = _race(path, seconds)
    assert "saved" in out["1"] and "saved" in out["2"]
    assert out["load"].count("complete") >= 1, out["load"]
    assert set(out["load"]) <= {"complete", "replaced"}
    assert af.load(path).seed in (1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.zarr"]  # no lock, no .old


@pytest.mark.timeout(180)
def test_two_savers_and_a_loader_on_one_store(tmp_path):
    _check_race(tmp_path, 4.0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_savers_and_a_loader_on_one_store_for_20_seconds(tmp_path):
    _check_race(tmp_path, 20.0)


def _small(seed: int, n: int = 5, T: int = 2) -> af.Trajectory:
    x = np.random.default_rng(seed).standard_normal((T, n, 3))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return af.Trajectory(times=np.arange(float(T)), states=x, model=af.Attention(beta=1.0),
                         integrator={"method": "rk4"}, seed=seed)


def test_a_save_waits_for_the_lock_then_gives_up_in_one_line(tmp_path, monkeypatch):
    path = _small(1).save(tmp_path / "run.zarr")
    released = threading.Event()

    def hold(seconds: float) -> None:
        with _files.locked(path):
            started.set()
            time.sleep(seconds)
        released.set()

    started = threading.Event()  # held 0.5 s: the save waits, then replaces
    thread = threading.Thread(target=hold, args=(0.5,))
    thread.start()
    started.wait()
    _small(2).save(path)
    assert released.is_set()  # it waited for the holder
    thread.join()
    assert af.load(path).seed == 2
    monkeypatch.setattr(_files, "LOCK_TIMEOUT", 0.3)
    started.clear()
    thread = threading.Thread(target=hold, args=(2.0,))
    thread.start()
    started.wait()
    with pytest.raises(TimeoutError) as info:
        _small(3).save(path)
    thread.join()
    message = str(info.value)
    assert "\n" not in message and f"received {path}, locked by another process for 0.3 s" \
        in message, message
    assert af.load(path).seed == 2  # nothing changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.zarr"]


def test_a_lock_file_its_holder_removed_is_not_trusted(tmp_path):
    """The last holder removes the lock file; one who waited on the removed file takes the
    lock again on the new one, so two holders never both hold it."""
    path = tmp_path / "run.zarr"
    lock = tmp_path / ".run.zarr.lock"
    inside = []
    errors = []

    def worker(k: int) -> None:
        try:
            for _ in range(30):
                with _files.locked(path):
                    inside.append(k)
                    if len(inside) > 1:
                        errors.append(list(inside))
                    time.sleep(0.001)
                    inside.remove(k)
        except Exception as err:  # (reported below)
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and not lock.exists()
