"""Dataset files (netCDF via h5netcdf, Zarr) written so that they never pass for complete
before they are, and opened without trusting them.

Writing (`save_dataset`): the free space is checked first (one line, nothing written), the
data goes to a temporary (`attnflow._files.atomic_path`: removed on error, SIGINT, SIGTERM),
then a completeness marker is added last, the attribute ``attnflow_complete``: the SHA-256 of
the record and of every variable's name and shape. A lack of space while writing is one line
too.

Opening (`open_dataset`), before any data is read:

* the path is a regular file (netCDF) or a directory of regular files and directories
  (Zarr); links inside a store, FIFOs, devices and sockets are refused before they are
  opened, so nothing outside the path is read and nothing blocks;
* netCDF: HDF5 external links, soft links, external storage and virtual datasets are refused
  (they read other files);
* the sizes the file declares (every variable's shape times its item size, the file or
  metadata size) are at most `max_bytes`;
* files of format 2 and later (`FORMAT`) carry the marker, which must match;
* Zarr: every chunk of every array is stored (a missing chunk would read as its fill value,
  NaN; in stores of format 1, which left out chunks equal to the fill value, every chunk of
  every float array);
* the record attribute is a JSON object (deep nesting is one line, not a RecursionError).

The Dataset comes back lazy (no variable read yet, xarray's own cache off): the callers read
what they need and check it (`attnflow.trajectory.load`). Every refusal is a
`CorruptFileError` naming the file and the field.
"""

from __future__ import annotations

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
    recover,
    size_text,
    write_error,
)
from attnflow.errors import CorruptFileError

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["FORMAT", "MAX_BYTES", "open_dataset", "parse_record", "save_dataset"]

MAX_BYTES = 8 * 2**30  # the default budget of declared sizes: 8 GiB
FORMAT = 2  # files of this format carry the completeness marker
FORMAT_ATTR = "attnflow_format"
MARKER_ATTR = "attnflow_complete"


# ---------------------------------------------------------------------------- writing
def save_dataset(ds: xr.Dataset, path: Path, kind: str, record_attr: str,
                 encoding: dict[str, Any] | None = None) -> Path:
    """Write `ds` to `path` ("netcdf" or "zarr" `kind`) atomically, the marker of its record
    attribute `record_attr` last; OSError in one line when the disk is (or gets) full."""
    check_space(path, ds.nbytes)
    ds = ds.copy()
    ds.attrs[FORMAT_ATTR] = FORMAT
    mark = marker(ds, record_attr)
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

    recover(path)
    if kind == "netcdf":
        _check_regular(path, expected)
        _inspect_hdf5(path, max_bytes, expected)
    else:
        _check_regular(path, expected, directory=True)
        _inspect_zarr_tree(path, max_bytes)
        arrays = _zarr_arrays(path, expected)
        _check_budget(path, {n: (a.shape, a.dtype) for n, a in arrays}, max_bytes)
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
    if kind == "zarr":
        _check_zarr_chunks(path, arrays, strict=FORMAT_ATTR in ds.attrs)
    return ds


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


def _inspect_hdf5(path: Path, max_bytes: int | None, expected: str) -> None:
    """Refuse links to other files, external storage, virtual datasets and declared sizes
    over the budget, reading only the HDF5 metadata."""

    size = os.stat(path).st_size
    if max_bytes is not None and size > max_bytes:
        _over_budget(path, "path", size, max_bytes)
    try:
        declared = _hdf5_datasets(path)
    except CorruptFileError:
        raise
    except Exception as err:  # not HDF5, truncated, a damaged header: not a readable file
        raise unreadable(path, expected, err) from None
    _check_budget(path, declared, max_bytes)

def _hdf5_datasets(path: Path) -> dict[str, tuple[tuple[int, ...], Any]]:
    """{name: (shape, dtype)} of every dataset, refusing any link but a hard one, external
    storage and virtual datasets."""
    import h5py

    declared: dict[str, tuple[tuple[int, ...], Any]] = {}
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
    return declared

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
