"""The engine on torch tensors (CPU here): the family, the kernels and the integrators give
the numpy path's results, states stay tensors, and what cannot take a tensor says so."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnflow as af
from attnflow.sphere import uniform

torch = pytest.importorskip("torch")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

N, D = 6, 4
TOL = 1e-12  # float64: the same arithmetic up to summation order and libm's last bits


def build(draw, n: int = N, d: int = D):
    """A model of the family drawn by hypothesis: scheme, mask, heads, encodings, weighting,
    memory, MLP, strength."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    norm = draw(st.sampled_from(["post", "pre", "peri", "ngpt", "flat"]))
    mask = draw(st.sampled_from(["causal", "full", ("window", 2), "array"]))
    if mask == "array":
        mask = rng.random((n, n)) < 0.6
        np.fill_diagonal(mask, True)
    heads = draw(st.integers(1, 2))
    e = draw(st.sampled_from([2, 4]))
    factored = draw(st.booleans())
    M = lambda r, c: rng.standard_normal((r, c)) / np.sqrt(c)  # noqa: E731
    triples = [(M(e, d), M(e, d), M(2, d), M(d, 2)) if factored else (M(e, d), M(e, d), M(d, d))
               for _ in range(heads)]
    weighting = draw(st.sampled_from(["softmax", "unnormalised", "positional"]))
    alibi = draw(st.sampled_from([None, "default", 0.4]))
    rope = draw(st.sampled_from([None, 100.0]))
    memory = None
    if norm != "flat" and isinstance(mask, str) and draw(st.booleans()):
        memory = (uniform(2, d, rng), np.array([1.0, 3.0]))
    mlp = af.MLP.random(d, 5, draw(st.sampled_from(["swiglu", "geglu", "gelu", "relu"])),
                        seed=1) if draw(st.booleans()) else None
    strength = 1.0 if norm in ("peri", "ngpt") else draw(st.sampled_from([1.0, 2.5]))
    beta = draw(st.sampled_from([-1.5, 0.5, 3.0]))
    return af.Attention(heads=triples, beta=beta, mask=mask, memory=memory, norm=norm,
                        attention=weighting, alibi=alibi, rope=rope, mlp=mlp,
                        strength=strength)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_field_on_tensors_equals_numpy(data):
    model = build(data.draw)
    X = uniform((2, N), D, seed=data.draw(st.integers(0, 99)))
    if model.manifold != af.manifolds.SPHERE:
        X = X * np.random.default_rng(0).uniform(0.5, 2.0, X.shape[:-1])[..., None]
    expected = model.field(X)
    got = model.field(torch.from_numpy(X))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=TOL * max(
        1.0, float(np.abs(expected).max())))


def stacks():
    rng = np.random.default_rng(3)
    M = lambda r, c: rng.standard_normal((r, c)) / np.sqrt(c)  # noqa: E731
    mask = rng.random((N, N)) < 0.6
    np.fill_diagonal(mask, True)
    return {
        "post: memory, alibi heads, mlp": af.Stack([
            af.Attention(M(D, D), M(D, D), M(D, D), beta=2.0, mask="full",
                         memory=(uniform(2, D, rng), np.array([1.0, 3.0]))),
            af.Attention(heads=[(M(2, D), M(2, D), None)] * 2, alibi="default", beta=3.0,
                         mlp=af.MLP.random(D, 5, "geglu", seed=2))]),
        "pre/peri: rope, window, array mask, unnormalised": af.Stack([
            af.Attention(M(D, D), M(D, D), M(D, D), norm="pre", rope=100.0,
                         mask=("window", 3), attention="unnormalised"),
            af.Attention(norm="peri", mask=mask, mlp=af.MLP.random(D, 5, "gelu", seed=3))]),
        "ngpt and post: positional, factored heads": af.Stack([
            af.Attention(norm="ngpt", attention="positional", alibi=0.5),
            af.Attention(heads=[(M(2, D), M(2, D), M(3, D), M(D, 3))], strength=2.0)]),
    }


@pytest.mark.parametrize("name", list(stacks()))
@pytest.mark.parametrize("method", ["euler", "rk4", "dopri5"])
def test_stack_simulated_on_tensors_equals_numpy(name, method):
    model = stacks()[name]
    x0 = uniform((3, N), D, seed=1)
    dt = None if method == "dopri5" else 0.1
    a = af.simulate(model, x0, 2.0, method=method, dt=dt)
    b = af.simulate(model, torch.from_numpy(x0), 2.0, method=method, dt=dt)
    assert isinstance(b.states, torch.Tensor)
    np.testing.assert_allclose(b.states.numpy(), a.states, rtol=0, atol=TOL)
    assert b.integrator["device"] == "cpu" and b.integrator["dtype"] == "float64"
    assert b.integrator["n_steps"] == a.integrator["n_steps"]


def test_geodesic_and_noise_on_tensors_equal_numpy():
    model = af.Attention(beta=4.0, alibi="default", heads=[(None, None, None)] * 2,
                         mask=("window", 3))
    x0 = uniform((4, N), 3, seed=2)
    for kwargs in ({"method": "geodesic"}, {"method": "euler", "noise": 0.4, "seed": 5},
                   {"method": "geodesic", "noise": 0.4, "seed": 5}):
        a = af.simulate(model, x0, 1.0, dt=0.05, **kwargs)
        b = af.simulate(model, x0, 1.0, dt=0.05, device="cpu", **kwargs)
        assert isinstance(b.states, torch.Tensor)
        np.testing.assert_allclose(b.states.numpy(), a.states, rtol=0, atol=TOL)


def test_float32_tensors_stay_float32():
    model = af.Attention(beta=9.0, mask="full", mlp=af.MLP.random(3, 6))
    x0 = uniform((2, N), 3, seed=3).astype(np.float32)
    a = af.simulate(model, x0, 2.0, dt=0.1)
    b = af.simulate(model, torch.from_numpy(x0), 2.0, dt=0.1)
    assert b.states.dtype == torch.float32 and b.integrator["dtype"] == "float32"
    np.testing.assert_allclose(b.states.numpy(), a.states, rtol=0, atol=2e-5)


def test_tensor_run_saves_as_numpy_and_reloads(tmp_path):
    Q = torch.tensor(np.random.default_rng(4).standard_normal((3, 3)), requires_grad=True)
    beta = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    model = af.Attention(Q, Q, None, beta=beta, alibi=torch.tensor(0.3, dtype=torch.float64))
    run = af.simulate(model, uniform((2, N), 3, seed=4), 1.0, dt=0.1)
    assert run.states.requires_grad  # numpy x0 moved to the parameters' device, in the graph
    back = af.load(run.save(tmp_path / "run.nc"))
    assert isinstance(back.states, np.ndarray) and back.model.beta == 2.0
    np.testing.assert_array_equal(back.states, run.states.detach().numpy())
    again = af.simulate(back.model, uniform((2, N), 3, seed=4), 1.0, dt=0.1)
    np.testing.assert_allclose(again.states, back.states, rtol=0, atol=TOL)


def test_tensor_kernel_is_chosen_for_tensors_and_pads_nothing_on_cpu():
    from attnflow.kernels import torch as torch_kernel

    model = af.Attention(beta=2.0)
    X = torch.from_numpy(uniform((2, N), 2, seed=0))
    assert model.kernel_for(X) is torch_kernel.attend_tensor
    with pytest.raises(ValueError, match="backend: expected 'auto' or 'torch' for torch"):
        af.Attention(backend="blocked").kernel_for(X)


def test_small_heads_padded_inside_the_kernel_give_the_same_output():
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from attnflow.kernels import torch as torch_kernel

    rng = np.random.default_rng(1)
    q, k, v = (torch.from_numpy(rng.standard_normal((3, 7, 2))) for _ in range(3))
    for options in ({"is_causal": True, "scale": 5.0}, {"is_causal": False, "scale": 0.5}):
        plain = torch_kernel._padded(sdpa, q, k, v, pad=False, **options)
        padded = torch_kernel._padded(sdpa, q, k, v, pad=True, **options)
        assert padded.shape == plain.shape
        torch.testing.assert_close(padded, plain, rtol=0, atol=1e-14)


def test_out_of_memory_is_one_line_naming_the_size_and_what_fits():
    from attnflow.kernels import torch as torch_kernel

    def sdpa(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 931.00 GiB")

    q = torch.zeros((2, 50, 3), dtype=torch.float64)
    with pytest.raises(MemoryError) as err:
        torch_kernel._with_heads_axis(sdpa, q, q, q, attn_mask=torch.zeros(50, 50), scale=1.0)
    message = str(err.value)
    assert "\n" not in message and "2 runs x n = 50 tokens x head size 3 in float64" in message
    assert "holds 50 x 50 scores: mask 'causal' or 'full'" in message


def test_sinkhorn_weights_on_tensors_equal_numpy():
    model = af.Attention(beta=2.0, mask="full", attention="sinkhorn:7")
    X = uniform((2, N), 3, seed=8)
    np.testing.assert_allclose(model.field(torch.from_numpy(X)).numpy(), model.field(X),
                               rtol=0, atol=TOL)


@pytest.mark.parametrize("method", ["bdf", "radau", "lsoda"])
def test_implicit_methods_refuse_tensors_in_one_line(method):
    x0 = torch.from_numpy(uniform((N,), 3, seed=0))
    with pytest.raises(ValueError) as err:
        af.simulate(af.Attention(), x0, 1.0, method=method)
    message = str(err.value)
    assert "\n" not in message and "('euler', 'rk4', 'geodesic', 'dopri5')" in message
    with pytest.raises(ValueError, match="requires grad: an implicit solve has no autograd"):
        af.simulate(af.Attention(), x0.clone().requires_grad_(), 1.0, method=method)


def test_events_and_hardmax_refuse_tensors():
    x0 = torch.from_numpy(uniform((N,), 3, seed=0))
    with pytest.raises(ValueError, match="method: expected one of .* for torch tensors"):
        af.simulate(af.Attention(beta=np.inf), x0, 1.0, method="events")
    with pytest.raises(ValueError, match="beta: expected options .* on torch tensors"):
        af.simulate(af.Attention(beta=np.inf), x0, 1.0, method="rk4")


def test_tokens_and_parameters_on_different_devices_are_refused():
    Q = torch.eye(3, dtype=torch.float64)
    x0 = torch.empty((N, 3), dtype=torch.float64, device="meta")
    with pytest.raises(ValueError, match=r"x0: expected tokens on the device of the model's "
                       r"tensor parameters \(cpu\).*received a tensor on meta"):
        af.simulate(af.Attention(Q, Q, None), x0, 1.0)


def test_checkpoint_arguments_are_checked():
    x0 = uniform((N,), 3, seed=0)
    with pytest.raises(ValueError, match="checkpoint: expected None for numpy arrays"):
        af.simulate(af.Attention(), x0, 1.0, checkpoint=4)
    with pytest.raises(ValueError, match="checkpoint: expected None with dopri5"):
        af.simulate(af.Attention(), x0, 1.0, method="dopri5", device="cpu", checkpoint=4)
    with pytest.raises(ValueError, match="checkpoint: expected None or a number of steps"):
        af.simulate(af.Attention(), x0, 1.0, device="cpu", checkpoint=0)
    with pytest.raises(ValueError, match="device: expected a torch device"):
        af.simulate(af.Attention(), x0, 1.0, device="nowhere")


def test_a_device_torch_cannot_reach_is_one_line_and_the_record_names_the_kernel():
    if torch.cuda.is_available():
        pytest.skip("this torch reaches a CUDA device")
    x = torch.tensor(uniform(8, 2, 0))
    with pytest.raises(ValueError, match=r"^device: expected a device this torch can reach"):
        af.simulate(af.Attention(beta=2.0), x, 1.0, device="cuda")
    traj = af.simulate(af.Attention(beta=2.0, mask="causal"), x, 0.5)
    assert traj.integrator["kernel"] == "torch" and traj.integrator["device"] == "cpu"


def test_a_tensor_run_is_drawn_and_explored_from_a_host_copy():
    from attnflow.explorer.pack import pack

    x = torch.tensor(uniform(12, 2, 0), requires_grad=True)
    traj = af.simulate(af.Attention(beta=9.0, mask="causal"), x, 1.0)
    host = af.simulate(af.Attention(beta=9.0, mask="causal"), uniform(12, 2, 0), 1.0)
    assert af.plot.plot_circle(traj) is not None
    # the explorer's frames of the tensor run are those of the numpy run (quantised angles)
    assert pack(traj)["frames"] == pack(host)["frames"]
