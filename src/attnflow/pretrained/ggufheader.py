"""A GGUF file's header as plain data: the tensor table (`TensorInfo`: where each tensor's
stored data lies) and the metadata fields, read from `gguf`'s reader or from the JSON index
the weight cache keeps (`attnflow.pretrained.weightcache`), so that a second open parses
nothing (`attnflow.pretrained.gguf.GGUFModel`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

__all__ = ["INDEX", "INDEX_FORMAT", "READ_ERRORS", "ReaderFields", "TensorInfo", "from_index",
           "tensor_info", "to_index"]

# What the reader may raise on a malformed file (UnicodeDecodeError is a ValueError).
READ_ERRORS = (ValueError, IndexError, KeyError, TypeError, OverflowError, OSError,
               MemoryError, EOFError)


class TensorInfo(NamedTuple):
    """A tensor of the file as its header lists it: shape in GGUF's order (columns first),
    storage type (e.g. "Q4_K", "F32"), and where its stored data lies: byte offset in the
    file, numpy dtype and shape of the stored (quantised) array."""

    shape: tuple[int, ...]
    type: str
    offset: int
    raw_dtype: str
    raw_shape: tuple[int, ...]


def tensor_info(t: Any) -> TensorInfo:
    """The `TensorInfo` of a `gguf.ReaderTensor`."""
    return TensorInfo(tuple(int(s) for s in t.shape), t.tensor_type.name, int(t.data_offset),
                      t.data.dtype.str, tuple(int(s) for s in t.data.shape))


INDEX, INDEX_FORMAT = "header", 2  # the parsed header's name and format in the weight cache


def to_index(fields: Mapping[str, Any], tensors: Mapping[str, TensorInfo]) -> dict[str, Any]:
    """The JSON document of a parsed header (inverse of `from_index`)."""
    return {"format": INDEX_FORMAT, "fields": dict(fields),
            "tensors": {k: [list(t.shape), t.type, t.offset, t.raw_dtype, list(t.raw_shape)]
                        for k, t in tensors.items()}}


def from_index(doc: Any) -> tuple[dict[str, Any], dict[str, TensorInfo]] | None:
    """(fields, tensors) from a cached header document; None when it is not one."""
    try:
        if doc["format"] != INDEX_FORMAT or not isinstance(doc["fields"], dict):
            return None
        return doc["fields"], {name: TensorInfo(tuple(int(s) for s in shape), str(kind),
                                                int(offset), str(dtype),
                                                tuple(int(s) for s in raw))
                               for name, (shape, kind, offset, dtype, raw)
                               in doc["tensors"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


class ReaderFields(Mapping):
    """The reader's metadata as {key: value} (`_field_value`), each converted when read; a
    malformed entry raises the file's error (`corrupt`)."""

    def __init__(self, reader: Any, corrupt: Any) -> None:
        self._fields = reader.fields
        self._corrupt = corrupt

    def __getitem__(self, key: str) -> Any:
        try:
            return _field_value(self._fields[key])
        except KeyError:
            raise
        except READ_ERRORS as err:
            raise self._corrupt(err) from err

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


def _field_value(entry: Any) -> Any:
    """The value of a `gguf.ReaderField`: a str, int, float or bool, or a list of them."""
    import gguf

    kinds = entry.types
    if not kinds:
        raise ValueError(f"metadata {entry.name!r} without a type")
    if kinds[0] == gguf.GGUFValueType.ARRAY:
        return [_scalar(entry.parts[i], kinds[-1]) for i in entry.data]
    return _scalar(entry.parts[entry.data[0]], kinds[0])


def _scalar(part: np.ndarray, kind: Any) -> Any:
    import gguf

    if kind == gguf.GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    if kind == gguf.GGUFValueType.BOOL:
        return bool(part[0])
    value = part[0]
    return float(value) if np.issubdtype(part.dtype, np.floating) else int(value)
