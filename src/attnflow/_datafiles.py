"""Dataset files (netCDF via h5netcdf, Zarr) written so that they never pass for complete
before they are, and opened without trusting them.

Writing (`save_dataset`): the free space is checked first (one line, nothing written), the
data goes to a temporary (`attnflow._files.atomic_path`: removed on error, SIGINT, SIGTERM),
then a completeness marker is added last, the attribute ``attnflow_complete``: the SHA-256 of
the record and of every variable's name and shape. A lack of space while writing is one line
too. Every variable's chunks carry the format's own checksum (`checksum_encoding`): HDF5's
Fletcher-32 filter in netCDF, Zarr 3's crc32c codec after the compressor in Zarr; the
readers (h5py, zarr) verify it whenever a chunk is read.

Opening (`open_dataset`), before any data is read:

* the path is a regular file (netCDF) or a directory of regular files and directories
  (Zarr); links inside a store, FIFOs, devices and sockets are refused before they are
  opened, so nothing outside the path is read and nothing blocks;
* netCDF: HDF5 external links, soft links, external storage and virtual datasets are refused
  (they read other files);
* the sizes the file declares (every variable's shape times its item size, the file or
  metadata size) are at most `max_bytes`;
* files of format 2 and later (`FORMAT`) carry the marker, which must match; files of
  format 3 and later carry a checksum on every variable (`CHECKSUMS_FROM`);
* Zarr: every chunk of every array is stored (a missing chunk would read as its fill value,
  NaN; in stores of format 1, which left out chunks equal to the fill value, every chunk of
  every float array);
* the record attribute is a JSON object (deep nesting is one line, not a RecursionError).

The Dataset comes back lazy (no variable read yet, xarray's own cache off): the callers read
what they need (`read_values`: a chunk that fails its checksum or does not decode is one
`CorruptFileError` naming the file, the variable and the chunk) and check it
(`attnflow.trajectory.load`). Every refusal is a `CorruptFileError` naming the file and the
field.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import inspect
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow._files import (
    atomic_path,
    check_space,
    consolidating,
    locked,
    size_text,
    write_error,
)
from attnflow.errors import CorruptFileError

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["CHECKSUMS_FROM", "FORMAT", "MAX_BYTES", "checksum_encoding", "load_values",
           "open_dataset", "parse_record", "read_values", "save_dataset"]

MAX_BYTES = 8 * 2**30  # the default budget of declared sizes: 8 GiB
FORMAT = 3  # files of format 2 and later carry the completeness marker
CHECKSUMS_FROM = 3  # files of this format and later carry a checksum on every variable
_PHONY_DIMENSION = b"This is a netCDF dimension but not a netCDF variable"
FORMAT_ATTR = "attnflow_format"
MARKER_ATTR = "attnflow_complete"


# ---------------------------------------------------------------------------- writing
def save_dataset(ds: xr.Dataset, path: Path, kind: str, record_attr: str,
                 encoding: dict[str, Any] | None = None) -> Path:
    """Write `ds` to `path` ("netcdf" or "zarr" `kind`) atomically, every variable
    checksummed (`checksum_encoding`), the marker of its record attribute `record_attr`
    last; OSError in one line when the disk is (or gets) full."""
    check_space(path, ds.nbytes)
    ds = ds.copy()
    ds.attrs[FORMAT_ATTR] = FORMAT
    mark = marker(ds, record_attr)
    encoding = checksum_encoding(ds, kind, encoding)
    with atomic_path(path) as tmp:
        try:
            if kind == "netcdf":
                _write_netcdf(ds, tmp, mark, encoding)
            else:
                _write_zarr(ds, tmp, mark, encoding)
        except Exception as err:
            full = write_error(path, err)
            if full is not None:
                raise full from None
            raise
    return path


def _write_netcdf(ds: xr.Dataset, tmp: Path, mark: str, encoding: dict | None) -> None:
    import h5py

    ds.to_netcdf(tmp, engine="h5netcdf", encoding=encoding)
    with h5py.File(tmp, "r+") as f:
        f.attrs[MARKER_ATTR] = mark


def _write_zarr(ds: xr.Dataset, tmp: Path, mark: str, encoding: dict | None) -> None:
    import zarr

    # Every chunk stored, even one equal to the fill value, so that a missing chunk is always
    # a fault (`_check_zarr_chunks`).
    with zarr.config.set({"array.write_empty_chunks": True}), consolidating():
        ds.to_zarr(tmp, mode="w", consolidated=False, encoding=encoding)
        group = zarr.open_group(tmp, mode="r+")
        group.attrs[MARKER_ATTR] = mark
        zarr.consolidate_metadata(tmp)  # xarray then opens the store without a warning


def checksum_encoding(ds: xr.Dataset, kind: str,
                      encoding: dict[str, Any] | None = None) -> dict[str, Any]:
    """`encoding` (per variable, as xarray takes it) with the format's checksum added to every
    variable: netCDF's Fletcher-32 filter (on numeric variables with data: HDF5 filters need
    chunks), or Zarr 3's crc32c codec after the compressor (zstd unless given)."""
    out = {str(name): dict(enc) for name, enc in (encoding or {}).items()}
    if kind == "zarr":
        from zarr.codecs import Crc32cCodec, ZstdCodec
    for name, var in ds.variables.items():
        enc = out.setdefault(str(name), {})
        if kind == "netcdf":
            if var.ndim and var.size and var.dtype.kind in "biuf":
                enc["fletcher32"] = True
        else:
            enc["compressors"] = (*enc.get("compressors", (ZstdCodec(),)), Crc32cCodec())
    return out


def marker(ds: xr.Dataset, record_attr: str) -> str:
    """The completeness marker of a Dataset: SHA-256 of its record attribute and of every
    variable's name and shape."""
    h = hashlib.sha256(str(ds.attrs.get(record_attr, "")).encode())
    for name in sorted(map(str, ds.variables)):
        h.update(f"\n{name}:{tuple(ds.variables[name].shape)}".encode())
    return "sha256:" + h.hexdigest()


# ---------------------------------------------------------------------------- opening
def open_dataset(path: Path, kind: str, record_attr: str, expected: str,
                 max_bytes: int | None = MAX_BYTES, indexes: bool = True) -> xr.Dataset:
    """The Dataset at an existing `path` of `kind`, lazily, after the checks of the module
    docstring; CorruptFileError naming the file and field otherwise (`expected`: what the
    file should be, for the errors about the whole file). `max_bytes` None: no budget.
    `indexes` False: no pandas indexes for the dimension coordinates (they would be read at
    opening, the token numbers of a 10^6-token run included)."""
    import xarray as xr

    if kind == "netcdf":
        _check_regular(path, expected)
        unsummed = _inspect_hdf5(path, max_bytes, expected)
    else:
        _check_regular(path, expected, directory=True)
        _inspect_zarr_tree(path, max_bytes)
        arrays = _zarr_arrays(path, expected)
        _check_budget(path, {n: (a.shape, a.dtype) for n, a in arrays}, max_bytes)
        unsummed = [name for name, arr in arrays if not _crc32c_last(arr)]
    try:
        lazy: dict[str, Any] = {"cache": False}
        if "create_default_indexes" in inspect.signature(xr.open_dataset).parameters:
            lazy["create_default_indexes"] = indexes  # (xarray >= 2025.7)
        if kind == "netcdf":
            ds = xr.open_dataset(path, engine="h5netcdf", **lazy)
        else:
            ds = xr.open_dataset(path, engine="zarr", consolidated=False, chunks=None, **lazy)
    except Exception as err:  # any reader failure: not a readable file of this kind
        raise unreadable(path, expected, err) from None
    if record_attr in ds.attrs and (FORMAT_ATTR in ds.attrs or MARKER_ATTR in ds.attrs):
        _check_marker(path, ds, record_attr)
    if unsummed and _format(ds) >= CHECKSUMS_FROM:
        raise CorruptFileError(path, unsummed[0], f"data with its checksum (files of format "
                               f"{CHECKSUMS_FROM} and later: "
                               + ("Fletcher-32" if kind == "netcdf" else "crc32c") + ")",
                               "data without one")
    if kind == "zarr":
        _check_zarr_chunks(path, arrays, strict=FORMAT_ATTR in ds.attrs)
    return ds


def _format(ds: xr.Dataset) -> int:
    value = ds.attrs.get(FORMAT_ATTR, 1)
    try:
        return int(value)
    except (TypeError, ValueError):
        return FORMAT  # a format that is not a number: held to the current one's checks


def _crc32c_last(arr: Any) -> bool:
    """Whether a Zarr array's last bytes codec is crc32c (Zarr 3 arrays only)."""
    from zarr.codecs import Crc32cCodec

    try:
        compressors = arr.compressors
    except Exception:
        return False
    return bool(compressors) and isinstance(compressors[-1], Crc32cCodec)


def read_values(path: Any, ds: xr.Dataset, name: str, index: Any = None) -> np.ndarray:
    """The values of variable `name` (at `index` along its first axis, or all), read from
    the file; a read that fails (a chunk that does not pass its checksum or does not decode,
    a chunk file that cannot be read) is one CorruptFileError naming the file, the variable
    and the first chunk that fails."""
    var = ds.variables[name]
    try:
        return np.asarray((var if index is None else var[index]).values)
    except Exception as err:
        raise _damaged(path, name, index, err) from None


def load_values(path: Any, ds: xr.Dataset) -> None:
    """Read every variable of `ds` into memory, in place; a read that fails is the one-line
    error of `read_values`."""
    for name in list(ds.variables):
        try:
            ds.variables[name].load()
        except Exception as err:
            raise _damaged(path, str(name), None, err) from None


def _damaged(path: Any, name: str, index: Any, err: BaseException) -> CorruptFileError:
    return CorruptFileError(path, name, "data that passes its checksum and decodes",
                            f"{_bad_chunk(path, name, index)} ({first_line(err)})")


def _bad_chunk(path: Any, name: str, index: Any) -> str:
    """Which chunk of variable `name` in the file at `path` fails to read (among those of
    `index` along the first axis): 'chunk (i, j, ...)' and where it is stored."""
    rows = index if isinstance(index, slice) else (
        slice(index, index + 1) if isinstance(index, (int, np.integer)) else slice(None))
    try:
        if str(path).endswith(".zarr"):
            import zarr

            arr = zarr.open_array(Path(path) / name, mode="r")
            wanted = _first_axis_chunks(rows, arr.shape, arr.chunks)
            for idx in np.ndindex(*arr.cdata_shape):
                if idx and idx[0] not in wanted:
                    continue
                try:
                    arr.blocks[idx]
                except Exception:
                    return f"chunk {idx} (file {name}/{arr.metadata.encode_chunk_key(idx)})"
        elif str(path).endswith(".nc"):
            import h5py

            with h5py.File(path, "r") as f:
                dset = f[name]
                if not dset.chunks:
                    return "its data (contiguous, without a checksum)"
                wanted = _first_axis_chunks(rows, dset.shape, dset.chunks)
                for sel in dset.iter_chunks():
                    at = tuple(s.start // c for s, c in zip(sel, dset.chunks))
                    if at[0] not in wanted:
                        continue
                    try:
                        dset[sel]
                    except Exception:
                        info = dset.id.get_chunk_info_by_coord(tuple(s.start for s in sel))
                        return (f"chunk {at} (bytes {info.byte_offset} to "
                                f"{info.byte_offset + info.size - 1} of the file)")
    except Exception as err:  # the file itself no longer opens
        return f"a read of a file that no longer opens ({first_line(err)})"
    return "a read that failed"


def _first_axis_chunks(rows: slice, shape: tuple[int, ...], chunks: tuple[int, ...]) -> range:
    """The chunk numbers along the first axis that rows `rows` of it lie in."""
    if not shape:
        return range(1)
    start, stop, _ = rows.indices(shape[0])
    return range(start // chunks[0], (max(stop, start + 1) - 1) // chunks[0] + 1)


def reading(path: Path, kind: str) -> Any:
    """The context in which a loader opens and reads a file: a Zarr store under its shared
    lock (`attnflow._files.locked`: no save replaces it meanwhile); a netCDF file, replaced
    by one rename, needs none."""
    return locked(path, shared=True) if kind == "zarr" else contextlib.nullcontext()


def check_exists(path: Path, what: str) -> None:
    """FileNotFoundError ('no WHAT at PATH') unless something is at `path`; a symbolic link
    that loops or leads nowhere is said to be one."""
    if path.exists():
        return
    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise OSError(errno.ELOOP, f"path: expected a {what}, received {path}, a loop "
                              "of symbolic links (it leads back to itself)") from None
        raise FileNotFoundError(f"path: no {what} at {path}, a symbolic link to "
                                f"{os.readlink(path)}, which does not exist")
    raise FileNotFoundError(f"path: no {what} at {path}")


def parse_record(path: Path, ds: xr.Dataset, attr: str) -> dict[str, Any]:
    """The JSON object in attribute `attr`; CorruptFileError for anything else (malformed,
    too deeply nested, not an object)."""
    text = ds.attrs[attr]
    if not isinstance(text, str):
        raise CorruptFileError(path, attr, "a JSON text (the record)", type(text).__name__)
    try:
        rec = json.loads(text)
    except RecursionError:
        raise CorruptFileError(path, attr, "a JSON object (the record)",
                               "JSON nested too deeply to read") from None
    except ValueError as err:
        raise CorruptFileError(path, attr, "a JSON object (the record)",
                               f"malformed JSON ({err})") from None
    if not isinstance(rec, dict):
        raise CorruptFileError(path, attr, "a JSON object (the record)",
                               f"a JSON {type(rec).__name__}")
    return rec


def strip_attrs(ds: xr.Dataset) -> None:
    """Remove the format and marker attributes (in place): what the caller saved comes back."""
    for name in (FORMAT_ATTR, MARKER_ATTR):
        ds.attrs.pop(name, None)


def unreadable(path: Path, expected: str, err: BaseException) -> CorruptFileError:
    """The error for a file that cannot be read as `expected`: one line, the reader's error's
    first line in it."""
    return CorruptFileError(path, "path", expected, f"which cannot be read ({first_line(err)})")


def first_line(err: BaseException) -> str:
    """The exception as 'Type: first line of its message' (for one-line error messages)."""
    text = str(err).strip().splitlines()
    return type(err).__name__ + (f": {text[0]}" if text else "")


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def _check_regular(path: Path, expected: str, directory: bool = False) -> None:
    """The path (links followed) is a regular file, or a directory: anything else is refused
    before it is opened."""
    mode = os.stat(path).st_mode
    if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
        want = "a directory" if directory else "a regular file"
        raise CorruptFileError(path, "path", expected, f"which cannot be read ({_kind_of(mode)}"
                               f", not {want})")


def _inspect_hdf5(path: Path, max_bytes: int | None, expected: str) -> list[str]:
    """Refuse links to other files, external storage, virtual datasets and declared sizes
    over the budget, reading only the HDF5 metadata; return the names of the datasets with
    data but no Fletcher-32 checksum."""

    size = os.stat(path).st_size
    if max_bytes is not None and size > max_bytes:
        _over_budget(path, "path", size, max_bytes)
    try:
        declared, unsummed = _hdf5_datasets(path)
    except CorruptFileError:
        raise
    except Exception as err:  # not HDF5, truncated, a damaged header: not a readable file
        raise unreadable(path, expected, err) from None
    _check_budget(path, declared, max_bytes)
    return unsummed

def _hdf5_datasets(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], Any]], list[str]]:
    """{name: (shape, dtype)} of every dataset, refusing any link but a hard one, external
    storage and virtual datasets; and the names of the numeric datasets with data but
    without the Fletcher-32 filter (netCDF's dimensions without a variable hold none)."""
    import h5py

    declared: dict[str, tuple[tuple[int, ...], Any]] = {}
    unsummed: list[str] = []
    with h5py.File(path, "r") as f:
        groups = [("", f)]
        while groups:
            prefix, group = groups.pop()
            for name in group:
                full = f"{prefix}/{name}".lstrip("/")
                link = group.get(name, getlink=True)
                if not isinstance(link, h5py.HardLink):
                    raise CorruptFileError(path, full, "an object stored in this file",
                                           f"an HDF5 {type(link).__name__} (to another file "
                                           "or name)")
                obj = group[name]
                if isinstance(obj, h5py.Group):
                    groups.append((full, obj))
                elif isinstance(obj, h5py.Dataset):
                    if obj.external:
                        raise CorruptFileError(path, full, "data stored in this file",
                                               "HDF5 external storage (bytes of another file)")
                    if obj.is_virtual:
                        raise CorruptFileError(path, full, "data stored in this file", "an "
                                               "HDF5 virtual dataset (data of other files)")
                    declared[full] = (obj.shape or (), obj.dtype)
                    if (not obj.fletcher32 and obj.ndim and obj.size and obj.dtype.kind in "biuf"
                            and obj.attrs.get("NAME", b"")[:len(_PHONY_DIMENSION)]
                            != _PHONY_DIMENSION):
                        unsummed.append(full)
    return declared, unsummed

def _inspect_zarr_tree(path: Path, max_bytes: int | None) -> None:
    """Every entry of the store is a regular file or a directory, not a link or a special
    file (checked without following anything); the metadata files within the budget."""
    metadata = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in dirs + files:
            entry = Path(root, name)
            mode = os.lstat(entry).st_mode
            if stat.S_ISLNK(mode):
                raise CorruptFileError(path, str(entry.relative_to(path)),
                                       "a file stored in the store", "a symbolic link")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise CorruptFileError(path, str(entry.relative_to(path)),
                                       "a regular file", _kind_of(mode))
            if name in ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"):
                metadata += os.lstat(entry).st_size
    if max_bytes is not None and metadata > max_bytes:
        _over_budget(path, "path", metadata, max_bytes)

def _check_budget(path: Path, declared: dict[str, tuple[tuple[int, ...], Any]],
                  max_bytes: int | None) -> None:
    if max_bytes is None or not declared:
        return
    sizes = {name: int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
             for name, (shape, dtype) in declared.items()}
    total = sum(sizes.values())
    if total > max_bytes:
        largest = max(sizes, key=sizes.get)
        shape, dtype = declared[largest]
        raise CorruptFileError(
            path, largest, f"declared sizes within the budget max_bytes = {size_text(max_bytes)}"
            " (pass a larger max_bytes to read it)",
            f"{size_text(total)} declared in all, {largest} {tuple(shape)} of "
            f"{np.dtype(dtype)}")

def _over_budget(path: Path, field: str, size: int, max_bytes: int) -> None:
    raise CorruptFileError(path, field, f"at most max_bytes = {size_text(max_bytes)} (pass a "
                           "larger max_bytes to read it)", size_text(size))

def _zarr_arrays(path: Path, expected: str) -> list[tuple[str, Any]]:
    """The (name, zarr array) pairs of a store, from its metadata alone."""
    import zarr

    try:
        group = zarr.open_group(path, mode="r", use_consolidated=False)  # as xarray reads it
        return [(str(name), arr) for name, arr in group.arrays()]
    except Exception as err:
        raise unreadable(path, expected, err) from None

def _check_zarr_chunks(path: Path, arrays: list[tuple[str, Any]], strict: bool) -> None:
    """Every chunk of every array stored (a missing chunk reads as the fill value); of float
    arrays only when not `strict` (stores of format 1 left out chunks equal to the fill value,
    which for floats is NaN, never in a run)."""
    for name, arr in arrays:
        if arr.size == 0 or not (strict or arr.dtype.kind in "fc"):
            continue
        stored, total = arr.nchunks_initialized, arr.nchunks
        if stored < total:
            raise CorruptFileError(path, name, f"all {total} chunks stored (a missing chunk "
                                   "reads as NaN)", f"{stored} of them")

def _check_marker(path: Path, ds: xr.Dataset, record_attr: str) -> None:
    held = ds.attrs.get(MARKER_ATTR)
    if held is None:
        raise CorruptFileError(path, MARKER_ATTR, "the completeness marker a finished save "
                               "writes last", "none (an interrupted or unfinished save)")
    ds = ds.copy()
    strip_attrs(ds)
    ds.attrs[FORMAT_ATTR] = FORMAT
    if held != marker(ds, record_attr):
        raise CorruptFileError(path, MARKER_ATTR, "the marker of this file's record and "
                               "shapes", f"{str(held)[:20]}..., another (the record or the "
                               "data were changed or are incomplete)")
