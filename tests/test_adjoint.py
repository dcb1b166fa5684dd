"""`simulate(..., gradients="adjoint")`: the discrete adjoint of the steps taken against torch's
backpropagation through the same steps (an independent computation of the same derivative),
float64, for every fixed-step method and the sequential form; what it holds (saved tensors
counted by torch's hooks, not timed); its argument checks."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import attnflow as af
from attnflow.sphere import uniform

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

N, D, H = 5, 3, 6


def parameters(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    M = lambda r, c: rng.standard_normal((r, c)) / np.sqrt(c)  # noqa: E731
    return {"x0": rng.standard_normal((2, N, D)), "Q": M(D, D), "K": M(D, D), "V": M(D, D),
            "Q2": M(2, D), "beta": np.array(1.7), "slopes": np.array([0.3, 0.8]),
            "W_up": M(H, D), "W_down": M(D, H), "W_gate": M(H, D), "strength": np.array(1.4),
            "memory": uniform(3, D, seed + 1), "weights": np.array([1.0, 0.5, 2.0])}


def two_heads(p: dict, **options) -> af.Attention:
    """Two heads with ALiBi slopes, beta, strength and a SwiGLU MLP."""
    return af.Attention(heads=[(p["Q"], p["K"], p["V"]), (p["Q2"], p["Q2"], None)],
                        beta=p["beta"], alibi=p["slopes"], strength=p["strength"],
                        mlp=af.MLP(p["W_up"], p["W_down"], p["W_gate"]), mask="causal",
                        **options)


def with_memory(p: dict, **options) -> af.Attention:
    """One head attending to the tokens and to memory tokens (points and weights)."""
    return af.Attention(p["Q"], p["K"], p["V"], beta=p["beta"], mask="causal",
                        memory=(p["memory"], p["weights"]), **options)


def pre_ln(p: dict, **options) -> af.Attention:
    """A pre-LN block: states in R^d (no retraction)."""
    return af.Attention(p["Q"], p["K"], p["V"], beta=p["beta"], norm="pre",
                        mlp=af.MLP(p["W_up"], p["W_down"], p["W_gate"]), **options)


USES = {two_heads: ("x0", "Q", "K", "V", "Q2", "beta", "slopes", "W_up", "W_down", "W_gate",
                    "strength"),
        with_memory: ("x0", "Q", "K", "V", "beta", "memory", "weights"),
        pre_ln: ("x0", "Q", "K", "V", "beta", "W_up", "W_down", "W_gate")}
WEIGHTS = torch.from_numpy(np.random.default_rng(9).standard_normal((3, 2, N, D)))


def gradients(build, p: dict, gradients: str, method: str, run_options=None,
              **options) -> dict:
    """d/dparameters of a weighted sum of the states at three save times (between which the
    steps are shortened to meet them), by the given strategy."""
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    run = af.simulate(build(tensors, **options), tensors["x0"], 0.73, dt=0.1,
                      save_at=[0.2, 0.45, 0.73], normalize=True, method=method,
                      gradients=gradients, **(run_options or {}))
    (run.states * WEIGHTS).sum().backward()
    return {k: tensors[k].grad for k in USES[build]}


@pytest.mark.parametrize("build, method, options", [
    (two_heads, "euler", {}), (two_heads, "rk4", {}), (two_heads, "geodesic", {}),
    (two_heads, "euler", {"form": "sequential"}), (with_memory, "rk4", {}),
    (pre_ln, "rk4", {}), (pre_ln, "euler", {"form": "sequential"})])
def test_adjoint_gradients_equal_backpropagation_through_the_same_steps(build, method, options):
    p = parameters(3)
    plain = gradients(build, p, "backprop", method, **options)
    adjoint = gradients(build, p, "adjoint", method, **options)
    for name, g in plain.items():
        assert g is not None and adjoint[name] is not None, name
        scale = float(g.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(adjoint[name], g, rtol=0, atol=1e-10 * scale, msg=name)


@pytest.mark.parametrize("every", [1, 2, 3])
def test_checkpointed_adjoint_gradients_equal_backpropagation(every):
    p = parameters(5)
    plain = gradients(two_heads, p, "backprop", "rk4")
    adjoint = gradients(two_heads, p, "adjoint", "rk4", {"checkpoint": every})
    for name, g in plain.items():
        torch.testing.assert_close(adjoint[name], g, rtol=0,
                                   atol=1e-10 * float(g.abs().max()), msg=name)


def test_adjoint_reaches_tensors_a_parameter_was_computed_from():
    p = parameters(4)
    W = torch.tensor(p["Q"], requires_grad=True)
    grads = []
    for strategy in ("backprop", "adjoint"):
        W.grad = None
        x0 = torch.from_numpy(uniform((2, N), D, seed=5))
        run = af.simulate(af.Attention(2.0 * W, W.T, None, beta=3.0), x0, 0.5, dt=0.1,
                          save_at=[0.5], gradients=strategy)
        (run.states[-1] * WEIGHTS[0]).sum().backward()
        grads.append(W.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-12)
    assert float(grads[0].abs().max()) > 0


def block(Q) -> af.Attention:
    return af.Attention(Q, Q, Q, beta=2.0, mask="causal", mlp=af.MLP.random(D, 16, "gelu",
                                                                           seed=1))


def saved_bytes(gradients: str, steps: int, checkpoint: int | None = None) -> tuple[int, int]:
    """Bytes the graph of a run of `steps` rk4 steps holds for the backward pass once the run
    has returned (the storages of the saved tensors still alive, each once), and one state's
    bytes."""
    p = parameters(6)
    Q = torch.tensor(p["Q"], requires_grad=True)
    x0 = torch.from_numpy(uniform((2, 32), D, seed=7)).requires_grad_(True)
    saved = []

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run = af.simulate(block(Q), x0, steps * 0.05, dt=0.05, save_at=[steps * 0.05],
                          gradients=gradients, checkpoint=checkpoint)
    alive = [ref() for ref in saved]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in alive if t is not None}
    assert run.states.requires_grad
    return sum(storages.values()), x0.nbytes


def test_the_adjoint_keeps_one_state_per_step_and_backprop_every_steps_graph():
    per_step = {}  # what ten more steps add to the graph held after the run
    for strategy in ("backprop", "adjoint"):
        (short, state), (long, _) = saved_bytes(strategy, 10), saved_bytes(strategy, 20)
        per_step[strategy] = (long - short) / 10
    assert per_step["adjoint"] == state  # the starting state of each step, nothing else
    assert per_step["backprop"] > 10 * state  # every stage's queries, keys, MLP, ...
    # with checkpoint=5, one state per 5 steps
    assert (saved_bytes("adjoint", 20, 5)[0] - saved_bytes("adjoint", 10, 5)[0]) == 2 * state


def test_adjoint_states_are_those_of_the_plain_run_and_recorded():
    p = parameters(8)
    x0 = torch.from_numpy(uniform((2, N), D, seed=8))
    Q = torch.tensor(p["Q"], requires_grad=True)
    runs = [af.simulate(af.Attention(Q, Q, None, beta=2.0), x0, 1.0, dt=0.1, gradients=g)
            for g in ("backprop", "adjoint")]
    assert torch.equal(runs[0].states, runs[1].states)
    assert runs[1].integrator["gradients"] == "adjoint"
    assert "gradients" not in runs[0].integrator
    with torch.no_grad():  # nothing to differentiate: the plain loop
        assert not af.simulate(af.Attention(Q, Q, None), x0, 0.3,
                               gradients="adjoint").states.requires_grad


def test_gradients_arguments_are_checked_in_one_line():
    x0 = uniform((N,), 3, seed=0)
    t = torch.from_numpy(x0)
    cases = [
        ({"gradients": "continuous"}, t, r"^gradients: expected one of \('backprop', "
         r"'adjoint'\), received 'continuous'$"),
        ({"gradients": "adjoint"}, x0, r"^gradients: expected 'backprop' for numpy arrays"),
        ({"gradients": "adjoint", "method": "dopri5"}, t,
         r"^method: expected one of \('euler', 'rk4', 'geodesic'\) with gradients='adjoint'"),
        ({"gradients": "adjoint", "method": "euler", "noise": 0.1, "seed": 1}, t,
         r"^noise: expected None with gradients='adjoint'"),
        ({"gradients": "adjoint", "checkpoint": 0}, t,
         r"^checkpoint: expected None or a number of steps per chunk >= 1"),
    ]
    for kwargs, tokens, message in cases:
        with pytest.raises(ValueError, match=message):
            af.simulate(af.Attention(), tokens, 1.0, **kwargs)


def test_the_budget_covers_the_graph_backprop_holds_and_names_the_adjoint():
    Q = torch.tensor(parameters(6)["Q"], requires_grad=True)
    x0 = torch.from_numpy(uniform((2, 32), D, seed=7))
    held, _ = saved_bytes("backprop", 20)  # the graph of this run, measured by torch's hooks
    # the estimate is within a factor 2 of it: refused at half, run at twice
    with pytest.raises(ValueError, match=r"^memory_budget: expected a run within .* "
                       r"backpropagation through 20 steps holding an estimated .* cheaper: "
                       r"gradients='adjoint'"):
        af.simulate(block(Q), x0, 1.0, dt=0.05, save_at=[1.0], memory_budget=held / 2)
    af.simulate(block(Q), x0, 1.0, dt=0.05, save_at=[1.0], memory_budget=2 * held)
    af.simulate(block(Q), x0, 1.0, dt=0.05, save_at=[1.0], memory_budget=held / 2,
                gradients="adjoint")  # one state per step
    with torch.no_grad():  # nothing differentiated: no graph to budget
        af.simulate(block(Q), x0, 1.0, dt=0.05, save_at=[1.0], memory_budget=held / 2)
