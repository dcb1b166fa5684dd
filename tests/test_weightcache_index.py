"""The weight cache's index and entries rewritten together (the index record updated to match
a damaged entry) and indexes that do not read: every case is one CacheWarning, the tensor
comes back equal to the file's, and the cache is rebuilt so that the next open is quiet.
(tests/test_weightcache_faults.py: entry faults on SmolLM2; tests/test_weightcache.py: the
cache itself, on the tiny GGUF file written by tests/test_gguf.py.)"""

from __future__ import annotations

import hashlib
import json
import warnings

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from test_gguf import hf_weights, write_tiny  # noqa: E402

from attnflow.pretrained.gguf import GGUFModel  # noqa: E402
from attnflow.pretrained.weightcache import INDEX_NAME, CacheWarning, file_checksum  # noqa: E402

NAME = "blk.0.attn_q.weight"

INDEXES = {  # index.json texts that are not a readable index of this file
    "nested": "[" * 100_000 + "]" * 100_000,
    "nested object": '{"entries": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "a list": "[1, 2]",
    "entries a list": '{"format": 1, "source_sha256": "KEY", "entries": [1]}',
    "entry a number": '{"format": 1, "source_sha256": "KEY", "entries": {"ENTRY": 3}}',
    "another file's": '{"format": 1, "source_sha256": "' + "0" * 64 + '", "entries": {}}',
    "malformed": '{"format": 1, ',
    "not UTF-8": "\udcff",
}


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny(path, hf_weights(), quantise=True)
    return path


def _quiet(path, root):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        return GGUFModel(path, cache=root).tensor(NAME)


@pytest.mark.parametrize("case", sorted(INDEXES))
def test_an_index_that_does_not_read_is_one_warning_and_rebuilt(tiny, tmp_path, case):
    root = tmp_path / "cache"
    good = np.array(GGUFModel(tiny, cache=root).tensor(NAME))
    key = file_checksum(tiny)
    index = root / "gguf" / key / INDEX_NAME
    text = INDEXES[case].replace("KEY", key).replace("ENTRY", f"{NAME}.npy")
    index.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    with pytest.warns(CacheWarning) as caught:
        again = GGUFModel(tiny, cache=root).tensor(NAME)
    np.testing.assert_array_equal(again, good)
    messages = [str(w.message) for w in caught if w.category is CacheWarning]
    assert len(messages) == 1 and messages[0].startswith(f"weight cache: refused {index} (")
    assert "\n" not in messages[0]
    json.loads(index.read_text())  # rebuilt: a readable index again
    np.testing.assert_array_equal(_quiet(tiny, root), good)


def _rewrite_with_record(folder, name, values):
    """Write `values` into entry `name` and update its index record to match (what a writer
    of another version, or a process that knows the format, could leave)."""
    entry = folder / f"{name}.npy"
    np.save(entry, values.astype(np.float32), allow_pickle=False)
    data = entry.read_bytes()
    index = folder / INDEX_NAME
    doc = json.loads(index.read_text())
    doc["entries"][entry.name] = [len(data), hashlib.sha256(data).hexdigest()]
    index.write_text(json.dumps(doc))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["first", "last", "every"])
def test_a_non_finite_entry_with_a_matching_record_is_rebuilt(tiny, tmp_path, value, where):
    root = tmp_path / "cache"
    good = np.array(GGUFModel(tiny, cache=root).tensor(NAME))
    bad = good.copy().reshape(-1)
    bad[{"first": slice(0, 1), "last": slice(-1, None), "every": slice(None)}[where]] = value
    folder = root / "gguf" / file_checksum(tiny)
    _rewrite_with_record(folder, NAME, bad.reshape(good.shape))
    with pytest.warns(CacheWarning, match=rf"refused {folder / NAME}\.npy \(\d+ non-finite"):
        again = GGUFModel(tiny, cache=root).tensor(NAME)
    np.testing.assert_array_equal(again, good)
    np.testing.assert_array_equal(_quiet(tiny, root), good)  # written back
