"""Dequantised weights cached on disk, keyed by the checksum of the file they come from, and
verified, not trusted, when read back.

Parsing a GGUF file's header and dequantising its tensors is the slow part of opening a
real model (Gemma 3 270M: about 20 s for the header with its 262k-token vocabulary and 5 s
for the weights, every run). `WeightCache` keeps each dequantised tensor as a float32 .npy
file, and the parsed header as JSON (`read_json`, `write_json`), under

    ROOT/gguf/<SHA-256 of the GGUF file>/<tensor name>.npy, <name>.json, index.json

with ROOT the first of: the `root` argument, $ATTNFLOW_CACHE, $XDG_CACHE_HOME/attnflow,
~/.cache/attnflow. ATTNFLOW_CACHE=off turns the cache off. Another file (another checksum)
never meets the entries of the first.

Verification. When an entry is written (atomically, `attnflow._files`: an interrupted run
leaves none half-written), its size and the SHA-256 of its bytes are recorded in the folder's
``index.json``, which is rewritten (atomically) after the entry is in place: the index is
written last. Tensors are checked finite before they are written. An entry is used only when

* the index records it (an entry the index does not know, e.g. one whose run was interrupted
  between the entry and the index, is a plain miss);
* it is a regular file, not a symbolic link, FIFO, device or directory (checked with
  `os.lstat` before it is opened, and opened with O_NOFOLLOW | O_NONBLOCK, so a FIFO cannot
  block the read);
* its size and the SHA-256 of all its bytes are the recorded ones; for a tensor, its .npy
  header then says float32 of the expected shape, and its values are finite (an entry and
  its record both rewritten, e.g. by a writer of another version, can hold a NaN).

An index.json that is not a readable index (malformed, nested too deeply, another file's)
is one warning and reads as empty: every entry is then rebuilt and the index rewritten.

Anything else (an entry copied over another of the same shape, a link to another array, a
flipped bit, an edited header.json, a FIFO) is refused with a one-line `CacheWarning` naming
the entry's path, and the caller rebuilds the entry from the GGUF file. The digest covers
every byte that is read, so no change to an entry's bytes passes unnoticed, whatever its
timestamps or size; a non-finite value could only come back through a changed byte.

Cost: the hash reads each entry once per process (SHA-256 runs at about 1.8 GB/s with the
SHA extensions; a warm read of Gemma 3 270M's 1.1 GB of float32 weights: see
benchmarks/RESULTS.md). Entries are then kept memory-mapped and read-only, from the page cache.

What it does not cover: a process of the same user that rewrites an entry *and* its record
in the index (it could as well edit the package); a file changed in place while a run has it
mapped, after it was verified.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import mmap
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._files import atomic_path, write_text

__all__ = ["ENV", "INDEX_NAME", "CacheWarning", "WeightCache", "cache_root", "file_checksum"]

ENV = "ATTNFLOW_CACHE"
OFF = "off"
INDEX_NAME = "index.json"  # the entries' sizes and digests
INDEX_FORMAT = 1
MAX_INDEX_BYTES = 1 << 24  # an index larger than this is not read (a few hundred entries: KB)
_CHUNK = 1 << 23  # bytes hashed per read
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


class CacheWarning(UserWarning):
    """A weight-cache entry failed verification and is rebuilt from its source file."""


class _Refused(Exception):
    """An entry that is not what its record says (the reason is the message)."""


def cache_root() -> Path | None:
    """The cache's root folder (module docstring); None when ATTNFLOW_CACHE=off."""
    given = os.environ.get(ENV)
    if given == OFF:
        return None
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attnflow"


def file_checksum(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _regular_bytes(path: Path, max_size: int | None = None) -> mmap.mmap | bytes:
    """The bytes of a regular file, read-only (memory-mapped when not empty); _Refused for a
    link or a special file (never opened for reading), FileNotFoundError when absent."""
    before = os.lstat(path)
    if stat.S_ISLNK(before.st_mode):
        raise _Refused("a symbolic link")
    if not stat.S_ISREG(before.st_mode):
        raise _Refused("not a regular file")
    if max_size is not None and before.st_size > max_size:
        raise _Refused(f"{before.st_size} bytes, more than {max_size}")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise
        raise _Refused(f"unreadable ({err.strerror})") from err
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (before.st_dev,
                                                                          before.st_ino):
            raise _Refused("replaced while it was opened")
        if now.st_size == 0:
            return b""
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


class WeightCache:
    """The cached tensors of one source file (module docstring).

    source : the file the tensors are computed from (its checksum is the key, computed here:
        about a second for a 250 MB file).
    root : the cache's root folder (`cache_root()` unless the caller says otherwise).
    """

    def __init__(self, source: str | os.PathLike, root: str | os.PathLike) -> None:
        self.source = Path(source)
        self.key = file_checksum(self.source)
        self.folder = Path(root).expanduser() / "gguf" / self.key
        self._records: dict[str, list] | None = None
        self._arrays: dict[str, np.ndarray] = {}  # tensors verified by this process

    def path(self, name: str) -> Path:
        """Where tensor `name` is kept."""
        return self.folder / f"{name}.npy"

    # ------------------------------------------------------------------ index
    def _read_index(self, warn: bool = True) -> dict[str, list]:
        """{file name: [size, SHA-256 hex]} from index.json; empty when absent, and (with a
        warning, unless `warn` is False) when it is not a regular, well-formed index of this
        source."""
        path = self.folder / INDEX_NAME
        try:
            doc = json.loads(bytes(_regular_bytes(path, MAX_INDEX_BYTES)))
            if (doc["format"] != INDEX_FORMAT or doc["source_sha256"] != self.key
                    or not isinstance(doc["entries"], dict)):
                raise _Refused("not an index of this file's entries")
            return {str(k): [int(v[0]), str(v[1])] for k, v in doc["entries"].items()}
        except FileNotFoundError:
            return {}
        except _Refused as why:
            if warn:
                self._warn(path, str(why))
        except RecursionError:
            if warn:
                self._warn(path, "JSON nested too deeply to read")
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            if warn:
                self._warn(path, f"unreadable ({type(err).__name__})")
        return {}

    def _record(self, filename: str, size: int, digest: str) -> None:
        """Add an entry's size and digest to the index (merged with what other processes
        recorded meanwhile; written atomically, after the entry)."""
        records = self._read_index(warn=False)  # (a refused index was reported when read)
        records[filename] = [size, digest]
        self._records = records
        write_text(self.folder / INDEX_NAME, json.dumps(
            {"format": INDEX_FORMAT, "source_sha256": self.key, "entries": records}))

    def _verified(self, filename: str) -> mmap.mmap | bytes | None:
        """The bytes of entry `filename` when they are what the index records; None when
        the entry is absent or unrecorded, and (with a warning) when it is refused."""
        if self._records is None:
            self._records = self._read_index()
        record = self._records.get(filename)
        if record is None:
            return None
        path = self.folder / filename
        try:
            data = _regular_bytes(path)
            size, digest = record
            if len(data) != size:
                raise _Refused(f"{len(data)} bytes, {size} recorded")
            if hashlib.sha256(data).hexdigest() != digest:
                raise _Refused("its SHA-256 is not the one recorded when it was written")
        except FileNotFoundError:
            return None
        except _Refused as why:
            self._warn(path, str(why))
            return None
        except OSError as err:  # no permission, no memory to map it, ...
            self._warn(path, f"unreadable ({err.strerror or type(err).__name__})")
            return None
        return data

    def _warn(self, path: Path, why: str) -> None:
        warnings.warn(f"weight cache: refused {path} ({why}); rebuilt from {self.source}",
                      CacheWarning, stacklevel=4)

    # ------------------------------------------------------------------ entries
    def loaded(self, name: str) -> np.ndarray | None:
        """Tensor `name` when this process has verified (`get`) or written (`put`) it,
        else None."""
        return self._arrays.get(name)

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """The cached float32 tensor of that shape, read-only (memory-mapped), verified
        (module docstring); None when absent or refused (the next `put` rewrites it)."""
        if name in self._arrays:
            return self._arrays[name] if self._arrays[name].shape == tuple(shape) else None
        data = self._verified(f"{name}.npy")
        if data is None:
            return None
        try:
            view = _as_file(data)
            version = np.lib.format.read_magic(view)
            header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                      else np.lib.format.read_array_header_2_0)
            found, fortran, dtype = header(view)
        except (ValueError, OSError, EOFError):
            self._warn(self.path(name), "not an .npy file")
            return None
        if dtype != np.dtype("<f4") or fortran or found != tuple(shape):
            self._warn(self.path(name), f"{dtype} of shape {found}, expected float32 {shape}")
            return None
        a = np.frombuffer(data, dtype=dtype, count=int(np.prod(shape)),
                          offset=view.tell()).reshape(shape)
        bad = _non_finite(a)
        if bad:
            self._warn(self.path(name), f"{bad} non-finite values (the recorded digest is of "
                       "bytes written by another writer)")
            return None
        self._arrays[name] = a
        return a

    def put(self, name: str, a: np.ndarray) -> None:
        """Keep tensor `name` (finite; written atomically, then recorded in the index). A
        cache that cannot be written (a read-only or full disk) is skipped: the weights are
        still right, only not kept."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        if not np.isfinite(a).all():
            return
        try:
            with atomic_path(self.path(name)) as tmp:
                np.save(tmp, a, allow_pickle=False)
                size, digest = tmp.stat().st_size, file_checksum(tmp)
            self._record(self.path(name).name, size, digest)
        except OSError:
            pass
        self._arrays[name] = a  # the values just dequantised: no need to verify them

    def read_json(self, name: str) -> Any:
        """The JSON document `name` kept beside the tensors (e.g. the file's parsed header),
        verified; None when absent, refused or unreadable."""
        data = self._verified(f"{name}.json")
        try:
            return None if data is None else json.loads(bytes(data))
        except (ValueError, RecursionError):
            self._warn(self.folder / f"{name}.json", "not a JSON document this reader reads")
            return None

    def write_json(self, name: str, value: Any) -> None:
        """Keep a JSON document (atomically, then recorded in the index; skipped when the
        cache cannot be written)."""
        text = json.dumps(value).encode("utf-8")
        try:
            path = self.folder / f"{name}.json"
            with atomic_path(path) as tmp:
                tmp.write_bytes(text)
            self._record(path.name, len(text), hashlib.sha256(text).hexdigest())
        except OSError:
            pass


def _non_finite(a: np.ndarray) -> int:
    """The number of non-finite values of `a`, counted a few MB at a time (beside the
    SHA-256 of the same bytes, a fraction of its cost)."""
    flat = a.reshape(-1)
    return sum(int(flat[i:i + _CHUNK // 4].size - np.count_nonzero(
        np.isfinite(flat[i:i + _CHUNK // 4]))) for i in range(0, flat.size, _CHUNK // 4))


def _as_file(data: mmap.mmap | bytes) -> Any:
    """A file object reading `data` from its start (an mmap is one itself)."""
    if isinstance(data, mmap.mmap):
        data.seek(0)
        return data
    return io.BytesIO(data)
