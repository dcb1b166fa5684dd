"""Data checksums in saved runs: every variable of a new save carries its format's own
checksum (HDF5's Fletcher-32 in netCDF, Zarr 3's crc32c), verified when a chunk is read. A bit
flipped anywhere in the stored states, a chunk emptied or filled with garbage, is one
`CorruptFileError` line naming the file, the variable and the chunk, never data; files
without checksums (earlier formats) still load."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import attnflow as af
from attnflow import _datafiles, trajectory
from attnflow.errors import CorruptFileError

pytestmark = pytest.mark.timeout(120)

TRIALS = 50


def _traj(times: int = 6, n: int = 40, d: int = 3) -> af.Trajectory:
    x = np.random.default_rng(7).standard_normal((times, n, d))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return af.Trajectory(times=np.arange(times, dtype=float), states=x,
                         model=af.Attention(beta=1.0), integrator={"method": "rk4"}, seed=7)


def _stored_bytes(path: Path) -> list[tuple[Path, int, int]]:
    """(file, first byte, size) of every stored chunk of the states."""
    if path.suffix == ".nc":
        with h5py.File(path, "r") as f:
            dset = f["states"]
            infos = [dset.id.get_chunk_info(i) for i in range(dset.id.get_num_chunks())]
        return [(path, info.byte_offset, info.size) for info in infos]
    return [(p, 0, p.stat().st_size) for p in sorted((path / "states").rglob("*"))
            if p.is_file() and p.name != "zarr.json"]


def _flip(target: Path, rng: np.random.Generator) -> str:
    """Flip one random bit of the stored states (uniform over their bytes); say where."""
    pieces = _stored_bytes(target)
    sizes = np.array([size for _, _, size in pieces])
    k = int(rng.choice(len(pieces), p=sizes / sizes.sum()))
    file, first, size = pieces[k]
    at, bit = first + int(rng.integers(size)), int(rng.integers(8))
    with open(file, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ (1 << bit)]))
    return f"{file.name} byte {at} bit {bit}"


def _one_line_refusal(err: CorruptFileError, path: Path) -> None:
    message = str(err)
    assert "\n" not in message and message.startswith(f"{path}: states: expected data that "
                                                      "passes its checksum"), message
    assert re.search(r"received chunk \(\d+, 0, 0, 0\)", message), message


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_a_flipped_bit_in_the_states_is_refused_never_loaded(tmp_path, monkeypatch, suffix):
    """50 seeded trials: one bit flipped at a random position of the stored states; each
    load either equals the run or is refused in one line (with checksums: always refused,
    since Fletcher-32 and CRC-32C detect every single-bit error)."""
    monkeypatch.setattr(trajectory, "CHUNK_BYTES", 2 * 40 * 3 * 8)  # 2 save times per chunk
    traj = _traj()
    pristine = traj.save(tmp_path / f"pristine{suffix}")
    assert len(_stored_bytes(pristine)) == 3
    rng = np.random.default_rng(2026)
    refused = 0
    for trial in range(TRIALS):
        path = tmp_path / f"t{trial}{suffix}"
        (shutil.copytree if suffix == ".zarr" else shutil.copyfile)(pristine, path)
        where = _flip(path, rng)
        try:
            back = af.load(path).states
        except CorruptFileError as err:
            _one_line_refusal(err, path)
            refused += 1
            continue
        assert np.array_equal(back, traj.states), where  # loaded: then it is the run
    assert refused == TRIALS


@pytest.mark.parametrize("damage", ["empty", "garbage", "zeros"])
@pytest.mark.parametrize("checksums", [True, False])
def test_a_damaged_zarr_chunk_is_one_line_naming_it(tmp_path, monkeypatch, damage, checksums):
    """A chunk emptied, filled with garbage or zeroed, with checksums and without (a store
    of format 2, whose zstd frames fail to decode): one line naming the chunk, lazily at the
    read, and the same through `attnflow plot` and `attnflow explore`."""
    from attnflow.cli import app

    if not checksums:
        monkeypatch.setattr(_datafiles, "FORMAT", 2)
        monkeypatch.setattr(_datafiles, "checksum_encoding", lambda ds, kind, enc=None: enc)
    monkeypatch.setattr(trajectory, "CHUNK_BYTES", 40 * 3 * 8)  # one save time per chunk
    path = _traj().save(tmp_path / "run.zarr")
    chunk = path / "states" / "c" / "3" / "0" / "0" / "0"
    size = chunk.stat().st_size
    chunk.write_bytes({"empty": b"", "garbage": np.random.default_rng(0).bytes(size),
                       "zeros": bytes(size)}[damage])
    traj = af.load(path)  # lazily: the states are not read yet
    assert np.array_equal(traj.at(2.0), _traj().at(2.0))  # other chunks still read
    with pytest.raises(CorruptFileError) as info:
        traj.at(3.0)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: states: ")
    assert "chunk (3, 0, 0, 0) (file states/c/3/0/0/0)" in message, message
    for command in (["plot", str(path), "--out", str(tmp_path / "p.png")],
                    ["explore", str(path), "--out", str(tmp_path / "p.html")]):
        with pytest.raises(SystemExit) as exited:
            app(command, prog_name="attnflow")
        assert exited.value.code == 2


def test_checksums_are_written_and_required_in_new_files(tmp_path):
    traj = af.Trajectory(times=np.arange(3.0), states=_traj(3).states,
                         model=af.Attention(beta=1.0, Q=np.eye(3), K=2 * np.eye(3)),
                         integrator={"method": "rk4"})
    nc = traj.save(tmp_path / "run.nc")
    with h5py.File(nc, "r") as f:
        for name in ("states", "time", "Q_0", "K_0"):
            assert f[name].fletcher32, name
    store = traj.save(tmp_path / "run.zarr")
    for name in ("states", "time", "Q_0", "K_0"):
        assert isinstance(zarr.open_array(store / name).compressors[-1],
                          zarr.codecs.Crc32cCodec), name
    assert np.array_equal(af.load(nc).states, traj.states)
    assert np.array_equal(af.load(store).states, traj.states)
    # a file of this format whose states lost their checksum (rewritten without) is refused
    ds = traj.to_xarray()
    ds.attrs[_datafiles.FORMAT_ATTR] = _datafiles.FORMAT
    ds.attrs[_datafiles.MARKER_ATTR] = _datafiles.marker(ds, "attnflow")
    ds.to_netcdf(tmp_path / "bare.nc", engine="h5netcdf")
    with pytest.raises(CorruptFileError, match=r"bare.nc: (states|time|Q_0|K_0): expected data "
                       r"with its checksum \(files of format 3 and later: Fletcher-32\)"):
        af.load(tmp_path / "bare.nc")
    ds.to_zarr(tmp_path / "bare.zarr", mode="w", consolidated=False)
    with pytest.raises(CorruptFileError, match="expected data with its checksum"):
        af.load(tmp_path / "bare.zarr")


def test_files_without_checksums_still_load(tmp_path, monkeypatch):
    """Format 2 (the marker, no checksums) and format 1 (neither) load as before."""
    traj = _traj()
    traj.to_xarray().to_netcdf(tmp_path / "v1.nc", engine="h5netcdf")
    monkeypatch.setattr(_datafiles, "FORMAT", 2)
    monkeypatch.setattr(_datafiles, "checksum_encoding", lambda ds, kind, enc=None: enc)
    traj.save(tmp_path / "v2.nc")
    traj.save(tmp_path / "v2.zarr")
    monkeypatch.undo()
    with h5py.File(tmp_path / "v2.nc", "r") as f:
        assert not f["states"].fletcher32
    for name in ("v1.nc", "v2.nc", "v2.zarr"):
        assert np.array_equal(af.load(tmp_path / name).states, traj.states)


def test_a_damaged_model_array_is_one_line_at_open(tmp_path):
    traj = af.Trajectory(times=np.arange(3.0), states=_traj(3).states,
                         model=af.Attention(beta=1.0, Q=np.eye(3)), integrator={"method": "rk4"})
    path = traj.save(tmp_path / "q.zarr")
    (path / "Q_0" / "c" / "0" / "0").write_bytes(b"\x00" * 7)
    with pytest.raises(CorruptFileError, match=r"q.zarr: Q_0: expected data that passes its "
                       r"checksum and decodes, received chunk \(0, 0\) \(file Q_0/c/0/0\)"):
        af.load(path)
