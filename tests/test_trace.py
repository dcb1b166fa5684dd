"""Traces in TransformerLens's hook names (attnflow.pretrained.trace): names, shapes, dtypes,
a Zarr round trip that is bit-identical, atomic writes, and the depth battery giving the same
numbers on a simulated Trajectory and on its trace."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

import attnflow as af
from attnflow.analysis.metrics import battery
from attnflow.pretrained.trace import (
    accumulated_resid,
    hook_name,
    load_trace,
    save_trace,
    stacked,
    trace_dataset,
)

L, H, N, D = 3, 2, 5, 4


def arrays(seed: int = 0):
    rng = np.random.default_rng(seed)
    pre = rng.normal(size=(L, N, D)).astype(np.float32)
    mid = rng.normal(size=(L, N, D)).astype(np.float32)
    post = rng.normal(size=(L, N, D))  # float64
    logits = rng.normal(size=(L, H, N, N))
    pattern = np.where(np.tri(N, dtype=bool), np.exp(logits), 0.0)
    pattern /= pattern.sum(-1, keepdims=True)
    return pre, mid, post, pattern


def test_hook_names_dims_and_dtypes():
    pre, mid, post, pattern = arrays()
    ds = trace_dataset(pre, post, [2, 7, 1, 1, 9], resid_mid=mid, pattern=pattern,
                       str_tokens=["<bos>", "▁a", "é", " b", "\n"],
                       attrs={"model": "tiny", "text": "a é b"})
    names = {f"blocks.{layer}.{hook}" for layer in range(L)
             for hook in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post",
                          "attn.hook_pattern")}
    assert set(ds.data_vars) == names | {"tokens"}
    assert ds["blocks.2.hook_resid_pre"].dims == ("pos", "d_model")
    assert ds["blocks.0.attn.hook_pattern"].dims == ("head_index", "query_pos", "key_pos")
    assert ds["blocks.0.attn.hook_pattern"].shape == (H, N, N)
    assert ds["blocks.1.hook_resid_mid"].dtype == np.float32
    assert ds["blocks.1.hook_resid_post"].dtype == np.float64
    np.testing.assert_array_equal(ds["blocks.1.attn.hook_pattern"].values, pattern[1])
    np.testing.assert_array_equal(ds["tokens"].values, [2, 7, 1, 1, 9])
    assert json.loads(ds.attrs["str_tokens"])[1] == "▁a"
    assert json.loads(ds.attrs["attnflow_trace"])["model"] == "tiny"
    assert hook_name(4, "attn.hook_pattern") == "blocks.4.attn.hook_pattern"
    for hook, want in (("hook_resid_pre", pre), ("hook_resid_mid", mid),
                       ("hook_resid_post", post), ("attn.hook_pattern", pattern)):
        got = stacked(ds, hook)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    minimal = trace_dataset(pre, post, np.arange(N))
    assert "blocks.0.hook_resid_mid" not in minimal and "head_index" not in minimal.coords
    with pytest.raises(ValueError, match="hook"):
        stacked(minimal, "attn.hook_pattern")


def test_saved_trace_reloads_bit_identical(tmp_path):
    pre, mid, post, pattern = arrays(1)
    ds = trace_dataset(pre, post, np.arange(N), resid_mid=mid, pattern=pattern,
                       str_tokens=list("abcde"), attrs={"model": "m"})
    path = save_trace(ds, tmp_path / "t.zarr")
    back = load_trace(path)
    assert back.identical(ds)
    for name in ds.data_vars:
        assert back[name].dtype == ds[name].dtype
        assert back[name].values.tobytes() == ds[name].values.tobytes()
    # overwritten in place by a second save, atomically
    ds2 = trace_dataset(2 * pre, post, np.arange(N))
    save_trace(ds2, path)
    assert load_trace(path).identical(ds2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.zarr"]


def test_an_interrupted_save_leaves_the_old_trace(tmp_path, monkeypatch):
    pre, _, post, _ = arrays()
    ds = trace_dataset(pre, post, np.arange(N))
    path = save_trace(ds, tmp_path / "t.zarr")

    def broken(self, store, **kwargs):
        (store / "partial").mkdir(parents=True)
        raise OSError("disk full")

    monkeypatch.setattr(xr.Dataset, "to_zarr", broken)
    with pytest.raises(OSError, match="disk full"):
        save_trace(trace_dataset(3 * pre, post, np.arange(N)), path)
    monkeypatch.undo()
    assert load_trace(path).identical(ds)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.zarr"]


def test_bad_input(tmp_path):
    pre, mid, post, pattern = arrays()
    with pytest.raises(ValueError, match=r"resid_post: .*\(3, 5, 4\)"):
        trace_dataset(pre, post[:, :4], np.arange(N))
    with pytest.raises(ValueError, match="pattern"):
        trace_dataset(pre, post, np.arange(N), pattern=pattern[..., :4])
    with pytest.raises(ValueError, match="token_ids"):
        trace_dataset(pre, post, np.arange(N - 1))
    with pytest.raises(ValueError, match="str_tokens"):
        trace_dataset(pre, post, np.arange(N), str_tokens=["a"])
    with pytest.raises(ValueError, match="resid_pre"):
        trace_dataset(pre[:, :0], post[:, :0], [])
    with pytest.raises(ValueError, match="resid_mid"):
        trace_dataset(pre, post, np.arange(N), resid_mid=np.full((L, N, D), np.nan))
    with pytest.raises(ValueError, match="attrs"):
        trace_dataset(pre, post, np.arange(N), attrs={"x": object()})
    ds = trace_dataset(pre, post, np.arange(N))
    with pytest.raises(ValueError, match="zarr"):
        save_trace(ds, tmp_path / "t.nc")
    with pytest.raises(ValueError, match="hook"):
        hook_name(0, "hook_q")
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "none.zarr")
    xr.Dataset({"x": ("a", np.arange(3))}).to_zarr(tmp_path / "other.zarr", mode="w",
                                                 consolidated=False)
    with pytest.raises(ValueError, match=r"other\.zarr, another dataset"):
        load_trace(tmp_path / "other.zarr")
    (tmp_path / "junk.zarr").write_text("not a store")
    with pytest.raises(ValueError, match=r"junk\.zarr, which cannot be read"):
        load_trace(tmp_path / "junk.zarr")


def test_battery_on_a_trajectory_and_on_its_saved_trace(tmp_path):
    """A two-layer simulated stack as a trace: resid_pre of layer l is the state at time l,
    resid_post the state at l + 1, the pattern the attention at the state entering the layer.
    The battery of the reloaded trace equals that of the Trajectory, bit for bit."""
    rng = np.random.default_rng(5)
    d, n = 3, 8
    layers = [af.Attention(Q=np.eye(d), K=np.eye(d), V=np.eye(d) + 0.1 * rng.normal(size=(d, d)),
                           beta=1.5) for _ in range(2)]
    stack = af.Stack(layers)
    x0 = rng.normal(size=(n, d))
    traj = af.simulate(stack, x0 / np.linalg.norm(x0, axis=1, keepdims=True), 2.0,
                       save_at=np.arange(3.0))
    pattern = np.stack([[layers[t].attention_matrix(traj.states[t])] for t in range(2)])
    ds = trace_dataset(traj.states[:-1], traj.states[1:], np.arange(n), pattern=pattern)
    back = load_trace(save_trace(ds, tmp_path / "traj.zarr"))
    states = np.concatenate([stacked(back, "hook_resid_pre"),
                             stacked(back, "hook_resid_post")[-1:]])
    a = battery(traj.states, pattern, tol=0.05, delta=0.3)
    b = battery(states, stacked(back, "attn.hook_pattern"), tol=0.05, delta=0.3)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_trace_of_a_decoder_against_the_reference_forward(tmp_path):
    """`trace` on a tiny LLaMA GGUF file: TransformerLens names and shapes, the stream between
    the sublayers and the patterns from the independent reference forward, the CLI's store
    bit-identical to the Python one, and the bad inputs."""
    pytest.importorskip("gguf")
    import reference_forward as ref
    from test_gguf import hf_weights, write_tiny
    from typer.testing import CliRunner

    from attnflow.cli import app
    from attnflow.pretrained.trace import load_trace, stacked, trace

    path = tmp_path / "tiny.gguf"
    write_tiny(path, hf_weights())
    ids = [3, 5, 70, 200, 9, 9]
    ds = trace(path, token_ids=ids)
    assert "blocks.1.hook_resid_post" in ds and "blocks.2.hook_resid_post" not in ds  # 2 layers
    assert ds["blocks.1.attn.hook_pattern"].dims == ("head_index", "query_pos", "key_pos")
    record: dict = {}
    hidden, _ = ref.forward(ref.load(path), ids, logits="none", record=record)
    np.testing.assert_allclose(stacked(ds, "hook_resid_pre"), hidden[:-1], rtol=1e-10)
    np.testing.assert_allclose(stacked(ds, "hook_resid_post"), hidden[1:], rtol=1e-10)
    np.testing.assert_allclose(stacked(ds, "hook_resid_mid"), record["resid_mid"], rtol=1e-10)
    np.testing.assert_allclose(stacked(ds, "attn.hook_pattern"), record["pattern"], atol=1e-12)
    out = tmp_path / "cli.zarr"
    run = CliRunner().invoke(app, ["trace", str(path), "--token-ids", ",".join(map(str, ids)),
                                   "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert load_trace(out).identical(ds)
    for args, pattern in ((["--text", "a", "--token-ids", "1"], "exactly one of them"),
                          (["--token-ids", "1,x"], "--token-ids: expected comma-separated"),
                          (["--token-ids", "99999"], "token"),):
        bad = CliRunner().invoke(app, ["trace", str(path), *args, "--out", str(out)])
        assert bad.exit_code == 2 and pattern in bad.output, bad.output
    bad = CliRunner().invoke(app, ["trace", str(tmp_path / "none.gguf"), "--token-ids", "1"])
    assert bad.exit_code == 2 and "model: expected an existing .gguf file" in bad.output


def test_the_ablation_drops_every_mlp(tmp_path):
    """trace(mlp=False) and --no-mlp: the same decoder with every MLP sublayer dropped is the
    decoder whose MLPs output zero (their down projections zeroed), traced in full."""
    pytest.importorskip("gguf")
    from test_gguf import hf_weights, write_tiny
    from typer.testing import CliRunner

    from attnflow.cli import app
    from attnflow.pretrained.trace import load_trace, stacked, trace

    weights = hf_weights()
    write_tiny(tmp_path / "tiny.gguf", weights)
    write_tiny(tmp_path / "zero.gguf", {k: (0 * w if k.endswith(".down") else w)
                                        for k, w in weights.items()})
    ids = [3, 5, 70, 200, 9]
    ablated = trace(tmp_path / "tiny.gguf", token_ids=ids, mlp=False)
    zeroed = trace(tmp_path / "zero.gguf", token_ids=ids)
    np.testing.assert_allclose(stacked(ablated, "hook_resid_post"),
                               stacked(zeroed, "hook_resid_post"), rtol=1e-12, atol=1e-12)
    assert "blocks.0.hook_resid_mid" not in ablated  # it would equal hook_resid_post
    full = trace(tmp_path / "tiny.gguf", token_ids=ids)
    assert not np.allclose(stacked(full, "hook_resid_post"), stacked(ablated, "hook_resid_post"))
    out = tmp_path / "cli.zarr"
    run = CliRunner().invoke(app, ["trace", str(tmp_path / "tiny.gguf"), "--token-ids",
                                   ",".join(map(str, ids)), "--no-mlp", "--out", str(out)])
    assert run.exit_code == 0 and "(MLPs dropped)" in run.output, run.output
    assert load_trace(out).identical(ablated)
    with pytest.raises(ValueError, match="mlp: expected True or False"):
        trace(tmp_path / "tiny.gguf", token_ids=ids, mlp="no")


def test_a_layer_axis_in_one_call(tmp_path):
    pre, mid, post, pattern = arrays()
    ds = trace_dataset(pre, post, np.arange(N), resid_mid=mid, pattern=pattern)
    resid = ds.attnflow.accumulated_resid()
    assert resid.dims == ("layer", "pos", "d_model") and resid.sizes["layer"] == L + 1
    np.testing.assert_array_equal(resid.sel(layer=np.arange(L)).values, pre)
    np.testing.assert_array_equal(resid.sel(layer=L).values, post[-1])
    np.testing.assert_array_equal(resid.layer, np.arange(L + 1))
    heads = ds.attnflow.stack_activation("attn.hook_pattern")
    assert heads.dims == ("layer", "head_index", "query_pos", "key_pos")
    np.testing.assert_array_equal(heads.values, pattern)
    np.testing.assert_array_equal(stacked(ds, "hook_resid_mid"), mid)
    back = load_trace(save_trace(ds, tmp_path / "t.zarr"))  # the accessor on a loaded trace
    np.testing.assert_array_equal(back.attnflow.accumulated_resid().values, resid.values)
    assert accumulated_resid(back).identical(resid)
