"""A hostile-input corpus for the loaders (issue 44), crafted here: files that would make a
loader read other files, block, allocate far more than their size, or load wrong or
incomplete data. Each must be refused in one line naming the file and the field, within
seconds and without a large allocation; interrupted saves never pass for complete."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest
import xarray as xr
import zarr

import attnflow as af
from attnflow import _datafiles
from attnflow.errors import CorruptFileError

pytestmark = pytest.mark.timeout(60)  # a load that blocks (a FIFO) fails, not hangs


def _traj(n: int = 6, d: int = 3, times: int = 3, **model) -> af.Trajectory:
    return af.simulate(af.Attention(beta=1.0, **model), af.sphere.uniform(n, d, 0), 1.0,
                       save_at=list(np.linspace(0, 1, times)), seed=0)


def _refused(path: Path, field: str, *, what: str = "", load=af.load, **kwargs) -> str:
    """Load `path`, expect one line naming the file and `field` (and `what`), within 10 s and
    100 MB of memory; return the message."""
    rss = psutil.Process().memory_info().rss
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        out = load(path, **kwargs)
        getattr(out, "states", None)  # (the states' checks run when they are read)
    message = str(info.value)
    assert time.perf_counter() - start < 10
    assert psutil.Process().memory_info().rss - rss < 100 * 2**20
    assert "\n" not in message
    assert str(path) in message, message
    assert re.search(rf"(^|: ){re.escape(field)}: expected", message), message
    assert what in message, message
    return message


def _forge(ds: xr.Dataset, path: Path) -> Path:
    """Save a Dataset with attnflow's own writer, so that its completeness marker is right:
    the consistency checks, not the marker, must catch what is wrong in it."""
    kind = "netcdf" if path.suffix == ".nc" else "zarr"
    return _datafiles.save_dataset(ds, path, kind, "attnflow")


def _forge_states(path: Path, traj: af.Trajectory, shape: tuple[int, ...], **h5) -> Path:
    """A netCDF run whose `states` dataset is made with h5py (`h5`: fillvalue, external,
    chunks): the other variables and the record from `traj`, marker and checksums (but with
    external storage, which HDF5 keeps contiguous) and all."""
    ds = traj.to_xarray().drop_vars("states").assign_coords(
        run=np.arange(shape[1]), token=np.arange(shape[2]), coord=np.arange(shape[3]))
    ds.attrs[_datafiles.FORMAT_ATTR] = _datafiles.FORMAT
    ds.to_netcdf(path, engine="h5netcdf", encoding=_datafiles.checksum_encoding(ds, "netcdf"))
    with h5py.File(path, "r+") as f:
        states = f.create_dataset("states", shape, "f8", fletcher32="external" not in h5, **h5)
        for i, dim in enumerate(("time", "run", "token", "coord")):
            states.dims[i].attach_scale(f[dim])
    with xr.open_dataset(path, engine="h5netcdf") as opened:
        mark = _datafiles.marker(opened, "attnflow")
    with h5py.File(path, "r+") as f:
        f.attrs[_datafiles.MARKER_ATTR] = mark
    return path


# ---------------------------------------------------------------- reading other files
def test_external_storage_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(3 * 6 * 3, dtype="f8").tobytes())
    path = _forge_states(tmp_path / "ext.nc", _traj(), (3, 1, 6, 3),
                         external=[(str(secret), 0, 3 * 6 * 3 * 8)])
    with xr.open_dataset(path, engine="h5netcdf") as ds:  # the file is what it claims to be
        assert ds["states"].values.ravel()[5] == 5.0
    _refused(path, "states", what="external storage")


def test_external_link_and_virtual_dataset_are_refused(tmp_path):
    other = _traj().save(tmp_path / "other.nc")
    path = _traj().save(tmp_path / "link.nc")
    with h5py.File(path, "r+") as f:
        f["stolen"] = h5py.ExternalLink(str(other), "/states")
    _refused(path, "stolen", what="ExternalLink")
    path = _traj().save(tmp_path / "virtual.nc")
    layout = h5py.VirtualLayout(shape=(3, 1, 6, 3), dtype="f8")
    layout[:] = h5py.VirtualSource(str(other), "states", shape=(3, 1, 6, 3))
    with h5py.File(path, "r+") as f:
        f.create_virtual_dataset("mirror", layout)
    _refused(path, "mirror", what="virtual dataset")


@pytest.mark.parametrize("fifo", [False, True])
def test_a_mask_path_in_the_record_is_never_opened(tmp_path, monkeypatch, fifo):
    mask = tmp_path / "x.npy"
    if fifo:
        os.mkfifo(mask)  # a reader that opened it would block
    else:
        np.save(mask, np.ones((6, 6), bool))
    ds = _traj().to_xarray()
    rec = json.loads(ds.attrs["attnflow"])
    rec["model"]["mask"] = str(mask)
    ds.attrs["attnflow"] = json.dumps(rec)
    path = _forge(ds, tmp_path / "mask.nc")
    opened = []
    monkeypatch.setattr(np, "load", lambda *a, **k: opened.append(a))
    _refused(path, "attnflow.model", what="a file name is never read from a record")
    assert not opened


def test_an_array_mask_travels_inside_the_file(tmp_path):
    mask = np.tril(np.ones((6, 6), bool))
    traj = _traj(mask=mask)
    path = traj.save(tmp_path / "m.nc")
    with xr.open_dataset(path, engine="h5netcdf") as ds:  # a variable, not JSON text
        assert np.array_equal(ds["mask"].values, mask)
        assert json.loads(ds.attrs["attnflow"])["model"]["mask"] == {"array": "mask"}
    assert np.array_equal(af.load(path).model.attention.mask, mask)
    # the nested lists of earlier versions still read
    ds = traj.to_xarray().drop_vars("mask")
    ds = _record(ds, model={**json.loads(ds.attrs["attnflow"])["model"],
                            "mask": {"array": mask.astype(int).tolist()}})
    assert np.array_equal(af.load(_forge(ds, tmp_path / "m1.nc")).model.attention.mask, mask)


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_special_files_and_links_to_them_are_refused_before_opening(tmp_path, suffix):
    fifo = tmp_path / f"fifo{suffix}"
    os.mkfifo(fifo)
    _refused(fifo, "path", what="a FIFO")
    link = tmp_path / f"link{suffix}"
    link.symlink_to(fifo)
    _refused(link, "path", what="a FIFO")
    if suffix == ".nc":
        dev = tmp_path / "dev.nc"
        dev.symlink_to("/dev/zero")
        _refused(dev, "path", what="a character device")


def test_a_zarr_chunk_that_is_a_fifo_or_a_link_is_refused(tmp_path):
    path = _traj().save(tmp_path / "run.zarr")
    chunk = next(p for p in (path / "states").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.unlink()
    os.mkfifo(chunk)
    _refused(path, str(chunk.relative_to(path)), what="a FIFO")
    chunk.unlink()
    chunk.symlink_to(tmp_path / "elsewhere")
    _refused(path, str(chunk.relative_to(path)), what="a symbolic link")


# ---------------------------------------------------------------- sizes
def test_a_size_bomb_is_refused_before_reading(tmp_path):
    # 8 MB on disk (the token coordinate), 16 GB declared: chunks never written read as the
    # fill value
    path = _forge_states(tmp_path / "bomb.nc", _traj(n=6, d=2, times=1000),
                         (1000, 1, 10**6, 2), chunks=(1, 1, 10**6, 2), fillvalue=0.5)
    assert path.stat().st_size < 10 * 2**20
    _refused(path, "states", what="max_bytes = 8 GiB")
    _refused(path, "states", what="max_bytes = 100 MiB", max_bytes=100 * 2**20)
    _refused(path, "path", what="max_bytes = 1 MiB", max_bytes=2**20)  # the file's own size


def test_a_zarr_size_bomb_is_refused_before_reading(tmp_path):
    path = _traj(d=2).save(tmp_path / "bomb.zarr")
    meta = path / "states" / "zarr.json"
    rec = json.loads(meta.read_text())
    rec["shape"] = [1000, 1, 10**6, 2]
    meta.write_text(json.dumps(rec))
    _refused(path, "states", what="max_bytes")


# ---------------------------------------------------------------- inconsistent records
def _edited(tmp_path: Path, name: str, edit, d: int = 3, n: int = 6, **model) -> Path:
    ds = edit(_traj(n=n, d=d, **model).to_xarray())
    return _forge(ds, tmp_path / name)


def _record(ds: xr.Dataset, **changes) -> xr.Dataset:
    rec = json.loads(ds.attrs["attnflow"])
    rec.update(changes)
    ds.attrs["attnflow"] = json.dumps(rec)
    return ds


@pytest.mark.parametrize("name,edit,field,what", [
    ("no-times.nc", lambda ds: ds.drop_vars("time"), "time", "none stored"),
    ("unordered.nc", lambda ds: ds.assign_coords(time=[0.0, 1.0, 0.5]), "time",
     "strictly increasing"),
    ("nan-time.nc", lambda ds: ds.assign_coords(time=[0.0, np.nan, 1.0]), "time", "finite"),
    ("text-time.nc", lambda ds: ds.assign_coords(time=["a", "b", "c"]), "time", "numbers"),
    ("no-times.zarr", lambda ds: ds.isel(time=slice(0, 0)), "states", "at least one"),
    ("model-x.nc", lambda ds: _record(ds, model="x"), "attnflow.model", "dict"),
    ("batch.nc", lambda ds: _record(ds, batch_shape=[2, 3]), "attnflow.batch_shape",
     "product"),
    ("nan-state.nc", lambda ds: ds.assign(states=ds["states"].where(ds["token"] != 2)),
     "states", "finite entries"),
    ("huge-state.zarr", lambda ds: ds.assign(states=ds["states"] * 1e300), "states",
     "unit vectors"),
])
def test_inconsistent_records_are_refused(tmp_path, name, edit, field, what):
    _refused(_edited(tmp_path, name, edit), field, what=what)


def test_a_model_of_other_dimensions_is_refused(tmp_path):
    def wider_q(ds):  # a 5 x 5 Q on a run of 2 coordinates
        ds = ds.drop_vars("Q_0")
        return ds.assign(Q_0=(("Q_0_dim0", "Q_0_dim1"), np.eye(5)))

    path = _edited(tmp_path, "q5.nc", wider_q, d=2, Q=np.eye(2))
    _refused(path, "attnflow.model", what="Q: expected a matrix for d = 2")

    def one_token_mask(ds):  # a 1 x 1 mask on 20 tokens
        rec = json.loads(ds.attrs["attnflow"])
        rec["model"]["mask"] = {"array": [[1]]}
        ds.attrs["attnflow"] = json.dumps(rec)
        return ds

    path = _edited(tmp_path, "mask1.nc", one_token_mask, n=20)
    _refused(path, "attnflow.model", what="n = 1 tokens")


def test_zero_tokens_in_r_d_are_refused_on_read(tmp_path):
    traj = af.simulate(af.Attention(beta=1.0, norm="pre"), af.sphere.uniform(5, 3, 0), 0.2)
    ds = traj.to_xarray()
    ds = ds.assign(states=ds["states"].where(ds["token"] != 1, 0.0))
    path = _forge(ds, tmp_path / "zero.nc")
    traj = af.load(path)  # lazily: opening reads no states
    _refused(path, "states", what="non-zero norm")
    with pytest.raises(CorruptFileError, match="states: expected token vectors"):
        traj.final  # noqa: B018


@pytest.mark.parametrize("text,what", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("", "malformed JSON"),
    ("[1, 2]", "a JSON list"),
])
def test_malformed_records_are_one_line(tmp_path, text, what):
    path = _edited(tmp_path, "rec.nc", lambda ds: ds.assign_attrs(attnflow=text))
    _refused(path, "attnflow", what=what)


# ---------------------------------------------------------------- Zarr chunks, traces
def test_a_zarr_store_with_a_missing_chunk_is_refused(tmp_path, monkeypatch):
    from attnflow import trajectory

    monkeypatch.setattr(trajectory, "CHUNK_BYTES", 6 * 3 * 8)  # one save time per chunk
    path = _traj(times=5).save(tmp_path / "run.zarr")
    chunks = sorted(p for p in (path / "states").rglob("*") if p.is_file()
                    and p.name != "zarr.json")
    assert len(chunks) == 5  # chunked by time
    assert np.array_equal(af.load(path).at(0.5), _traj(times=5).at(0.5))
    chunks[2].unlink()
    with xr.open_zarr(path) as ds:  # what a reader without the check would return
        assert np.isnan(ds["states"].values[2]).all()
    _refused(path, "states", what="all 5 chunks stored")


def test_a_trace_with_a_missing_layer_is_refused(tmp_path):
    from attnflow.pretrained.trace import load_trace, save_trace, trace_dataset

    rng = np.random.default_rng(0)
    pre, post = rng.standard_normal((2, 3, 4, 5))
    ds = trace_dataset(pre, post, np.arange(4))
    assert load_trace(save_trace(ds, tmp_path / "t.zarr")).identical(ds)
    save_trace(ds.drop_vars("blocks.1.hook_resid_post"), tmp_path / "gap.zarr")
    _refused(tmp_path / "gap.zarr", "blocks.1.hook_resid_post", load=load_trace,
             what="every layer 0..2")


# ---------------------------------------------------------------- incomplete saves
@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_a_save_without_its_marker_never_loads(tmp_path, suffix):
    """What a save killed before its last step leaves: the data without the marker."""
    ds = _traj().to_xarray()
    ds.attrs[_datafiles.FORMAT_ATTR] = _datafiles.FORMAT
    path = tmp_path / f".run.0123456789ab{suffix}"
    if suffix == ".nc":
        ds.to_netcdf(path, engine="h5netcdf")
    else:
        ds.to_zarr(path, mode="w", consolidated=False)
    _refused(path, "attnflow_complete", what="an interrupted or unfinished save")
    good = _traj().save(tmp_path / f"good{suffix}")
    if suffix == ".nc":
        with h5py.File(good, "r+") as f:
            f.attrs["attnflow"] = f.attrs["attnflow"].replace('"seed": 0', '"seed": 1')
    else:
        group = zarr.open_group(good, mode="r+")
        group.attrs["attnflow"] = group.attrs["attnflow"].replace('"seed": 0', '"seed": 1')
    _refused(good, "attnflow_complete", what="another")


def test_files_of_the_previous_format_still_load(tmp_path):
    """Runs saved before the marker (format 1: no attnflow_format attribute) load."""
    traj = _traj()
    traj.to_xarray().to_netcdf(tmp_path / "old.nc", engine="h5netcdf")
    traj.to_xarray().to_zarr(tmp_path / "old.zarr", mode="w", consolidated=False)
    for name in ("old.nc", "old.zarr"):
        assert np.array_equal(af.load(tmp_path / name).states, traj.states)


def test_a_replace_cut_between_its_renames_is_recovered(tmp_path):
    traj = _traj()
    path = traj.save(tmp_path / "run.zarr")
    old = tmp_path / ".run.zarr.old"
    os.replace(path, old)  # killed after old -> .old, before new -> run.zarr
    assert np.array_equal(af.load(path).states, traj.states)
    assert path.is_dir() and not old.exists()
    os.replace(path, old)
    other = _traj(times=4)
    other.save(path)  # the next save recovers it first, then replaces it
    assert np.array_equal(af.load(path).states, other.states)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.zarr"]


def test_a_full_disk_is_one_line_before_writing(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9, 1000))
    with pytest.raises(OSError, match=r"path: expected room for .* 1e\+03 B free"):
        _traj().save(tmp_path / "run.nc")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_a_write_error_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, suffix):
    import errno

    def full(*args, **kwargs):
        raise RuntimeError("writer failed") from OSError(errno.ENOSPC, "No space left")

    monkeypatch.setattr(xr.Dataset, "to_netcdf" if suffix == ".nc" else "to_zarr", full)
    with pytest.raises(OSError, match=r"^\[Errno 28\] path: expected room to write") as info:
        _traj().save(tmp_path / f"run{suffix}")
    assert "\n" not in str(info.value) and info.value.__cause__ is None
    assert list(tmp_path.iterdir()) == []


def test_sigint_swallowed_mid_write_is_raised_again(tmp_path, monkeypatch):
    """A C extension that swallows the KeyboardInterrupt of a SIGINT (as h5netcdf did in 3 of
    4 trials) does not make the save pass: it is raised again, nothing is left behind."""
    import signal

    traj = _traj()
    old = traj.save(tmp_path / "run.nc").read_bytes()
    write = xr.Dataset.to_netcdf

    def swallowing(self, *args, **kwargs):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        return write(self, *args, **kwargs)

    monkeypatch.setattr(xr.Dataset, "to_netcdf", swallowing)
    with pytest.raises(KeyboardInterrupt):
        _traj(times=4).save(tmp_path / "run.nc")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.nc"]
    assert (tmp_path / "run.nc").read_bytes() == old
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ---------------------------------------------------------------- lazy loading
def test_opening_reads_no_states(tmp_path):
    """A run declaring 240 MB of states (chunks never written read as the fill value, a
    unit vector's entries) opens without reading them; one save time reads one chunk."""
    T, n = 100, 100_000
    path = _forge_states(tmp_path / "big.nc", _traj(times=T), (T, 1, n, 3),
                         chunks=(1, 1, n, 3), fillvalue=1 / np.sqrt(3))
    rss = psutil.Process().memory_info().rss
    traj = af.load(path)
    assert (traj.n, traj.d, traj.batch_shape) == (n, 3, ())  # shapes without reading
    assert psutil.Process().memory_info().rss - rss < 40 * 2**20  # 240 MB not read
    final = traj.final
    assert final.shape == (n, 3) and np.allclose(final, 1 / np.sqrt(3))
    assert psutil.Process().memory_info().rss - rss < 60 * 2**20  # one time: 2.4 MB
    assert "runs=1, n=100000" in repr(traj)


# ---------------------------------------------------------------- interrupted saves
_SERVER = r"""
import os, random, signal, sys, time
import numpy as np
import attnflow as af

def run(seed, T=20, n=5000):
    x = np.random.default_rng(seed).standard_normal((T, n, 3))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return af.Trajectory(times=np.arange(T, dtype=float), states=x,
                         model=af.Attention(beta=1.0), integrator={"method": "rk4"}, seed=seed)

new = run(2)
for line in sys.stdin:
    path, signum, delay = line.split()
    if signum == "0":  # an uninterrupted save, timed
        start = time.perf_counter()
        new.save(path)
        print(0, time.perf_counter() - start, flush=True)
        continue
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child saves; SIGINT's KeyboardInterrupt ends it with 130
        try:
            new.save(path)
        except KeyboardInterrupt:
            os._exit(130)
        os._exit(0)
    time.sleep(float(delay))
    os.kill(pid, int(signum))
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), time.perf_counter() - start, flush=True)
"""


def _run_states(seed: int, T: int = 20, n: int = 5000) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((T, n, 3))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.timeout(120)
def test_saves_killed_at_random_points_never_pass_for_complete(tmp_path):
    """SIGINT, SIGTERM and SIGKILL at random points of a save over an existing run: the
    target then loads complete, old or new; no temporary ever loads; SIGINT is never
    swallowed (the child exits 130, or 0 only when the new run is in place)."""
    import shutil
    import signal
    import subprocess
    import sys

    old, new = _run_states(1), _run_states(2)
    env = {**os.environ, "PYTHONPATH": str(Path(af.__file__).parents[1]),
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    rng = np.random.default_rng(44)
    outcomes = []
    try:
        took = {}
        for suffix in (".nc", ".zarr") * 2:  # the second time without the imports
            server.stdin.write(f"{tmp_path / ('timed' + suffix)} 0 0\n")
            server.stdin.flush()
            took[suffix] = float(server.stdout.readline().split()[1])
        first = {suffix: af.Trajectory(
            times=np.arange(20.0), states=old, model=af.Attention(beta=1.0),
            integrator={"method": "rk4"}, seed=1).save(tmp_path / f"old{suffix}")
            for suffix in (".nc", ".zarr")}
        for trial in range(12):
            suffix = (".nc", ".zarr")[trial % 2]
            signum = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[trial % 3]
            folder = tmp_path / f"trial{trial}"
            path = folder / f"run{suffix}"
            folder.mkdir()
            (shutil.copytree if suffix == ".zarr" else shutil.copy)(first[suffix], path)
            delay = rng.uniform(0.0, 2.0 * took[suffix])  # about half cut short
            server.stdin.write(f"{path} {int(signum)} {delay}\n")
            server.stdin.flush()
            code = int(server.stdout.readline().split()[0])
            back = af.load(path)
            assert back.seed in (1, 2)
            assert np.array_equal(back.states, old if back.seed == 1 else new)
            expected = {signal.SIGINT: (130, 0), signal.SIGTERM: (-15, 0),
                        signal.SIGKILL: (-9, 0)}[signum]
            assert code in expected, (trial, code)
            if code == 0:
                assert back.seed == 2  # finished before the signal
            for other in folder.iterdir():
                if other.name.startswith("."):
                    # SIGINT and SIGTERM remove the temporary (an old output being deleted
                    # when the signal came may remain, without its metadata; a Zarr write's
                    # chunks still in flight in zarr's threads may recreate part of one)
                    assert (signum == signal.SIGKILL or other.name.endswith(".old")
                            or suffix == ".zarr"), other
                    try:
                        left = af.load(other)
                        assert left.seed == 2 and np.array_equal(left.states, new), other
                        # complete: SIGKILL between the renames of the replace (the old
                        # output, recovered by the load above, is the target)
                    except ValueError:
                        continue
            outcomes.append((back.seed, code))
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    assert any(code != 0 for _, code in outcomes)  # the signals came during the saves


def test_a_mean_field_result_is_checked_like_a_run(tmp_path):
    from attnflow.meanfield import MeanFieldResult
    from attnflow.meanfield import load as load_result

    c = np.zeros((3, 1, 5), complex)
    c[..., 0] = 1 / (2 * np.pi)
    result = MeanFieldResult(times=np.array([0.0, 0.5, 1.0]), coefficients=c,
                             model=af.Attention(beta=1.0, mask="full"),
                             settings={"modes": 4, "labels": None})
    back = load_result(result.save(tmp_path / "mf.nc"))
    assert np.array_equal(back.coefficients, c) and np.array_equal(back.times, result.times)
    ds = result.to_xarray().assign_coords(time=[0.0, 1.0, 0.5])
    path = _datafiles.save_dataset(ds, tmp_path / "bad.nc", "netcdf", "attnflow_meanfield")
    _refused(path, "time", load=load_result, what="increasing save times")
    ds = result.to_xarray()
    ds["real"][1, 0, 2] = np.nan
    path = _datafiles.save_dataset(ds, tmp_path / "nan.zarr", "zarr", "attnflow_meanfield")
    _refused(path, "real, imag", load=load_result, what="finite coefficients")


def test_ctrl_c_in_the_cli_exits_130_in_one_line(tmp_path, monkeypatch, capsys):
    from attnflow.cli import app

    def interrupted(self, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(af.Trajectory, "save", interrupted)
    with pytest.raises(SystemExit) as info:
        app(["simulate", "--n", "4", "--d", "2", "--t-end", "0.1", "--no-progress", "--out",
             str(tmp_path / "run.nc")], prog_name="attnflow")
    assert info.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: interrupted"


# ---------------------------------------------------------------- record fields, dtypes
def _leaves(rec, at=()):
    """(path, value) of every leaf of a JSON record."""
    if isinstance(rec, dict):
        for key, value in rec.items():
            yield from _leaves(value, (*at, key))
    elif isinstance(rec, list):
        for i, value in enumerate(rec):
            yield from _leaves(value, (*at, i))
    else:
        yield at, rec


def _changed(value):
    """Other values of a leaf's type (and None), as a forger would write them."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, 5000]
    if isinstance(value, float):
        return [2 * value + 1]
    if isinstance(value, str):
        return ["x", value + "2"]
    return [7]


def _set(rec, at, value):
    rec = json.loads(json.dumps(rec))
    node = rec
    for key in at[:-1]:
        node = node[key]
    node[at[-1]] = value
    return rec


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", [
    {},
    {"Q": np.eye(2), "K": 2 * np.eye(2), "V": -np.eye(2)},
    {"heads": [(np.eye(2), np.eye(2), np.eye(2)), (np.eye(2), np.eye(2), np.eye(2),
                                                   np.eye(2))], "mask": "window:3",
     "mlp": "relu:3", "norm": "pre"},
])
def test_every_model_field_agrees_with_the_arrays_or_is_refused(tmp_path, model):
    """Leaves of the model record changed in turn (d, n_heads and 8 others drawn, seeded),
    the marker recomputed: the file is refused naming the model's record, or it loads a
    model whose record is the file's (no field says something the arrays do not); d = 7 and
    n_heads = 5000 are refused."""
    traj = af.simulate(af.Attention(beta=1.0, **model), af.sphere.uniform(6, 2, 0), 0.5,
                       save_at=[0.0, 0.5], seed=0)
    base = traj.to_xarray()
    meta = json.loads(base.attrs["attnflow"])["model"]
    refused = set()
    leaves = list(_leaves(meta))
    named = [leaf for leaf in leaves if leaf[0] in (("d",), ("n_heads",))]
    rest = [leaf for leaf in leaves if leaf not in named]
    picked = np.random.default_rng(len(leaves)).permutation(len(rest))[:8]  # (seconds each)
    for k, (at, value) in enumerate(named + [rest[i] for i in sorted(picked)]):
        for other in _changed(value):
            path = _forge(_record(base.copy(), model=_set(meta, at, other)),
                          tmp_path / f"f{k}-{len(refused)}-{other!s:.5}.nc")
            try:
                back = af.load(path)
                back.states  # noqa: B018
            except ValueError as err:
                message = str(err)
                assert "\n" not in message and message.startswith(f"{path}: attnflow.model")
                refused.add(at)
                continue
            rebuilt = json.loads(json.dumps(back.model.to_record()[0]))
            assert rebuilt == _set(meta, at, other), (at, other)
    assert ("d",) in refused and ("n_heads",) in refused


@pytest.mark.parametrize("stored,record,refused", [
    ("float16", {"dtype": "float64"}, True),
    ("float32", {"dtype": "float64"}, True),
    ("float64", {"dtype": "float32"}, True),
    ("float16", {}, True),  # a file of an earlier version: float32 or float64 only
    ("float64", {"integrator_dtype": "float32"}, True),  # a tensor run's record
    ("float64", {"store": "float32"}, True),
    ("float32", {"store": "float32"}, False),
    ("float32", {}, False),
    ("float16", {"dtype": "float16"}, True),  # runs keep float32 or float64 only
])
def test_the_states_dtype_is_the_records(tmp_path, stored, record, refused):
    ds = _traj().to_xarray()
    rec = json.loads(ds.attrs["attnflow"])
    if "dtype" in record:
        rec["dtype"] = record["dtype"]
    else:
        rec.pop("dtype")
    if "integrator_dtype" in record:
        rec["integrator"]["dtype"] = record["integrator_dtype"]
    if "store" in record:
        rec["integrator"]["store"] = record["store"]
    ds.attrs["attnflow"] = json.dumps(rec)
    ds["states"] = ds["states"].astype(stored)
    path = _forge(ds, tmp_path / "dtype.nc")
    if refused:
        _refused(path, "states", what=f"received {stored} states")
    else:
        assert af.load(path).states.dtype == np.dtype(stored)


def test_summaries_and_the_record_agree(tmp_path):
    plain = _traj().to_xarray()
    summed = plain.assign(summary_time=(("summary_time",), np.array([0.0, 0.5, 1.0])))
    _refused(_forge(summed, tmp_path / "s.nc"), "attnflow.integrator.store",
             what="with summaries")
    _refused(_forge(_record(plain, integrator={"method": "rk4", "store": "summaries"}),
                    tmp_path / "p.nc"), "attnflow.integrator.store", what="no summaries")


# ---------------------------------------------------------------- links that go nowhere
@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_a_symbolic_link_loop_is_said_to_be_one(tmp_path, suffix):
    from attnflow.meanfield import load as load_result
    from attnflow.pretrained.trace import load_trace

    loop = tmp_path / f"loop{suffix}"
    loop.symlink_to(loop.name)
    a, b = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    a.symlink_to(b.name)
    b.symlink_to(a.name)
    loaders = [af.load, load_result] + ([load_trace] if suffix == ".zarr" else [])
    for path in (loop, a):
        for load in loaders:
            with pytest.raises(OSError, match=rf"^\[Errno 40\] path: expected a .*, received "
                               rf"{re.escape(str(path))}, a loop of symbolic links"):
                load(path)
    dangling = tmp_path / f"gone{suffix}"
    dangling.symlink_to("nowhere" + suffix)
    with pytest.raises(FileNotFoundError, match=r"a symbolic link to nowhere.*, which does not "
                       "exist"):
        af.load(dangling)
    with pytest.raises(FileNotFoundError, match=r"^path: no trajectory at .*missing"):
        af.load(tmp_path / f"missing{suffix}")


# ---------------------------------------------------------------- trace values
def _trace_store(tmp_path: Path, name: str, *, words=None, pattern=None) -> Path:
    """A trace saved with attnflow's writer (marker and checksums right), its labels or a
    pattern replaced after `trace_dataset`'s checks."""
    from attnflow.pretrained.trace import save_trace, trace_dataset

    rng = np.random.default_rng(0)
    L, H, n = 2, 2, 6
    A = rng.random((L, H, n, n)) * np.tri(n)
    A /= A.sum(-1, keepdims=True)
    ds = trace_dataset(rng.standard_normal((L, n, 4)), rng.standard_normal((L, n, 4)),
                       np.arange(n), pattern=A, str_tokens=[f"w{i}" for i in range(n)])
    if words is not None:
        ds.attrs["str_tokens"] = words
    if pattern is not None:
        ds["blocks.1.attn.hook_pattern"] = (ds["blocks.1.attn.hook_pattern"].dims,
                                            pattern(A[1]))
    return save_trace(ds, tmp_path / name)


@pytest.mark.parametrize("case,field,what", [
    ("one label", "str_tokens", "1 labels"),
    ("a JSON object", "str_tokens", "a JSON dict"),
    ("numbers", "str_tokens", "not strings"),
    ("not JSON", "str_tokens", "a JSON str"),
    ("all 1e6", "blocks.1.attn.hook_pattern", "weights from 1e+06"),
    ("a NaN", "blocks.1.attn.hook_pattern", "1 non-finite weights"),
    ("negative", "blocks.1.attn.hook_pattern", "weights from -"),
    ("rows of 0.5", "blocks.1.attn.hook_pattern", "a row summing to 0.5"),
    ("one row off", "blocks.1.attn.hook_pattern", "query 4"),
])
def test_trace_labels_and_patterns_are_checked(tmp_path, case, field, what):
    from attnflow.pretrained.trace import ROW_SUM_TOL, load_trace

    words = {"one label": json.dumps(["w"]), "a JSON object": json.dumps({"0": "w"}),
             "numbers": json.dumps(list(range(6))), "not JSON": "[w0, w1"}.get(case)

    def one_row_off(A):
        A = A.copy()
        A[0, 4, 0] += 3 * ROW_SUM_TOL
        return A

    pattern = {"all 1e6": lambda A: np.full_like(A, 1e6),
               "a NaN": lambda A: np.where(np.arange(6 * 6 * 2).reshape(A.shape) == 9, np.nan,
                                           A),
               "negative": lambda A: A - 0.01,
               "rows of 0.5": lambda A: A / 2, "one row off": one_row_off}.get(case)
    path = _trace_store(tmp_path, f"{case.replace(' ', '-')}.zarr", words=words,
                        pattern=pattern)
    _refused(path, field, load=load_trace, what=what)


def test_a_trace_within_the_stated_tolerance_loads(tmp_path):
    from attnflow.pretrained.trace import ROW_SUM_TOL, load_trace

    def near(A):
        A = A.copy()
        A[:, 1:] *= 1 + ROW_SUM_TOL / 2  # rows (but the first, a single 1) sum to 1 + tol / 2
        return A

    ds = load_trace(_trace_store(tmp_path, "near.zarr", pattern=near))
    assert json.loads(ds.attrs["str_tokens"])[5] == "w5"
