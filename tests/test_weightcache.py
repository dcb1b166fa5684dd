"""Dequantised GGUF weights cached on disk, keyed by the file's checksum: the second open reads
them instead of dequantising, another file misses, a broken entry is refused with a warning and
rewritten, an entry the index does not record (an older cache) is a quiet miss.
(tests/test_weightcache_faults.py: the faults of issue 44 on SmolLM2.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from test_gguf import hf_weights, write_tiny  # noqa: E402

import attnflow.pretrained.gguf as reader  # noqa: E402
from attnflow.pretrained.gguf import GGUFModel  # noqa: E402
from attnflow.pretrained.weightcache import (  # noqa: E402
    INDEX_NAME,
    CacheWarning,
    cache_root,
    file_checksum,
)

NAME = "blk.0.attn_q.weight"


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny(path, hf_weights(), quantise=True)
    return path


@pytest.fixture
def counted(monkeypatch):
    """How many tensors were dequantised (calls of GGUFModel._dequantise)."""
    calls = []
    real = reader.GGUFModel._dequantise

    def spy(self, name, data, shape):
        calls.append(name)
        return real(self, name, data, shape)

    monkeypatch.setattr(reader.GGUFModel, "_dequantise", spy)
    return calls


@pytest.fixture
def opened(monkeypatch):
    """How many times the file's header was parsed (GGUFModel._read: gguf.GGUFReader)."""
    calls = []
    real = reader.GGUFModel._read

    def spy(self):
        calls.append(self.path)
        return real(self)

    monkeypatch.setattr(reader.GGUFModel, "_read", spy)
    return calls


def test_the_second_open_reads_no_header(tiny, tmp_path, opened):
    root = tmp_path / "cache"
    first = GGUFModel(tiny, cache=root)
    first.block(0)
    assert len(opened) == 1
    again = GGUFModel(tiny, cache=root)
    again.block(0)
    assert len(opened) == 1  # the header and the weights came from the cache
    assert again.config == first.config
    assert again.token_ids("the") == first.token_ids("the")
    # a tensor not cached yet is read from the file at the cached offset: still no header
    q1 = again.tensor("blk.1.attn_q.weight")
    rows = again.embedding_rows([2, 0])
    assert len(opened) == 1
    plain = GGUFModel(tiny, cache=False)  # parses the header
    np.testing.assert_array_equal(q1, plain.tensor("blk.1.attn_q.weight"))
    np.testing.assert_array_equal(rows, plain.embeddings[[2, 0]])


def test_a_broken_header_entry_is_ignored_and_rewritten(tiny, tmp_path, opened):
    root = tmp_path / "cache"
    config = GGUFModel(tiny, cache=root).config
    entry = root / "gguf" / file_checksum(tiny) / "header.json"
    entry.write_text(entry.read_text()[:-50])
    with pytest.warns(CacheWarning, match=r"refused .*header\.json \(\d+ bytes, \d+ recorded\)"):
        assert GGUFModel(tiny, cache=root).config == config
    assert len(opened) == 2
    assert GGUFModel(tiny, cache=root).config == config
    assert len(opened) == 2  # rewritten whole


def test_the_second_open_reads_the_cache(tiny, tmp_path, counted):
    root = tmp_path / "cache"
    first = GGUFModel(tiny, cache=root).tensor(NAME)
    assert counted == [NAME]
    entry = root / "gguf" / file_checksum(tiny) / f"{NAME}.npy"
    assert entry.is_file()
    again = GGUFModel(tiny, cache=root)
    second = again.tensor(NAME)
    assert counted == [NAME]  # not dequantised again
    np.testing.assert_array_equal(first, second)
    assert not second.flags.writeable
    # rows of a cached tensor come from the cache too (the quantised embeddings)
    whole = again.tensor("token_embd.weight")
    rows = again.tensor("token_embd.weight", rows=np.array([3, 1]))
    np.testing.assert_array_equal(rows, whole[[3, 1]])
    assert counted == [NAME, "token_embd.weight"]


def test_another_file_misses(tiny, tmp_path, counted):
    root = tmp_path / "cache"
    GGUFModel(tiny, cache=root).tensor(NAME)
    other = tmp_path / "other.gguf"
    write_tiny(other, hf_weights(seed=1), quantise=True)
    b = GGUFModel(other, cache=root).tensor(NAME)
    assert counted == [NAME, NAME]
    np.testing.assert_array_equal(b, GGUFModel(other, cache=False).tensor(NAME))
    assert len(list((root / "gguf").iterdir())) == 2


@pytest.mark.parametrize("damage", ["truncate", "garbage", "shape"])
def test_a_broken_entry_is_ignored_and_rewritten(tiny, tmp_path, counted, damage):
    root = tmp_path / "cache"
    good = GGUFModel(tiny, cache=root).tensor(NAME)
    entry = root / "gguf" / file_checksum(tiny) / f"{NAME}.npy"
    if damage == "truncate":
        entry.write_bytes(entry.read_bytes()[:-100])
    elif damage == "garbage":
        entry.write_bytes(b"not an npy file")
    else:
        np.save(entry, np.zeros((2, 2), np.float32))
    with pytest.warns(CacheWarning, match=f"refused {entry} "):
        again = GGUFModel(tiny, cache=root).tensor(NAME)
    np.testing.assert_array_equal(again, good)
    assert counted == [NAME, NAME]  # dequantised again ...
    np.testing.assert_array_equal(np.load(entry), good)  # ... and written back whole


def test_the_cache_root_and_off(monkeypatch, tiny, tmp_path, counted):
    monkeypatch.setenv("ATTNFLOW_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    GGUFModel(tiny).tensor(NAME)
    assert (tmp_path / "env" / "gguf").is_dir()
    monkeypatch.setenv("ATTNFLOW_CACHE", "off")
    assert cache_root() is None
    GGUFModel(tiny).tensor(NAME)
    GGUFModel(tiny).tensor(NAME)
    assert counted == [NAME, NAME, NAME]
    monkeypatch.delenv("ATTNFLOW_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "attnflow"
    with pytest.raises(ValueError, match=r"cache: expected True, False or a folder"):
        GGUFModel(tiny, cache=3)


def test_an_unrecorded_entry_is_a_quiet_miss(tiny, tmp_path, counted, recwarn):
    """An entry without a record (a cache written before entries were recorded, or a run
    stopped between the entry and the index) is dequantised again, without a warning."""
    root = tmp_path / "cache"
    good = GGUFModel(tiny, cache=root).tensor(NAME)
    (root / "gguf" / file_checksum(tiny) / INDEX_NAME).unlink()
    np.testing.assert_array_equal(GGUFModel(tiny, cache=root).tensor(NAME), good)
    assert counted == [NAME, NAME]
    assert not [w for w in recwarn if w.category is CacheWarning]
    GGUFModel(tiny, cache=root).tensor(NAME)
    assert counted == [NAME, NAME]  # recorded again


@pytest.mark.timeout(60)
def test_a_fifo_index_is_refused_without_blocking(tiny, tmp_path, counted):
    root = tmp_path / "cache"
    good = GGUFModel(tiny, cache=root).tensor(NAME)
    index = root / "gguf" / file_checksum(tiny) / INDEX_NAME
    index.unlink()
    os.mkfifo(index)
    with pytest.warns(CacheWarning, match=f"refused {index} \\(not a regular file\\)") as caught:
        np.testing.assert_array_equal(GGUFModel(tiny, cache=root).tensor(NAME), good)
    assert len([w for w in caught if w.category is CacheWarning]) == 1
    assert index.is_file()  # replaced by a written index
