"""The metric registry (`attnflow.analysis.metrics.METRICS`) and the analysis on tensors.

The tests of the registry are generated from it: every entry gives on torch tensors what it
gives on numpy arrays (to 1e-12 in float64), every differentiable entry's gradient matches
central differences of the numpy path, every other entry refuses a tensor that requires grad
naming a differentiable one. An entry the tests cannot evaluate (a context field they do not
supply, say) fails: nothing here skips.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import attnflow as af
import attnflow.analysis.depth as depth
import attnflow.analysis.metrics as metrics
import attnflow.analysis.moments as moments
import attnflow.analysis.renyi as renyi
from attnflow.analysis.metrics import METRICS, MetricContext
from attnflow.sphere import uniform

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

ROOT = Path(__file__).resolve().parents[1]
T, B, N = 3, 2, 7
RNG = np.random.default_rng(20261207)
QK = {"Q": RNG.standard_normal((3, 3)) / 2, "K": RNG.standard_normal((3, 3)) / 2}


def context(d: int) -> dict:
    """Every field of MetricContext, with values that make each entry well defined."""
    Q, K = (QK["Q"], QK["K"]) if d == 3 else (None, None)
    return {"tol": 0.3, "delta": 0.6, "r": 0.5, "beta": 2.5, "Q": Q, "K": K, "modes": 3}


def tokens(d: int, on_sphere: bool, seed: int = 0) -> np.ndarray:
    """(T, B, N, d) tokens: on the unit sphere, or directions times norms in [0.5, 2] (a
    residual stream)."""
    rng = np.random.default_rng(seed)
    X = uniform(T * B * N, d, rng).reshape(T, B, N, d)
    return X if on_sphere else X * rng.uniform(0.5, 2.0, (T, B, N, 1))


def dimension(m) -> int:
    return m.d if m.d is not None else 3


def evaluate(name: str, X, x0) -> object:
    m = METRICS[name]
    full = {**context(dimension(m)), "x0": x0}
    assert set(m.needs) <= set(full), f"{name} needs {m.needs}: add it to context()"
    return metrics.evaluate_metric(name, X, **{k: full[k] for k in m.needs})


def numpy_of(value) -> np.ndarray:
    return value.detach().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def test_the_context_has_every_field_an_entry_may_need():
    fields = set(MetricContext.__dataclass_fields__)
    assert set(context(3)) | {"x0"} == fields
    for m in METRICS.values():
        assert set(m.needs) <= fields, m.name
        assert m.units in ("1", "rad") and m.shape.startswith("(T, ...")
        assert m.description and "\n" not in m.description


@pytest.mark.parametrize("on_sphere", [True, False], ids=["sphere", "residual"])
@pytest.mark.parametrize("name", list(METRICS))
def test_tensor_equals_numpy(name, on_sphere):
    m = METRICS[name]
    X = tokens(dimension(m), on_sphere)
    want = np.asarray(evaluate(name, X, X[0]))
    assert want.shape[:2] == (T, B) and np.all(np.isfinite(want))
    Xt = torch.tensor(X, requires_grad=m.differentiable)
    got = evaluate(name, Xt, Xt[0])
    if m.differentiable:
        assert isinstance(got, torch.Tensor) and got.requires_grad, name
    np.testing.assert_allclose(numpy_of(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", [n for n, m in METRICS.items() if m.differentiable])
def test_gradients_match_central_differences(name):
    m = METRICS[name]
    X = tokens(dimension(m), on_sphere=name in ("energy", "log_energy"), seed=3)
    weights = np.random.default_rng(4).standard_normal(np.shape(evaluate(name, X, X[0])))
    Xt = torch.tensor(X, requires_grad=True)
    (evaluate(name, Xt, Xt[0].detach()) * torch.from_numpy(weights)).sum().backward()
    assert Xt.grad is not None and torch.isfinite(Xt.grad).all(), name
    eps = 1e-6
    for seed in range(2):
        v = np.random.default_rng(10 + seed).standard_normal(X.shape)
        if name in ("energy", "log_energy"):  # tangent directions: stay on the sphere
            v -= (v * X).sum(-1, keepdims=True) * X
        plus, minus = X + eps * v, X - eps * v
        if name in ("energy", "log_energy"):
            plus /= np.linalg.norm(plus, axis=-1, keepdims=True)
            minus /= np.linalg.norm(minus, axis=-1, keepdims=True)
        numeric = (np.sum(weights * evaluate(name, plus, X[0]))
                   - np.sum(weights * evaluate(name, minus, X[0]))) / (2 * eps)
        analytic = float((Xt.grad.numpy() * v).sum())
        assert abs(analytic - numeric) <= 1e-6 * max(1.0, abs(numeric)), (name, analytic,
                                                                            numeric)


@pytest.mark.parametrize("name", [n for n, m in METRICS.items() if not m.differentiable])
def test_a_count_refuses_gradients_and_names_a_differentiable_one(name):
    m = METRICS[name]
    X = tokens(dimension(m), True)
    Xt = torch.tensor(X, requires_grad=True)
    with pytest.raises(ValueError, match=r"^X: expected an array or a tensor without "
                       r"gradients \(.* is not differentiable; differentiable instead: "
                       r"order_parameter .*that requires grad$"):
        evaluate(name, Xt, Xt[0].detach())
    # without grad: numbers, from a host copy
    got = evaluate(name, Xt.detach(), Xt[0].detach())
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, evaluate(name, X, X[0]))


def test_the_registry_table_in_the_guide_is_the_registry():
    text = (ROOT / "docs/guide/analysis.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \| (.+?) \| (yes|no) \| (.+?) \|$", text, re.M)
    table = {r[0]: r[1:] for r in rows}
    assert table == {name: (m.shape, m.units, "yes" if m.differentiable else "no",
                            m.description) for name, m in METRICS.items()}


def test_bad_names_and_missing_context_say_so():
    X = tokens(3, True)
    with pytest.raises(ValueError, match=r"^name: expected a registered metric, one of "):
        metrics.evaluate_metric("energyy", X)
    with pytest.raises(ValueError, match=r"^beta: expected a value: the metric 'energy' "
                       r"needs beta, Q, K"):
        metrics.evaluate_metric("energy", X)
    with pytest.raises(ValueError, match=r"^betta: expected a context field of a metric"):
        metrics.evaluate_metric("energy", X, betta=1.0)
    with pytest.raises(ValueError, match=r"^X: expected tokens with d = 2"):
        metrics.evaluate_metric("fourier_moduli", X, modes=2)
    with pytest.raises(ValueError, match=r"^X: expected tokens of shape \(T, \.\.\., n, d\)"):
        metrics.evaluate_metric("order_parameter", X[0, 0])


# --- the analysis functions outside the registry, on tensors ---------------------------------

def test_cosines_attention_angular_distance_and_moments_on_tensors():
    X = tokens(2, False, seed=5)
    Xt = torch.tensor(X, requires_grad=True)
    for f in (depth.cosine_to_first, depth.angular_distance, depth.mean_pairwise_cosine,
              depth.effective_rank, depth.norm_spread, depth.massive_activation,
              depth.order_parameter,
              depth.mean_direction):
        got = f(Xt)
        assert got.requires_grad, f.__name__
        np.testing.assert_allclose(got.detach().numpy(), f(X), rtol=1e-12, atol=1e-13)
    U = X / np.linalg.norm(X, axis=-1, keepdims=True)
    mt = moments.fourier_moments(torch.tensor(U, requires_grad=True), 3)
    mn = moments.fourier_moments(U, 3)
    assert mt.mean.requires_grad and mt.n == mn.n
    for field in ("mean", "se_real", "se_imag"):
        np.testing.assert_allclose(getattr(mt, field).detach().numpy(), getattr(mn, field),
                                   rtol=1e-12, atol=1e-13)
    A = np.random.default_rng(6).dirichlet(np.ones(N), size=(2, 3, N))  # (L, H, n, n)
    At = torch.tensor(A, requires_grad=True)
    np.testing.assert_allclose(depth.attention_to_first(At).detach().numpy(),
                               depth.attention_to_first(A), rtol=1e-13)
    with pytest.raises(ValueError, match=r"^A: expected .*sink_rate .* not differentiable; "
                       r"differentiable instead: attention_to_first\)"):
        depth.sink_rate(At)
    np.testing.assert_array_equal(depth.sink_rate(At.detach()), depth.sink_rate(A))


def test_energy_gradients_in_q_k_and_a_tensor_beta():
    U = tokens(3, True, seed=11)[0]
    p = {"beta": np.array(1.7), "Q": RNG.standard_normal((2, 3)), "K": RNG.standard_normal((2, 3))}
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    af.analysis.energy.log_energy(torch.tensor(U), t["beta"], t["Q"], t["K"]).sum().backward()
    eps = 1e-6
    for name in p:
        v = np.random.default_rng(12).standard_normal(p[name].shape)

        def at(sign, name=name, v=v):
            q = {**p, name: p[name] + sign * eps * v}
            return af.analysis.energy.log_energy(U, float(q["beta"]), q["Q"], q["K"]).sum()

        numeric = (at(1) - at(-1)) / (2 * eps)
        analytic = float((t[name].grad.numpy() * v).sum())
        assert abs(analytic - numeric) <= 1e-6 * max(1.0, abs(numeric)), (name, analytic,
                                                                            numeric)
    with pytest.raises(ValueError, match=r"^beta: expected a number > 0"):
        af.analysis.energy.energy(torch.tensor(U), torch.tensor(-1.0, dtype=torch.float64))


def test_the_combinatorial_functions_refuse_gradients_in_one_line():
    X = tokens(2, True)[0, 0]
    Xt = torch.tensor(X, requires_grad=True)
    calls = {"cluster_count": lambda x: af.analysis.clusters.cluster_count(x, 0.2),
             "clusters": lambda x: af.analysis.clusters.clusters(x, 0.2),
             "spanning_tree": af.analysis.clusters.spanning_tree,
             "cluster_count_at": lambda x: depth.cluster_count_at(x, 0.2),
             "renyi_centers": lambda x: renyi.renyi_centers(x, 0.5),
             "strong_renyi_centers": lambda x: renyi.strong_renyi_centers(x, 0.5),
             "renyi_center_count": lambda x: depth.renyi_center_count(x, 0.5),
             "consumed_fraction": lambda x: renyi.consumed_fraction(x[None], [0], 0.5),
             "density_cluster_count": lambda x: af.analysis.modes.density_cluster_count(x, 4.0),
             "kde_circle": lambda x: af.analysis.modes.kde_circle(x, 0.3),
             "wasserstein_circle": lambda x: moments.wasserstein_circle(x, [1 / (2 * np.pi), 0.0])}
    for name, call in calls.items():
        with pytest.raises(ValueError) as err:
            call(Xt)
        line = str(err.value)
        assert "\n" not in line and "not differentiable; differentiable instead:" in line \
            and line.endswith("that requires grad"), (name, line)
        want, got = call(X), call(Xt.detach())  # without grad: the host copy's numbers
        for a, b in zip(*(w if isinstance(w, tuple) else (w,) for w in (want, got))):
            np.testing.assert_array_equal(np.asarray(getattr(a, "labels", a)),
                                          np.asarray(getattr(b, "labels", b)))


# --- runs -------------------------------------------------------------------------------------

def model(Q) -> af.Attention:
    return af.Attention(heads=[(Q, None, None)], beta=2.0, mask="causal")


def final_energy(Q, x0) -> object:
    run = af.simulate(model(Q), x0, 1.0, dt=0.1, save_at=[0.0, 0.5, 1.0])
    return run.energy()[-1]


def test_energy_at_t_end_of_a_tensor_run_has_the_gradient_of_the_numpy_engine():
    rng = np.random.default_rng(7)
    x0, Q = uniform(8, 3, rng), rng.standard_normal((3, 3)) / 2
    Qt = torch.tensor(Q, requires_grad=True)
    e = final_energy(Qt, torch.tensor(x0))
    assert isinstance(e, torch.Tensor) and e.requires_grad
    np.testing.assert_allclose(float(e.detach()), final_energy(Q, x0), rtol=1e-12)
    e.backward()
    eps = 1e-6
    for seed in range(2):
        v = np.random.default_rng(seed).standard_normal(Q.shape)
        numeric = (final_energy(Q + eps * v, x0) - final_energy(Q - eps * v, x0)) / (2 * eps)
        analytic = float((Qt.grad.numpy() * v).sum())
        assert abs(analytic - numeric) <= 1e-6 * max(1e-3, abs(numeric)), (analytic, numeric)


def test_trajectory_methods_on_tensor_runs():
    rng = np.random.default_rng(8)
    x0, Q = uniform(6, 3, rng), rng.standard_normal((3, 3)) / 2
    run = af.simulate(model(Q), x0, 1.0, dt=0.1, save_at=[0.0, 0.5, 1.0])
    Qt = torch.tensor(Q, requires_grad=True)
    runt = af.simulate(model(Qt), torch.tensor(x0), 1.0, dt=0.1, save_at=[0.0, 0.5, 1.0])
    for log in (False, True):
        got = runt.energy(log=log)
        assert got.requires_grad
        np.testing.assert_allclose(got.detach().numpy(), run.energy(log=log), rtol=1e-12)
    np.testing.assert_array_equal(run.energy(), af.analysis.energy.energy(run.states, 2.0, Q))
    np.testing.assert_allclose(runt.metric("order_parameter").detach().numpy(),
                               run.metric("order_parameter"), rtol=1e-12)
    with pytest.raises(ValueError, match="cluster_count .*not differentiable"):
        runt.metric("cluster_count")
    np.testing.assert_array_equal(run.metric("cluster_count", tol=0.2),
                                  af.analysis.clusters.cluster_count(run.states, 0.2))


# --- the consumers read the registry ---------------------------------------------------------

def test_every_consumer_reads_the_registry():
    from attnflow.explorer.pack import SERIES
    from attnflow.store import SUMMARIES
    from attnflow.sweeps import DEFAULT_METRICS
    from attnflow.sweeps import METRICS as SWEEP_METRICS

    assert set(SWEEP_METRICS) == {n for n, m in METRICS.items() if m.scalar and m.d is None}
    assert all(SWEEP_METRICS[n] is METRICS[n] for n in SWEEP_METRICS)
    assert set(DEFAULT_METRICS) <= set(SWEEP_METRICS)
    assert set(SUMMARIES.values()) <= set(METRICS) and set(SERIES.values()) <= set(METRICS)
    X = tokens(3, False)[:, 0]
    b = metrics.battery(X, tol=0.3, delta=0.6)
    keys = {"renyi_count": "renyi_centers", "strong_renyi_count": "strong_renyi_centers"}
    want = {keys.get(n, n) for n, m in METRICS.items() if set(m.needs) <= {"tol", "delta"}
            and m.d in (None, 3)}
    assert set(b) == want | {"angular_distance"}


@pytest.mark.parametrize("name", list(METRICS))
def test_plot_metric_draws_every_entry(name):
    m = METRICS[name]
    d = dimension(m)
    x0 = uniform(3 * N, d, np.random.default_rng(9)).reshape(3, N, d)
    run = af.simulate(af.Attention(beta=4.0), x0, 1.0, dt=0.1, save_at=[0.0, 0.5, 1.0])
    fig = af.plot.plot_metric(run, name)
    ax = fig.axes[0]
    values = np.asarray(run.metric(name), dtype=float).reshape(3, 3, -1)
    lines = ax.get_lines()
    assert len(lines) == values.shape[2]
    np.testing.assert_allclose(lines[0].get_ydata(), np.median(values[:, :, 0], axis=1))
    assert ax.get_title(loc="left") == m.description


def test_plot_metric_says_what_it_takes():
    run = af.simulate(af.Attention(beta=4.0), uniform(N, 3, np.random.default_rng(1)), 1.0,
                      dt=0.1, save_at=[0.0, 1.0])
    with pytest.raises(ValueError, match=r"^name: expected a registered metric, one of "):
        af.plot.plot_metric(run, "clusters")
    with pytest.raises(ValueError, match=r"^run: expected a run index in \[0, 1\)"):
        af.plot.plot_metric(run, "order_parameter", run=1)
    fig = af.plot.plot_metric(run, "cluster_count", tol=0.05, log_time=True)
    np.testing.assert_array_equal(fig.axes[0].get_lines()[0].get_ydata(),
                                  af.analysis.clusters.cluster_count(run.states[1:], 0.05))
