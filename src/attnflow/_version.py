"""The one source of attnflow's version (pyproject.toml reads it from here), the git commit of
the source tree when the package runs from a git checkout, and a description of the machine:
what saved results record about their making.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

__all__ = ["__version__", "git_commit", "machine", "provenance"]

__version__ = "0.1.0"


@functools.cache
def git_commit() -> str | None:
    """The commit (40 hex digits, "+dirty" appended when tracked files differ from it) of the
    git checkout this package is imported from, or None: an installed wheel, no git program,
    or a package that is not part of the repository around it. Computed once per process."""
    package = Path(__file__).resolve().parent
    try:
        top = _git(package, "rev-parse", "--show-toplevel")
        if top is None or Path(top, "src", "attnflow").resolve() != package:
            return None
        commit = _git(package, "rev-parse", "HEAD")
        dirty = _git(package, "status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    if commit is None:
        return None
    return commit + ("+dirty" if dirty else "")


def provenance() -> dict[str, str | None]:
    """{"version": ..., "commit": ...}: what every saved result records about its maker."""
    return {"version": __version__, "commit": git_commit()}


@functools.cache
def machine() -> str:
    """The machine in words: CPU model, logical CPUs, OS and architecture, Python version."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}")


def _git(cwd: Path, *args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    return done.stdout.strip() if done.returncode == 0 else None
