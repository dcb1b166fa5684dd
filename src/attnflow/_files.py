"""Atomic writes: an output is written under a temporary name beside its target and renamed
into place only once complete, so an interrupted write never leaves a half-written file.

The temporary is a hidden name with a random part in the target's folder, and the writer
creates the file or directory there itself, so it gets the usual permissions (0666 or 0777
less the umask, e.g. 0644 or 0755), not the 0600 (0700) of `tempfile.mkstemp` (`mkdtemp`).

Interruptions: while a temporary exists, SIGINT and SIGTERM (where their handlers are the
defaults, in the main thread) raise in the writer, so the temporary is removed; then SIGINT
goes on as KeyboardInterrupt (exit status 130), even where a C extension swallowed it
mid-write, and SIGTERM is delivered again to end the process as it would have. SIGKILL
leaves the temporary: it never passes for complete, because readers require a completeness
marker that writers add last (`attnflow._datafiles`).

A directory replaces an old one in three renames: old -> ``.NAME.old``, new -> NAME, then the
old is deleted. A process killed between the first two leaves only ``.NAME.old``:
`recover` (called by every atomic write and by the loaders) renames it back.

Concurrent saves and loads of one directory: the three renames and the recovery run under an
exclusive advisory lock (`locked`: `fcntl.flock` on ``.NAME.lock`` beside the target), and
loaders hold it shared while they read a store, so a second save waits for the first's
replace (at most `LOCK_TIMEOUT` seconds, then one line saying another process holds the path)
and a load never sees a store half replaced. The lock file is removed by the last holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_TIMEOUT", "atomic_path", "check_space", "consolidating", "locked", "recover",
           "remove_tree", "size_text", "write_error", "write_text"]

LOCK_TIMEOUT = 60.0  # seconds a save or load waits for another process's lock on its path
_LOCK_POLL = 0.01  # seconds between tries of a lock held by another process

_ROOT_METADATA = ("zarr.json", ".zgroup", ".zattrs", ".zmetadata")


class _Terminated(BaseException):
    """SIGTERM arrived during an atomic write (raised to unwind it; delivered again after)."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary path beside `path` (hidden, same suffix) for the caller to
    create a file or directory at; when the block ends without error, move it onto `path`
    (replacing a file, or a directory only once the new one is complete). On error or
    interruption (SIGINT, SIGTERM) nothing changes at `path` and the temporary is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(6)}{path.suffix}")
    with _interrupts_raise() as caught:
        try:
            yield tmp
            if caught:  # a signal whose exception a C extension swallowed mid-write
                raise _Terminated if signal.SIGTERM in caught else KeyboardInterrupt
            _replace(tmp, path)
        finally:
            remove_tree(tmp) if tmp.is_dir() else tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; return the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def recover(path: str | os.PathLike) -> None:
    """Rename a lone ``.NAME.old`` (a replace cut between its renames) back to NAME (under
    the path's lock, so that a replace in progress in another process is not undone)."""
    path = Path(path)
    old = _old(path)
    if not old.is_dir():
        return
    with locked(path):
        if old.is_dir() and not os.path.lexists(path):
            os.replace(old, path)


@contextlib.contextmanager
def locked(path: str | os.PathLike, shared: bool = False,
           timeout: float | None = None) -> Iterator[None]:
    """Hold the advisory lock of `path` (``.NAME.lock`` beside it, `fcntl.flock`): exclusive
    for a replace or a recovery, `shared` for a read. Waits at most `timeout` seconds
    (default `LOCK_TIMEOUT`), then TimeoutError in one line. Where the lock file cannot be
    created (a folder this user cannot write, where no save of this user can run either) the
    block runs unlocked. The last holder removes the lock file."""
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    fd = _acquire(path, lock, fcntl.LOCK_SH if shared else fcntl.LOCK_EX,
                  LOCK_TIMEOUT if timeout is None else timeout)
    try:
        yield
    finally:
        if fd is not None:
            _release(fd, lock)


def _acquire(path: Path, lock: Path, mode: int, wait: float) -> int | None:
    """An open descriptor of `lock` holding the flock `mode`; None where it cannot be made."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
                return None
            raise
        try:
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(
                            errno.ETIMEDOUT, f"path: expected a path no other process is "
                            f"saving to, received {path}, locked by another process for "
                            f"{wait:g} s (its lock file: {lock})") from None
                    time.sleep(_LOCK_POLL)
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, lock):  # not a lock file its last holder removed meanwhile
            return fd
        os.close(fd)


def _release(fd: int, lock: Path) -> None:
    """Unlock; the last holder (the one that can take it exclusively) removes the file."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with contextlib.suppress(OSError):
            os.unlink(lock)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def remove_tree(path: Path, settle: float = 0.05, patience: float = 2.0) -> None:
    """Delete a directory, its root metadata first, so that a deletion cut short never leaves
    a store that opens. A writer interrupted in the main thread may still have writes in
    flight in its own threads (zarr's event loop): the deletion is repeated until the path
    has stayed absent for `settle` seconds (for at most `patience` seconds)."""
    for name in _ROOT_METADATA:
        with contextlib.suppress(OSError):
            (path / name).unlink()
    deadline = time.monotonic() + patience
    while True:
        shutil.rmtree(path, ignore_errors=True)
        time.sleep(settle if time.monotonic() < deadline else 0)
        if not os.path.lexists(path) or time.monotonic() >= deadline:
            return


def check_space(path: str | os.PathLike, nbytes: int) -> None:
    """OSError (ENOSPC, one line) when the file system of `path` has less free space than
    `nbytes` plus a margin (5 % and 1 MiB), before anything is written."""
    path = Path(path)
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(folder).free
    need = int(nbytes * 1.05) + 2**20
    if free < need:
        raise OSError(errno.ENOSPC, f"path: expected room for {size_text(need)} (the data and a "
                      f"margin), received {path} on a file system with {size_text(free)} free")


def write_error(path: Path, err: BaseException) -> OSError | None:
    """A one-line OSError for a write that failed for lack of space or quota anywhere in the
    chain of `err` (zarr's asynchronous writers wrap it), else None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return OSError(err.errno, f"path: expected room to write {path}, received "
                           f"{os.strerror(err.errno).lower()} (nothing was written)")
        err = err.__cause__ or err.__context__
    return None


def size_text(nbytes: float) -> str:
    """A byte count in binary units, e.g. '8 GiB', '1.53 MiB'."""
    unit = 0
    while nbytes >= 1024 and unit < 4:
        nbytes, unit = nbytes / 1024, unit + 1
    return f"{nbytes:.3g} {('B', 'KiB', 'MiB', 'GiB', 'TiB')[unit]}"


@contextlib.contextmanager
def consolidating() -> Iterator[None]:
    """Around a Zarr write with consolidated metadata (so that xarray opens the store without
    a warning): silence zarr's warning that format 3 does not standardise it yet (zarr and
    xarray read it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        yield


@contextlib.contextmanager
def _interrupts_raise() -> Iterator[list[int]]:
    """While the block runs, SIGINT raises KeyboardInterrupt and SIGTERM `_Terminated`
    (only where their handlers are Python's defaults, and in the main thread); yield the list
    of signals caught. Afterwards the handlers are restored, and a caught SIGTERM is
    delivered again."""
    caught: list[int] = []
    installed = {}
    if threading.current_thread() is threading.main_thread():
        defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}

        def handler(signum, frame):
            caught.append(signum)
            if signum == signal.SIGTERM:
                raise _Terminated
            raise KeyboardInterrupt

        for signum, default in defaults.items():
            if signal.getsignal(signum) is default:
                installed[signum] = signal.signal(signum, handler)
    try:
        yield caught
    except _Terminated:
        pass
    finally:
        for signum, previous in installed.items():
            signal.signal(signum, previous)
        if signal.SIGTERM in caught:
            signal.raise_signal(signal.SIGTERM)


def _old(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def _replace(src: Path, dst: Path) -> None:
    """Move src onto dst; a directory replaces the old one only once src is complete (under
    the lock of dst: one replace at a time, no load in the middle of one)."""
    if not src.is_dir():
        os.replace(src, dst)
        return
    with locked(dst):
        _replace_directory(src, dst)


def _replace_directory(src: Path, dst: Path) -> None:
    if os.path.lexists(dst):
        old = _old(dst)
        if old.exists():  # a leftover beside a complete dst: garbage
            remove_tree(old)
        os.replace(dst, old)
        try:
            os.replace(src, dst)
        except BaseException:  # interrupted between the renames: the old output back
            if not os.path.lexists(dst):
                os.replace(old, dst)
            raise
        finally:
            if os.path.lexists(dst):  # also when a signal cuts the deletion short
                remove_tree(old)
    else:
        os.replace(src, dst)
