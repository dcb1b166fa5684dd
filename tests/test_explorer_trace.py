"""The explorer of a trace of a real model (attnflow.explorer.tracepack, issue 36): layers as
frames projected within the quantisation bound, the sink rate and mean cosine against
attnflow.analysis, the patterns' round trip and size budget, the dispatch of explore_html and
`attnflow explore` on a saved trace, and the errors naming what is missing. Synthetic traces
from random arrays: no model weights."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

import attnflow as af
from attnflow.analysis.depth import mean_pairwise_cosine, sink_rate
from attnflow.cli import app
from attnflow.explorer import PATTERN_ERROR, pack_trace, unpack, unpack_patterns
from attnflow.explorer.pack import ANGLE_ERROR, COORD_ERROR
from attnflow.explorer.tracepack import PATTERN_BUDGET
from attnflow.plot.projection import Frame
from attnflow.pretrained.trace import accumulated_resid, save_trace, trace_dataset

L, H, N, D = 3, 2, 12, 16


def _trace(patterns=True, n=N, seed=0):
    rng = np.random.default_rng(seed)
    pre = rng.normal(size=(L, n, D))
    post = pre + rng.normal(size=(L, n, D))
    pattern = None
    if patterns:
        pattern = rng.random((L, H, n, n)) * np.tri(n)  # causal rows
        pattern[:, 0, :, 0] += 2.0  # head 0 a sink head
        pattern /= pattern.sum(axis=-1, keepdims=True)
    return trace_dataset(pre, post, np.arange(n), pattern=pattern,
                         str_tokens=[f"tok{i}" for i in range(n)], attrs={"model": "toy"})


def _directions(ds):
    R = accumulated_resid(ds).values
    return R / np.linalg.norm(R, axis=-1, keepdims=True)


def _pca(X, k):
    flat = X.reshape(-1, X.shape[-1])
    w, v = np.linalg.eigh(flat.T @ flat / len(flat))
    return v[:, np.argsort(w)[::-1][:k]].T


def test_frames_are_the_layers_projected_onto_the_principal_directions():
    ds = _trace()
    packed = pack_trace(ds)
    assert packed["kind"] == "trace" and packed["time_label"] == "layer"
    assert packed["labels"] == [f"tok{i}" for i in range(N)] and packed["model"] == "toy"
    times, F = unpack(packed)
    np.testing.assert_array_equal(times, np.arange(L + 1))
    X = _directions(ds)
    B = _pca(X, 3)
    P = X @ B.T
    signs = np.sign(np.sum(F * P, axis=(0, 1)))  # eigenvectors are defined up to sign
    assert np.abs(F - P * signs).max() <= COORD_ERROR * (1 + 1e-9)
    # onto the sphere: the same directions, scaled to unit length
    _, S = unpack(pack_trace(ds, onto="sphere"))
    U = P / np.linalg.norm(P, axis=-1, keepdims=True)
    assert np.abs(S - U * signs).max() <= COORD_ERROR * (1 + 1e-9)
    # a circle: two principal directions, as angles
    _, C = unpack(pack_trace(ds, view="circle"))
    Q = X @ _pca(X, 2).T
    theta = np.arctan2(Q[..., 1], Q[..., 0])
    back = np.arctan2(C[..., 1], C[..., 0])
    errs = [np.abs((np.arctan2(s2 * np.sin(back), s1 * np.cos(back)) - theta + np.pi)
                   % (2 * np.pi) - np.pi).max() for s1 in (1, -1) for s2 in (1, -1)]
    assert min(errs) <= ANGLE_ERROR * (1 + 1e-9)


def test_a_given_basis_is_used():
    ds = _trace()
    B = np.eye(D)[[3, 5, 7]]
    _, F = unpack(pack_trace(ds, basis=Frame(B, ("a", "b", "c"), ("a", "b", "c"), "given")))
    assert np.abs(F - _directions(ds) @ B.T).max() <= COORD_ERROR * (1 + 1e-9)


def test_series_are_the_analysis_functions_per_layer():
    ds = _trace()
    packed = pack_trace(ds)
    np.testing.assert_allclose(packed["cosine"],
                               mean_pairwise_cosine(accumulated_resid(ds).values), rtol=1e-12)
    A = ds.attnflow.stack_activation("attn.hook_pattern").values
    expected = sink_rate(A)
    assert packed["sink"][:L] == pytest.approx(list(expected)) and packed["sink"][L] is None
    assert 0.4 < expected.mean() <= 0.5 + 1e-12  # head 0 of 2 is a sink head: the data mean it
    assert packed["clusters"] is None and packed["order"] is None


def test_patterns_round_trip_within_the_bound_and_fit_the_budget():
    ds = _trace()
    packed = pack_trace(ds)
    A = ds.attnflow.stack_activation("attn.hook_pattern").values
    back = unpack_patterns(packed)
    assert back.shape == (L, H, N, N)
    assert np.abs(back - A).max() <= PATTERN_ERROR * (1 + 1e-9)
    assert packed["patterns"]["L"] == L and packed["patterns"]["H"] == H
    assert len(packed["patterns"]["data"]) == 4 * -(-L * H * N * N // 3)  # one byte a weight
    assert PATTERN_BUDGET == 16_000_000


def test_patterns_over_the_budget_are_left_out_or_refused(monkeypatch):
    from attnflow.explorer import tracepack

    monkeypatch.setattr(tracepack, "PATTERN_BUDGET", L * H * N * N - 1)
    ds = _trace()
    packed = pack_trace(ds)
    assert packed["patterns"] is None and "budget" in packed["no_patterns"]
    assert packed["sink"][0] is not None  # the sink rate still comes from the full patterns
    with pytest.raises(ValueError, match=r"^attention: expected patterns of at most"):
        pack_trace(ds, attention=True)


def test_a_trace_without_patterns_names_what_is_missing():
    ds = _trace(patterns=False)
    packed = pack_trace(ds)
    assert packed["patterns"] is None and packed["sink"] == [None] * (L + 1)
    assert "attn.hook_pattern" in packed["no_patterns"]
    with pytest.raises(ValueError, match=r"^attention: .*attn\.hook_pattern.*a trace without"):
        pack_trace(ds, attention=True)
    with pytest.raises(ValueError, match=r"^packed: .*without them .*hook_pattern"):
        unpack_patterns(packed)
    assert pack_trace(_trace(), attention=False)["patterns"] is None


def test_bad_options_are_named():
    ds = _trace()
    with pytest.raises(ValueError, match=r"^view: "):
        pack_trace(ds, view="cube")
    with pytest.raises(ValueError, match=r"^onto: "):
        pack_trace(ds, onto="plane")
    with pytest.raises(TypeError, match=r"^ds: expected a trace"):
        pack_trace(np.zeros((3, 4)))


def _state(page):
    text = re.search(r'<script type="application/json" id="af-data">(.*?)</script>',
                     page.read_text(), re.S).group(1)
    return json.loads(text)["data"]


def test_explore_html_dispatches_on_a_trace(tmp_path):
    ds = _trace()
    page = af.explore_html(ds, tmp_path / "trace.html")
    assert _state(page) == json.loads(json.dumps(pack_trace(ds)))
    assert "toy" in page.read_text().split("</h1>")[0]
    with pytest.raises(ValueError, match=r"^attention: "):
        af.explore_html(_trace(patterns=False), tmp_path / "none.html", attention=True)


def _explore(*args):
    return CliRunner().invoke(app, ["explore", *map(str, args)])


def test_cli_writes_the_page_of_a_saved_trace(tmp_path):
    ds = _trace()
    path = save_trace(ds, tmp_path / "trace.zarr")
    result = _explore(path, "--out", tmp_path / "trace.html", "--attention")
    assert result.exit_code == 0, result.output
    assert _state(tmp_path / "trace.html") == json.loads(json.dumps(pack_trace(ds)))
    result = _explore(path, "--out", tmp_path / "unit.html", "--onto", "sphere")
    assert result.exit_code == 0, result.output
    assert _state(tmp_path / "unit.html")["frames"] == pack_trace(ds, onto="sphere")["frames"]


def test_cli_errors_name_the_option(tmp_path):
    bare = save_trace(_trace(patterns=False), tmp_path / "bare.zarr")
    result = _explore(bare, "--out", tmp_path / "p.html", "--attention")
    assert result.exit_code == 2
    assert "--attention: expected a trace holding attention patterns" in result.output
    assert "attn.hook_pattern" in result.output
    result = _explore(bare, "--out", tmp_path / "p.html", "--run", "1")
    assert result.exit_code == 2 and "--run: expected no value for a trace" in result.output
    assert not (tmp_path / "p.html").exists()


def test_the_widget_takes_a_trace():
    pytest.importorskip("anywidget")
    ds = _trace()
    w = af.explore(ds)
    assert w.data == pack_trace(ds) and w.view == "sphere"
    w.frame = L
    assert w.time == float(L)
    with pytest.raises(ValueError, match=r"^cluster_count: expected a simulated run"):
        _ = w.cluster_count
    w.view = "circle"  # packs the trace again for the circle
    assert w.data["k"] == 1 and w.data["frames"] == pack_trace(ds, view="circle")["frames"]
    with pytest.raises(ValueError, match=r"^attention: "):
        af.explore(_trace(patterns=False), attention=True)


def test_a_simulated_run_keeps_its_page_and_names_the_new_options(tmp_path):
    traj = af.simulate(af.Attention(beta=4.0, mask="causal"), af.sphere.uniform(8, 5, seed=0),
                       1.0, save_at=[0.0, 1.0])
    with pytest.raises(ValueError, match=r"^attention: expected a run whose attention matrix"):
        af.explore_html(traj, tmp_path / "run.html", attention=True)  # d = 5 is projected
    with pytest.raises(ValueError, match=r"^onto: "):
        af.explore_html(traj, tmp_path / "run.html", onto="sphere")
    path = traj.save(tmp_path / "run.nc")
    result = _explore(path, "--out", tmp_path / "run.html", "--onto", "sphere")
    assert result.exit_code == 2 and "--onto: expected no value for a simulated run" in \
        result.output
    result = _explore(path, "--out", tmp_path / "run.html")
    assert result.exit_code == 0, result.output
    assert _state(tmp_path / "run.html") == json.loads(json.dumps(af.explorer.pack(traj)))


def test_a_trace_has_no_density_page(tmp_path):
    with pytest.raises(ValueError, match=r"^density: expected None for a trace"):
        af.explore_html(_trace(), tmp_path / "t.html", density=True)
