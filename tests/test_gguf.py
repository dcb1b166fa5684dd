"""GGUF reading (attnflow.pretrained.gguf), its tokenizer and the numpy forward pass, on tiny
LLaMA files written at test time with the `gguf` package's own writer.

Truth: the weights written (in Hugging Face's layout, permuted as GGUF's converter does), and a
forward pass written here independently, token by token and head by head, in that layout with
"halves" RoPE through complex numbers; a malformed file must give a ValueError naming it.
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from tokenizers import pre_tokenizers  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from attnflow.cli import app  # noqa: E402
from attnflow.pretrained.forward import (  # noqa: E402
    attention_stack,
    forward,
    log_likelihoods,
    perplexity,
)
from attnflow.pretrained.gguf import GGUFModel  # noqa: E402
from attnflow.pretrained.spectra import write_spectra  # noqa: E402
from attnflow.simulate import simulate  # noqa: E402

D, H, HKV, E, FF, LAYERS = 32, 4, 2, 8, 64, 2
EPS, BASE = 1e-5, 500.0
ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())
MERGES = ["Ġ t", "h e", "Ġt he", "Ã ©"]
CONTROL = ["<|s|>", "<|e|>"]
TOKENS = ALPHABET + ["Ġt", "he", "Ġthe", "Ã©"] + CONTROL
TYPES = [1] * (len(TOKENS) - len(CONTROL)) + [3] * len(CONTROL)


def hf_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights of a tiny LLaMA in Hugging Face's layout (W_Q rows: heads, then halves)."""
    rng = np.random.default_rng(seed)
    w = {"embed": rng.normal(size=(len(TOKENS), D)), "norm": 1 + 0.1 * rng.normal(size=D)}
    for L in range(LAYERS):
        w[f"{L}.attn_norm"] = 1 + 0.1 * rng.normal(size=D)
        w[f"{L}.ffn_norm"] = 1 + 0.1 * rng.normal(size=D)
        w[f"{L}.q"] = rng.normal(size=(H * E, D)) / np.sqrt(D)
        w[f"{L}.k"] = rng.normal(size=(HKV * E, D)) / np.sqrt(D)
        w[f"{L}.v"] = rng.normal(size=(HKV * E, D)) / np.sqrt(D)
        w[f"{L}.o"] = rng.normal(size=(D, H * E)) / np.sqrt(H * E)
        w[f"{L}.gate"] = rng.normal(size=(FF, D)) / np.sqrt(D)
        w[f"{L}.up"] = rng.normal(size=(FF, D)) / np.sqrt(D)
        w[f"{L}.down"] = rng.normal(size=(D, FF)) / np.sqrt(FF)
    return {k: v.astype(np.float32) for k, v in w.items()}


def permute(W: np.ndarray, heads: int) -> np.ndarray:
    """GGUF's converter: within each head, row 2p <- row p, row 2p + 1 <- row p + e/2."""
    return W.reshape(heads, 2, W.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(W.shape)


def write_tiny(path, w: dict[str, np.ndarray], arch: str = "llama", quantise: bool = False,
               extra: dict[str, np.ndarray] | None = None, skip: tuple[str, ...] = (),
               eps: float = EPS) -> None:
    """A tiny LLaMA GGUF file (embeddings in Q8_0 when quantise) through gguf.GGUFWriter."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(H)
    writer.add_head_count_kv(HKV)
    writer.add_rope_freq_base(BASE)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_merges(MERGES)
    writer.add_token_types(TYPES)
    tensors = {"token_embd.weight": w["embed"], "output_norm.weight": w["norm"]}
    for L in range(LAYERS):
        tensors.update({
            f"blk.{L}.attn_norm.weight": w[f"{L}.attn_norm"],
            f"blk.{L}.ffn_norm.weight": w[f"{L}.ffn_norm"],
            f"blk.{L}.attn_q.weight": permute(w[f"{L}.q"], H),
            f"blk.{L}.attn_k.weight": permute(w[f"{L}.k"], HKV),
            f"blk.{L}.attn_v.weight": w[f"{L}.v"],
            f"blk.{L}.attn_output.weight": w[f"{L}.o"],
            f"blk.{L}.ffn_gate.weight": w[f"{L}.gate"],
            f"blk.{L}.ffn_up.weight": w[f"{L}.up"],
            f"blk.{L}.ffn_down.weight": w[f"{L}.down"]})
    tensors.update(extra or {})
    for name, array in tensors.items():
        if name in skip:
            continue
        if quantise and name == "token_embd.weight":
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(array, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(path, HF-layout weights) of a tiny float32 LLaMA GGUF file."""
    w = hf_weights()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny(path, w)
    return path, w


def reference_forward(w: dict[str, np.ndarray], ids, mlp: bool = True, offset: int = 0):
    """The LLaMA forward pass in Hugging Face's layout, token by token and head by head, with
    'halves' RoPE as complex rotation of (x_p, x_{p+e/2}). Returns the hidden states after
    each layer (L + 1, n, d), the attention weights (L, H, n, n) and the logits (n, vocab)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    n = len(ids)
    omega = BASE ** (-2.0 * np.arange(E // 2) / E)

    def norm(x, g):
        return g * x / np.sqrt(np.mean(x * x) + EPS)

    def rot(x, m):
        z = (x[: E // 2] + 1j * x[E // 2:]) * np.exp(1j * (m + offset) * omega)
        return z

    x = w["embed"][list(ids)].copy()
    hidden, attn = [x.copy()], np.zeros((LAYERS, H, n, n))
    for L in range(LAYERS):
        u = np.array([norm(x[i], w[f"{L}.attn_norm"]) for i in range(n)])
        new = x.copy()
        for i in range(n):
            out = np.zeros(H * E)
            for h in range(H):
                kv = h // (H // HKV)
                q = rot(w[f"{L}.q"][h * E:(h + 1) * E] @ u[i], i)
                s = np.array([np.real(np.vdot(rot(w[f"{L}.k"][kv * E:(kv + 1) * E] @ u[j], j),
                                              q)) for j in range(i + 1)]) / np.sqrt(E)
                a = np.exp(s - s.max())
                a /= a.sum()
                attn[L, h, i, : i + 1] = a
                vals = np.array([w[f"{L}.v"][kv * E:(kv + 1) * E] @ u[j] for j in range(i + 1)])
                out[h * E:(h + 1) * E] = a @ vals
            new[i] = x[i] + w[f"{L}.o"] @ out
        x = new
        if mlp:
            for i in range(n):
                z = norm(x[i], w[f"{L}.ffn_norm"])
                gate = w[f"{L}.gate"] @ z
                x[i] = x[i] + w[f"{L}.down"] @ (gate / (1 + np.exp(-gate)) * (w[f"{L}.up"] @ z))
        hidden.append(x.copy())
    logits = np.array([w["embed"] @ norm(x[i], w["norm"]) for i in range(n)])
    return np.array(hidden), attn, logits


# ---------------------------------------------------------------------------- reading
def test_reader_returns_the_written_weights_with_gqa_heads(tiny):
    path, w = tiny
    m = GGUFModel(path)
    c = m.config
    assert (c.d, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff) == (D, LAYERS, H, HKV,
                                                                            E, FF)
    assert (c.vocab_size, c.rope_base, c.context_length) == (len(TOKENS), BASE, 64)
    assert np.isclose(c.rms_eps, EPS, rtol=1e-7) and c.tied_embeddings and c.name == "tiny-llama"
    assert c.rope.pairing == "adjacent" and c.rope.base == BASE
    assert not m.quantised and "float weights" in m.note
    layer = m.layer(1)
    np.testing.assert_array_equal(m.block(1).W_Q, permute(w["1.q"], H))
    assert layer.W_Q.dtype == np.float64 and layer.W_Q.shape == (H, E, D)
    assert list(layer.kv_head) == [0, 0, 1, 1]
    k_rows = permute(w["1.k"], HKV).reshape(HKV, E, D)
    for h in range(H):  # heads sharing a key/value head read the same K and V rows
        np.testing.assert_array_equal(layer.W_K[h], k_rows[h // 2])
        np.testing.assert_array_equal(layer.W_V[h], w["1.v"].reshape(HKV, E, D)[h // 2])
        np.testing.assert_array_equal(layer.W_O[h], w["1.o"][:, h * E:(h + 1) * E])
    np.testing.assert_array_equal(layer.norm_gains["ffn_norm"], w["1.ffn_norm"])
    np.testing.assert_array_equal(m.embed([3, 0]), w["embed"][[3, 0]])
    # the converter's permutation leaves W_Q^T W_K (positionless scores) unchanged
    hf = w["1.q"][:E].astype(float).T @ w["1.k"][:E].astype(float) / np.sqrt(E)
    np.testing.assert_allclose(layer.qk_form(0), hf, atol=1e-12)
    with pytest.raises(ValueError, match="layer"):
        m.block(LAYERS)


def test_quantised_tensors_are_dequantised_by_gguf_and_flagged(tmp_path):
    w = hf_weights()
    path = tmp_path / "q8.gguf"
    write_tiny(path, w, quantise=True)
    m = GGUFModel(path)
    q8 = gguf.GGMLQuantizationType.Q8_0
    expected = gguf.quants.dequantize(gguf.quants.quantize(w["embed"], q8), q8)
    np.testing.assert_array_equal(m.embeddings, expected)
    assert 0 < np.abs(m.embeddings - w["embed"]).max() < 0.02 * np.abs(w["embed"]).max()
    assert m.quantised and "Q8_0 (1)" in m.note and "approximate" in m.note


# ---------------------------------------------------------------------------- forward pass
def test_forward_matches_an_independent_token_by_token_reference(tiny):
    path, w = tiny
    m = GGUFModel(path)
    ids = [TOKENS.index("Ġthe"), 5, 70, TOKENS.index("<|s|>"), 200, 9, 9]
    for mlp in (False, True):
        run = forward(m, ids, attention=True, mlp=mlp)
        hidden, attn, logits = reference_forward(w, ids, mlp=mlp)
        np.testing.assert_allclose(run.hidden, hidden, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(run.attention, attn, atol=1e-12)
        np.testing.assert_allclose(run.logits, logits, rtol=1e-10, atol=1e-10)
    last = forward(m, ids, logits="last", dtype=np.float32)
    assert last.logits.shape == (1, len(TOKENS)) and last.hidden.dtype == np.float32
    np.testing.assert_allclose(last.logits[0], logits[-1], rtol=1e-4, atol=1e-4)
    z = logits - logits.max(axis=1, keepdims=True)
    want = np.exp(-np.mean([z[i, ids[i + 1]] - np.log(np.exp(z[i]).sum())
                            for i in range(len(ids) - 1)]))
    assert np.isclose(perplexity(m, ids), want, rtol=1e-10)
    assert forward(m, ids, logits="none").logits is None
    with pytest.raises(ValueError, match="token_ids"):
        forward(m, [len(TOKENS)])
    with pytest.raises(ValueError, match="logits"):
        log_likelihoods(logits, ids[:3])


def test_forward_is_causal_bit_for_bit(tiny):
    m = GGUFModel(tiny[0])
    ids = [5, 70, 3, 200, 9, 44, 12]
    for k in (2, 5):
        changed = list(ids)
        changed[k] = 101
        a, b = forward(m, ids).hidden, forward(m, changed).hidden
        assert np.array_equal(a[:, :k], b[:, :k])
        assert np.all(np.abs(a[1:, k:] - b[1:, k:]).max(axis=(0, 2)) > 0)


def test_rope_scores_depend_only_on_relative_positions(tiny):
    path, w = tiny
    m = GGUFModel(path)
    ids = [5, 70, 3, 200, 9]
    base, shifted = forward(m, ids, attention=True), forward(m, ids, attention=True, offset=977)
    np.testing.assert_allclose(shifted.attention, base.attention, rtol=0, atol=1e-12)
    np.testing.assert_allclose(shifted.hidden, base.hidden, rtol=1e-10, atol=1e-12)
    _, attn, _ = reference_forward(w, ids, offset=977)  # the reference agrees at the offset
    np.testing.assert_allclose(shifted.attention, attn, atol=1e-12)
    assert not np.allclose(forward(m, ids[::-1], attention=True).attention[:, :, -1, ::-1],
                           base.attention[:, :, -1], atol=1e-6)  # positions do matter


def test_euler_steps_of_the_attention_stack_are_the_attention_only_forward_pass(tmp_path):
    """With eps = 0, one Euler step of size 1 per layer of the idealised pre-LN dynamics is the
    real forward pass without MLP: same states, same attention weights."""
    path = tmp_path / "eps0.gguf"
    write_tiny(path, hf_weights(1), eps=0.0)
    m = GGUFModel(path)
    ids = [5, 70, 3, 200, 9, 31]
    stack = attention_stack(m, backend="dense")
    assert len(stack) == LAYERS and stack.manifold.name == "euclidean"
    layer = stack.layers[1]
    assert layer.heads[0][1] is layer.heads[1][1] and layer.heads[1][1] is not layer.heads[2][1]
    traj = simulate(stack, m.embed(ids), LAYERS, method="euler", dt=1.0,
                    save_at=np.arange(LAYERS + 1.0))
    run = forward(m, ids, attention=True, mlp=False)
    np.testing.assert_allclose(traj.states, run.hidden, rtol=1e-10, atol=1e-10)
    for L in range(LAYERS):
        for h in range(H):
            np.testing.assert_allclose(stack.layers[L].attention_matrix(run.hidden[L], h),
                                       run.attention[L, h], atol=1e-12)


# ---------------------------------------------------------------------------- tokenizer
@pytest.mark.parametrize("text", ["the theme", "Café déjà vu, naïve façade", "日本語 🙂\ttab\n",
                                  "<|s|>the<|e|> 12345  two  spaces", " leading space"])
def test_tokenizer_round_trip(tiny, text):
    m = GGUFModel(tiny[0])
    ids = m.token_ids(text)
    assert m.decode(ids) == text


def test_tokenizer_merges_digits_and_control_tokens(tiny):
    m = GGUFModel(tiny[0])
    assert m.token_ids("the the") == [TOKENS.index("t"), TOKENS.index("he"),
                                      TOKENS.index("Ġthe")]
    assert m.token_ids("é") == [TOKENS.index("Ã©")]
    assert m.token_ids("<|s|>") == [TOKENS.index("<|s|>")]
    assert m.token_ids("12") == [TOKENS.index("1"), TOKENS.index("2")]  # digits one by one
    with pytest.raises(ValueError, match="text"):
        m.token_ids("")


# ---------------------------------------------------------------------------- bad files
def test_other_architectures_are_not_supported(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_tiny(path, hf_weights(), arch="gpt2")
    with pytest.raises(ValueError, match="not supported: gpt2"):
        GGUFModel(path)


def test_missing_extra_and_misshapen_tensors(tmp_path):
    w = hf_weights()
    write_tiny(tmp_path / "a.gguf", w, skip=("blk.1.ffn_up.weight",))
    with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight.*missing in .*a\.gguf"):
        GGUFModel(tmp_path / "a.gguf")
    write_tiny(tmp_path / "b.gguf", w, extra={"rope_freqs.weight": np.ones(E // 2, np.float32)})
    with pytest.raises(ValueError, match=r"not supported: \['rope_freqs\.weight'\]"):
        GGUFModel(tmp_path / "b.gguf")
    bad = dict(w, **{"0.up": w["0.up"][:, :16]})
    write_tiny(tmp_path / "c.gguf", bad)
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight.*shape \(64, 16\).*c\.gguf"):
        GGUFModel(tmp_path / "c.gguf")
    with pytest.raises(ValueError, match="existing GGUF file"):
        GGUFModel(tmp_path / "none.gguf")


def test_truncated_files_give_a_clear_error(tiny, tmp_path):
    data = tiny[0].read_bytes()
    path = tmp_path / "cut.gguf"
    for cut in (0, 3, 10, 100, 1000, len(data) // 2, len(data) - 64, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"path: .*cut\.gguf"):
            GGUFModel(path)


def test_corrupted_files_give_a_clear_error_or_load(tiny, tmp_path):
    """Overwrite 4 bytes at many places of the header: every outcome is either a model that
    loads or a ValueError naming the file (never another exception from deep inside)."""
    data = tiny[0].read_bytes()
    path = tmp_path / "bad.gguf"
    header = len(data) - sum(t.n_bytes for t in gguf.GGUFReader(tiny[0]).tensors)
    outcomes = {"error": 0, "loaded": 0}
    for offset in range(0, header, max(1, header // 150)):
        bad = bytearray(data)
        bad[offset:offset + 4] = b"\xff\xff\xff\x7f"
        path.write_bytes(bytes(bad))
        try:
            m = GGUFModel(path)
            m.block(LAYERS - 1)
            outcomes["loaded"] += 1
        except ValueError as err:
            assert "bad.gguf" in str(err), str(err)
            outcomes["error"] += 1
    assert outcomes["error"] > 50
    nan = hf_weights()
    nan["1.down"][3, 7] = np.nan
    write_tiny(path, nan)
    with pytest.raises(ValueError, match=r"non-finite values in .*bad\.gguf"):
        GGUFModel(path).block(1)


# ---------------------------------------------------------------------------- spectra
def test_spectra_of_a_gguf_file(tiny, tmp_path):
    path, w = tiny
    summary = write_spectra(path, tmp_path / "out")
    assert summary["pretrained"]["n_heads"] == LAYERS * H and summary["layers"] == [0, 1]
    assert "float weights" in summary["note"]
    result = CliRunner().invoke(app, ["spectra", str(path), "--out", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert "tiny-llama" in result.output and (tmp_path / "cli" / "spectra.png").is_file()
    (tmp_path / "x.gguf").write_bytes(b"GGUF\x03")
    result = CliRunner().invoke(app, ["spectra", str(tmp_path / "x.gguf")])
    assert result.exit_code == 2 and "x.gguf" in result.output
