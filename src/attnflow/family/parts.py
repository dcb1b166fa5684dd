"""Parts of the model family and their registry (docs/science.md §6, docs/design.md).

A part is one ingredient of a block: a normalisation scheme, a weight normalisation, a
positional encoding, QK-norm, a feed-forward term. Each is a small frozen dataclass that
declares, once,

* ``name``: the option's name: the keyword of `attnflow.Attention`, the command-line flag
  ``--name`` of ``attnflow simulate`` and the sweep axis ``name``;
* ``slot``: where a block puts it ("scheme", "weighting", "encoding", "qk_norm", "biases",
  "feedforward", "strength");
* ``help``: one line for the CLI help and the docs table;
* ``kernel_options``: the options an attention kernel needs for it (`attnflow.kernels.SUPPORTS`);
* its validation (in ``__post_init__``: every error names the argument, the expected and the
  received value);
* its text form (`parse`, `text`) and its record (`to_record`, `from_record`).

`register` adds a part class to `PARTS`; everything that lists options (the CLI, sweeps,
records, the docs table) reads `PARTS`, so adding a part is one module and its tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from attnflow._array import to_numpy
from attnflow._checks import fail

__all__ = ["KINDS", "PARTS", "SLOTS", "Part", "part_from_record", "parts_table", "register"]

SLOTS = ("scheme", "weighting", "encoding", "qk_norm", "biases", "feedforward", "strength")


@dataclass(frozen=True)
class Part:
    """Base class of the family's parts (see the module docstring)."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""  # the record's "kind" (one per concrete class; default: name)
    slot: ClassVar[str] = ""
    help: ClassVar[str] = ""
    text_help: ClassVar[str] = ""  # the text form, e.g. "BASE[:halves|adjacent[:OFFSET]]"
    kernel_options: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind") or cls.__dict__.get("name")
        if kind:
            cls.kind = kind
            KINDS[kind] = cls

    # ------------------------------------------------------------------ text
    @classmethod
    def parse(cls, text: str, name: str | None = None) -> Part | None:
        """The part from its text form (`text_help`); None for "none". `name` is how errors
        name the option (default: the part's own name)."""
        raise NotImplementedError

    def text(self) -> str:
        """The text form that `parse` reads back to an equal part (where one exists)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ records
    def to_record(self, prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A JSON-friendly description and named arrays (names start with `prefix`): the
        dataclass fields, scalars and tuples in the description, arrays as arrays (tensors
        as numpy arrays)."""
        meta: dict[str, Any] = {"kind": self.kind}
        arrays: dict[str, np.ndarray] = {}
        for f in dataclasses.fields(self):
            value = to_numpy(getattr(self, f.name))
            if isinstance(value, np.ndarray) and value.ndim == 0:
                value = value.item()
            if isinstance(value, np.ndarray):
                arrays[f"{prefix}{self.kind}_{f.name}"] = value
                meta[f.name] = {"array": f"{prefix}{self.kind}_{f.name}"}
            elif isinstance(value, Part):
                sub, sub_arrays = value.to_record(f"{prefix}{self.kind}_{f.name}_")
                meta[f.name] = {"part": sub}
                arrays.update(sub_arrays)
            else:
                meta[f.name] = list(value) if isinstance(value, tuple) else value
        return meta, arrays

    @classmethod
    def from_record(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Part:
        """Inverse of `to_record`."""
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in meta:
                continue
            value = meta[f.name]
            if isinstance(value, dict) and "array" in value:
                value = arrays[value["array"]]
            elif isinstance(value, dict) and "part" in value:
                value = part_from_record(value["part"], arrays)
            elif isinstance(value, list):
                value = tuple(value)
            kwargs[f.name] = value
        return cls(**kwargs)


P = TypeVar("P", bound=type[Part])
PARTS: dict[str, type[Part]] = {}  # option name -> the class whose `parse` reads its text
KINDS: dict[str, type[Part]] = {}  # record kind -> concrete class (filled by subclassing)


def register(cls: P) -> P:
    """Class decorator: add a part class to `PARTS` under its `name` (once)."""
    if not cls.name or cls.slot not in SLOTS:
        raise fail("part", f"a Part subclass with a name and a slot in {SLOTS}",
                   f"{cls.__name__} (name {cls.name!r}, slot {cls.slot!r})")
    if cls.name in PARTS and PARTS[cls.name] is not cls:
        raise fail("part", f"a new name (taken: {sorted(PARTS)})", repr(cls.name))
    PARTS[cls.name] = cls
    return cls


def part_from_record(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Part:
    """The part a `Part.to_record` description names by its "kind"."""
    kind = meta.get("kind")
    if kind not in KINDS:
        raise fail("record", f"a part kind among {sorted(KINDS)}", repr(kind))
    return KINDS[kind].from_record(meta, arrays)


def parts_table() -> str:
    """The registered parts as a Markdown table (name, slot, text form, kernel options,
    what it is), for the docs."""
    rows = ["| option | slot | text form | kernel options | what it is |",
            "|---|---|---|---|---|"]
    for name, cls in sorted(PARTS.items(), key=lambda kv: (SLOTS.index(kv[1].slot), kv[0])):
        opts = ", ".join(sorted(cls.kernel_options)) or "-"
        rows.append(f"| `{name}` | {cls.slot} | `{cls.text_help}` | {opts} | {cls.help} |")
    return "\n".join(rows)
