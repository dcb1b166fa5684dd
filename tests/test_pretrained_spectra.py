"""Per-head spectra (attnflow.pretrained.spectra) and `attnflow spectra`.

Truth: the spectra are recomputed from the d x d matrices V_h and (B_h + B_h^T)/2 directly;
heads are built with known eigenvalues; the Gaussian baseline is checked against its
distribution (entry variance, and the outer radius sqrt(d d_head) s^2 of the spectrum of a
product of Gaussian matrices, Haagerup-Larsen); MiniLM's numbers against a computation from
the raw safetensors tensors.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from test_pretrained import BERT_CONFIG, MINILM, bert_tensors, needs_minilm, write_checkpoint
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.pretrained import (
    AttentionLayer,
    Checkpoint,
    gaussian_layers,
    layer_spectra,
    spectra_report,
    spectra_summary,
    write_spectra,
)


def random_layer(rng, d=24, H=3, dh=4) -> AttentionLayer:
    return AttentionLayer(index=0, W_Q=rng.normal(size=(H, dh, d)),
                          W_K=rng.normal(size=(H, dh, d)), W_V=rng.normal(size=(H, dh, d)),
                          W_O=rng.normal(size=(H, d, dh)), kv_head=np.arange(H))


def test_spectra_match_the_d_by_d_matrices():
    rng = np.random.default_rng(0)
    layer = random_layer(rng)
    # a degenerate head: W_K = W_Q makes B symmetric positive semidefinite of rank dh
    layer.W_K[2] = layer.W_Q[2]
    for s in layer_spectra(layer):
        B = layer.qk_form(s.head)
        assert np.isclose(s.beta_eff, np.linalg.norm(B, 2), rtol=1e-10)
        sym = np.linalg.eigvalsh((B + B.T) / 2)
        top = np.sort(sym[np.argsort(-np.abs(sym))][:8])  # the 2 dh largest in modulus
        np.testing.assert_allclose(s.qk_symmetric_eigenvalues, top, atol=1e-9 * abs(sym).max())
        full = np.linalg.eigvals(layer.value_map(s.head))
        full = full[np.argsort(-np.abs(full))][:4]
        rows, cols = linear_sum_assignment(np.abs(full[:, None] - s.value_eigenvalues[None]))
        np.testing.assert_allclose(full[rows], s.value_eigenvalues[cols], atol=1e-10)
        assert np.all(np.diff(s.value_eigenvalues.real) <= 0)  # by decreasing real part
        assert s.lambda_max.real == s.value_eigenvalues.real.max()
        assert s.lambda_max.imag >= 0
    assert np.all(layer_spectra(layer)[2].qk_symmetric_eigenvalues >= -1e-9)  # PSD head


def head_with_value_core(cores: list[np.ndarray], d: int = 10) -> AttentionLayer:
    """Heads with W_V^h W_O^h = cores[h]: W_V = [I, 0] selects, W_O = [M; 0] embeds."""
    H, dh = len(cores), cores[0].shape[0]
    W_V = np.zeros((H, dh, d))
    W_V[:, :, :dh] = np.eye(dh)
    W_O = np.zeros((H, d, dh))
    W_O[:, :dh, :] = np.array(cores)
    W_Q = np.random.default_rng(1).normal(size=(H, dh, d))
    return AttentionLayer(index=3, W_Q=W_Q, W_K=W_Q.copy(), W_V=W_V, W_O=W_O, kv_head=np.arange(H))


def test_lambda_max_kind_and_atlas_row_of_known_spectra():
    rot = np.array([[1.0, -2.0], [2.0, 1.0]])  # eigenvalues 1 +- 2i
    cores = [np.diag([2.0, 1.0, -1.0, 0.5]), np.diag([-1.0, -2.0, -3.0, -0.5]),
             np.block([[rot, np.zeros((2, 2))], [np.zeros((2, 2)), np.diag([0.5, -1.0])]]),
             np.diag([-1.0, -1.0, -2.0, -3.0])]
    got = layer_spectra(head_with_value_core(cores))
    assert [s.kind for s in got] == ["positive", "negative", "complex", "negative"]
    assert [s.atlas_row for s in got] == ["two-points", "two-clouds", "not-covered", "cloud-L"]
    np.testing.assert_allclose([s.lambda_max for s in got], [2.0, -0.5, 1 + 2j, -1.0],
                               rtol=1e-14)
    assert (got[0].layer, got[3].head) == (3, 3)
    summary = spectra_summary(got)
    assert (summary["n_negative"], summary["n_complex"], summary["n_positive"]) == (2, 1, 1)
    assert summary["negative_heads"] == [[3, 1], [3, 3]]
    assert summary["n_lambda_max_re_negative"] == 2
    assert summary["atlas_rows"] == {"two-points": 1, "two-clouds": 1, "not-covered": 1,
                                     "cloud-L": 1}
    row = got[2].row()
    np.testing.assert_allclose([row["lambda_max_re"], row["lambda_max_im"]], [1.0, 2.0])
    assert row["n_eigenvalues_re_negative"] == 1


@pytest.fixture(scope="module")
def minilm_shaped(tmp_path_factory) -> Checkpoint:
    """A checkpoint with MiniLM's attention shapes (only layer 0's query weight is stored:
    the baseline needs the shapes and the initialiser scale, not the weights)."""
    d = 384
    config = {"model_type": "bert", "hidden_size": d, "num_attention_heads": 12,
              "num_hidden_layers": 6, "initializer_range": 0.02}
    return Checkpoint(write_checkpoint(tmp_path_factory.mktemp("shapes"), config, {
        "encoder.layer.0.attention.self.query.weight": np.zeros((d, d))}))


def test_gaussian_baseline_distribution(minilm_shaped):
    s, d, dh = 0.02, 384, 32
    layers = gaussian_layers(minilm_shaped, range(6), seed=0)
    entries = np.concatenate([np.ravel(getattr(w, m)) for w in layers
                              for m in ("W_Q", "W_K", "W_V", "W_O")])
    # sample variance of N normal entries: standard error s^2 sqrt(2 / N)
    assert abs(entries.var() - s**2) < 5 * s**2 * np.sqrt(2 / entries.size)
    assert abs(entries.mean()) < 5 * s / np.sqrt(entries.size)
    spectra = [h for w in layers for h in layer_spectra(w)]
    unit = s**2 * np.sqrt(d * dh)
    radius = np.array([np.abs(h.value_eigenvalues).max() for h in spectra]) / unit
    # outer radius of the limiting spectrum is 1 in these units; the largest of 32 eigenvalues
    # overshoots it a little at this size (Monte Carlo: 1.07 +- 0.09 per head)
    assert 0.95 < radius.mean() < 1.2
    # "Gaussian initialisation puts lambda_max far from the left half-plane"
    assert all(h.lambda_max.real > 0.4 * unit for h in spectra)
    again = gaussian_layers(minilm_shaped, [2], seed=0)[0]
    assert again.index == 2 and again.W_Q.shape == (12, 32, 384)


def test_gaussian_baseline_keeps_grouped_query_sharing(tmp_path):
    config = {"model_type": "llama", "hidden_size": 8, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 1}
    ckpt = Checkpoint(write_checkpoint(tmp_path, config, {
        "model.layers.0.self_attn.q_proj.weight": np.zeros((8, 8))}))
    w = gaussian_layers(ckpt, [0], seed=3)[0]
    np.testing.assert_array_equal(w.W_K[0], w.W_K[1])
    np.testing.assert_array_equal(w.W_V[2], w.W_V[3])
    assert not np.array_equal(w.W_K[1], w.W_K[2])


def test_write_spectra_and_cli(tmp_path):
    t = bert_tensors(np.random.default_rng(2), 2)
    model = write_checkpoint(tmp_path / "tiny", {**BERT_CONFIG, "_name_or_path": "tiny-bert"}, t)
    result = CliRunner().invoke(app, ["spectra", str(model), "--out", str(tmp_path / "out"),
                                      "--layers", "1"])
    assert result.exit_code == 0, result.output
    assert "tiny-bert" in result.output and "negative heads" in result.output
    # the printed counts of the pretrained column, from numpy's spectra of W_V^h W_O^h (the
    # nonzero spectrum of V_h, as in the paper)
    layer = Checkpoint(model).layer(1)
    tops = [lam[np.argmax(lam.real)] for lam in
            (np.linalg.eigvals(layer.W_V[h] @ layer.W_O[h]) for h in range(4))]
    real = [t.real for t in tops if abs(t.imag) < 1e-9]
    expect = {"heads": 4, "lambda_max complex": 4 - len(real),
              "lambda_max real negative": sum(r < 0 for r in real),
              "lambda_max real positive": sum(r > 0 for r in real)}
    for label, count in expect.items():
        (line,) = [ln for ln in result.output.splitlines() if ln.startswith(label + " ")]
        assert int(line[len(label):].split()[0]) == count, line
    rows = list(csv.DictReader(open(tmp_path / "out" / "heads.csv")))
    assert [(r["source"], r["layer"], r["head"]) for r in rows] == \
        [(src, "1", str(h)) for src in ("pretrained", "gaussian") for h in range(4)]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["model"] == "tiny-bert" and summary["layers"] == [1]
    as_json = json.loads((tmp_path / "out" / "heads.json").read_text())
    assert [{k: str(v) for k, v in r.items()} for r in as_json] == rows
    assert (tmp_path / "out" / "spectra.png").stat().st_size > 10_000
    report = spectra_report(summary)
    assert "albert-xlarge-v2" in report and "**tiny-bert**" in report
    bad = CliRunner().invoke(app, ["spectra", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2 and "model_dir: expected an existing checkpoint" in bad.output


@needs_minilm
def test_minilm_spectra_against_raw_tensors(tmp_path):
    from safetensors import safe_open

    summary = write_spectra(MINILM, tmp_path, layers=[4])
    rows = {int(r["head"]): r for r in json.loads((tmp_path / "heads.json").read_text())
            if r["source"] == "pretrained"}
    raw = safe_open(str(MINILM / "model.safetensors"), "np")
    Wv = raw.get_tensor("encoder.layer.4.attention.self.value.weight").astype(float)
    Wo = raw.get_tensor("encoder.layer.4.attention.output.dense.weight").astype(float)
    Wq = raw.get_tensor("encoder.layer.4.attention.self.query.weight").astype(float)
    Wk = raw.get_tensor("encoder.layer.4.attention.self.key.weight").astype(float)
    for h in (0, 5, 8):  # two of them have a negative lambda_max
        sl = slice(32 * h, 32 * (h + 1))
        ev = np.linalg.eigvals(Wo[:, sl] @ Wv[sl])  # the 384 x 384 value map
        ev = ev[np.argsort(-np.abs(ev))][:32]
        top = ev[np.argmax(ev.real)]
        assert np.isclose(rows[h]["lambda_max_re"], top.real, atol=1e-9)
        assert np.isclose(rows[h]["lambda_max_im"], abs(top.imag), atol=1e-9)
        B = Wq[sl].T @ Wk[sl] / np.sqrt(32)
        assert np.isclose(rows[h]["beta_eff"], np.linalg.norm(B, 2), rtol=1e-9)
    kinds = [rows[h]["lambda_max_kind"] for h in range(12)]
    assert summary["pretrained"]["n_negative"] == kinds.count("negative")
    assert summary["gaussian"]["n_lambda_max_re_negative"] == 0
