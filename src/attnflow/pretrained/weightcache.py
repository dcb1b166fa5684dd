"""Dequantised weights cached on disk, keyed by the checksum of the file they come from.

Parsing a GGUF file's header and dequantising its tensors is the slow part of opening a
real model (Gemma 3 270M: about 20 s for the header with its 262k-token vocabulary and 5 s
for the weights, every run). `WeightCache` keeps each dequantised tensor as a float32 .npy
file, and the parsed header as JSON (`read_json`, `write_json`), under

    ROOT/gguf/<SHA-256 of the GGUF file>/<tensor name>.npy, <name>.json

with ROOT the first of: the `root` argument, $ATTNFLOW_CACHE, $XDG_CACHE_HOME/attnflow,
~/.cache/attnflow. ATTNFLOW_CACHE=off turns the cache off. Another file (another checksum)
never meets the entries of the first; an entry is written atomically (`attnflow._files`),
so an interrupted run leaves none half-written, and one that does not read back as the
expected float32 array (truncated, another shape, not an .npy file) is ignored and written
again. Entries open memory-mapped and read-only: a second run reads the weights it uses
from the page cache instead of dequantising them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._files import atomic_path, write_text

__all__ = ["ENV", "WeightCache", "cache_root", "file_checksum"]

ENV = "ATTNFLOW_CACHE"
OFF = "off"
_CHUNK = 1 << 23  # bytes hashed per read


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


class WeightCache:
    """The cached tensors of one source file (module docstring).

    source : the file the tensors are computed from (its checksum is the key, computed here:
        about a second for a 250 MB file).
    root : the cache's root folder (`cache_root()` unless the caller says otherwise).
    """

    def __init__(self, source: str | os.PathLike, root: str | os.PathLike) -> None:
        self.source = Path(source)
        self.folder = Path(root).expanduser() / "gguf" / file_checksum(self.source)

    def path(self, name: str) -> Path:
        """Where tensor `name` is kept."""
        return self.folder / f"{name}.npy"

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """The cached float32 tensor of that shape, read-only (memory-mapped); None when
        absent or unreadable as one (such an entry is rewritten by the next `put`)."""
        try:
            a = np.load(self.path(name), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None
        if a.dtype != np.float32 or a.shape != tuple(shape):
            return None
        return a

    def read_json(self, name: str) -> Any:
        """The JSON document `name` kept beside the tensors (e.g. the file's parsed header);
        None when absent or unreadable."""
        try:
            return json.loads((self.folder / f"{name}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def write_json(self, name: str, value: Any) -> None:
        """Keep a JSON document (atomically; skipped when the cache cannot be written)."""
        try:
            write_text(self.folder / f"{name}.json", json.dumps(value))
        except OSError:
            pass

    def put(self, name: str, a: np.ndarray) -> None:
        """Keep tensor `name` (written atomically). A cache that cannot be written (a
        read-only or full disk) is skipped: the weights are still right, only not kept."""
        try:
            with atomic_path(self.path(name)) as tmp:
                np.save(tmp, np.ascontiguousarray(a, dtype=np.float32), allow_pickle=False)
        except OSError:
            pass
