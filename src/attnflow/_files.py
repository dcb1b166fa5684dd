"""Atomic writes: an output is written under a temporary name beside its target and renamed
into place only once complete, so an interrupted write never leaves a half-written file.

The temporary is a hidden name with a random part in the target's folder, and the writer
creates the file or directory there itself, so it gets the usual permissions (0666 or 0777
less the umask, e.g. 0644 or 0755), not the 0600 (0700) of `tempfile.mkstemp` (`mkdtemp`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "consolidating", "write_text"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary path beside `path` (hidden, same suffix) for the caller to
    create a file or directory at; when the block ends without error, move it onto `path`
    (replacing a file, or a directory only once the new one is complete). On error nothing
    changes at `path` and the temporary is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(6)}{path.suffix}")
    try:
        yield tmp
        _replace(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; return the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


@contextlib.contextmanager
def consolidating() -> Iterator[None]:
    """Around a Zarr write with consolidated metadata (so that xarray opens the store without
    a warning): silence zarr's warning that format 3 does not standardise it yet (zarr and
    xarray read it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        yield


def _replace(src: Path, dst: Path) -> None:
    """Move src onto dst; a directory replaces the old one only once src is complete."""
    if src.is_dir() and dst.exists():
        old = dst.with_name(f".{dst.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)
