"""Hardmax attention (beta = +-inf) and the events integrator (docs/science.md §11.6).

Truths used: a plain numpy hardmax written here; closed forms on the circle (a token
following a fixed leader with V = I, post-LN: d(psi)/dt = -sin(psi) for its angle psi to the
leader, so tan(psi/2) = tan(psi_0/2) e^{-t}); softmax attention at beta = 1e6 integrated by
dopri5 at tight tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow.kernels import dense, get_kernel, hardmax
from attnflow.kernels.auto import attend as auto_attend
from attnflow.kernels.auto import choose
from attnflow.kernels.masks import mask_matrix


def circle(*angles: float) -> np.ndarray:
    th = np.asarray(angles, float)
    return np.stack([np.cos(th), np.sin(th)], -1)


def angle(x: np.ndarray) -> np.ndarray:
    return np.arctan2(x[..., 1], x[..., 0])


def rotation(phi: float) -> np.ndarray:
    return np.array([[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]])


def plain_hardmax(q, k, v, sign, allowed):
    """Row by row: the allowed keys within 32 eps |q_i| max|k_j| of the top signed score share
    the weight equally (the documented rule, written independently)."""
    out = np.zeros((q.shape[0], v.shape[1]))
    eps = np.finfo(float).eps
    for i in range(q.shape[0]):
        js = [j for j in range(k.shape[0]) if allowed[i, j]]
        s = {j: sign * float(np.dot(q[i], k[j])) for j in js}
        top = max(s.values())
        tol = 32 * eps * np.linalg.norm(q[i]) * max(np.linalg.norm(k[j]) for j in js)
        lead = [j for j in js if s[j] >= top - tol]
        out[i] = np.mean(v[lead], axis=0)
    return out


# ------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("beta", [np.inf, -np.inf])
@pytest.mark.parametrize("mask", ["causal", "full", ("window", 3)], ids=str)
@pytest.mark.parametrize("kernel", [dense.attend, auto_attend], ids=["dense", "auto"])
def test_supported_kernels_match_a_plain_hardmax(kernel, mask, beta):
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(3, 9, 4))
    got = kernel(q, k, v, beta, mask)
    want = plain_hardmax(q, k, v, np.sign(beta), mask_matrix(mask, 9))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_auto_never_picks_a_kernel_without_hardmax():
    rng = np.random.default_rng(0)
    for runs, n in [(1, 8), (1, 400), (64, 200)]:
        q = rng.normal(size=(runs, n, 2))
        assert choose(q, q, mask="causal", beta=np.inf) is dense.attend


@pytest.mark.parametrize("name", ["fused", "blocked", "harmonic"])
def test_other_kernels_refuse_infinite_beta(name):
    q = af.sphere.uniform(16, 2, 0)
    with pytest.raises(ValueError, match="beta|hardmax"):
        get_kernel(name)(q, q, q, np.inf, "causal")
    with pytest.raises(ValueError, match="backend"):
        af.Attention(beta=np.inf, backend=name)


def test_exact_ties_share_equally_and_near_ties_do_not():
    """Token 0 at the bisector of keys 1 and 2 (scores equal in exact arithmetic) shares its
    weight 1/2, 1/2; moved by 1e-9 rad it picks one key."""
    keys = circle(0.0, 0.7, -0.7)
    w = hardmax.leader_weights(keys, keys, -np.inf, "full")  # farthest keys lead
    np.testing.assert_array_equal(w[0], [0.0, 0.5, 0.5])
    keys2 = circle(1e-9, 0.7, -0.7)
    w2 = hardmax.leader_weights(keys2, keys2, -np.inf, "full")
    np.testing.assert_array_equal(w2[0], [0.0, 0.0, 1.0])


def test_dense_weights_at_infinite_beta_are_the_hardmax_weights():
    model = af.Attention(rotation(0.8), None, None, beta=np.inf, mask="full")
    x = circle(0.1, 1.0, -2.0, 2.5)
    W = model.attention_matrix(x)
    want = plain_hardmax(x @ rotation(0.8).T, x, np.eye(4), 1.0, np.ones((4, 4), bool))
    np.testing.assert_array_equal(W, want)


# ------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, what", [
    ({"alibi": "0.5"}, "bias"), ({"attention": "unnormalised"}, "unnormalised"),
    ({"attention": "sinkhorn", "mask": "full"}, "sinkhorn"),
    ({"memory": (circle(0.3), np.ones(1))}, "memory")])
def test_hardmax_refuses_options_without_a_limit(kwargs, what):
    kw = dict(kwargs)
    if "alibi" in kw:
        kw = {"alibi": float(kw.pop("alibi"))}
    with pytest.raises(ValueError, match=f"beta: .*{what}"):
        af.Attention(np.eye(2), np.eye(2), np.eye(2), beta=np.inf, **kw)


@pytest.mark.parametrize("method", ["bdf", "radau", "lsoda"])
def test_implicit_methods_are_refused_naming_the_ones_that_apply(method):
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2), beta=np.inf)
    with pytest.raises(ValueError, match="method: expected 'events'.*'rk4'"):
        af.simulate(model, circle(0.0, 1.0), 1.0, method=method)


def test_jacobian_and_events_at_finite_beta_are_refused():
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2), beta=np.inf)
    assert not model.has_exact_jacobian
    with pytest.raises(ValueError, match="finite beta"):
        model.jacobian(circle(0.0, 1.0))
    with pytest.raises(ValueError, match="method: .*finite beta"):
        af.simulate(af.Attention(np.eye(2), np.eye(2), np.eye(2), beta=5.0), circle(0.0, 1.0),
                    1.0, method="events")
    two = af.Attention(heads=[(None, None, None)] * 2, beta=np.inf)
    with pytest.raises(ValueError, match="one head"):
        af.simulate(two, circle(0.0, 1.0), 1.0, method="events")


def test_beta_accepts_both_infinities_and_refuses_nan():
    assert af.Attention(beta=-np.inf).beta == -np.inf
    with pytest.raises(ValueError, match="beta"):
        af.Attention(beta=np.nan)


# ------------------------------------------------------------------------- dynamics
def test_two_tokens_follow_the_closed_form():
    """beta = -inf, Q = K = V = I, causal: token 2's leader is the farthest allowed token,
    token 1 (token 1 sees itself only and stays). With psi the angle from token 1,
    psi' = -sin psi: tan(psi/2) = tan(psi_0/2) e^{-t}. RK4 at dt = 0.02: error 2e-9."""
    model = af.Attention(beta=-np.inf, mask="causal")
    times = np.linspace(0, 4, 9)
    tr = af.simulate(model, circle(0.3, 2.3), 4.0, save_at=times, method="events", dt=0.02)
    psi = angle(tr.states[:, 1]) - 0.3
    np.testing.assert_allclose(psi, 2 * np.arctan(np.tan(1.0) * np.exp(-times)), atol=1e-8)
    assert np.all(tr.states[:, 0] == tr.states[0, 0])
    assert tr.integrator["events"] == []


THREE_MASK = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 1]], bool)


def three_token_event_time() -> float:
    """Q = R(phi) (rotation by phi = 0.8), K = V = I, beta = +inf, post-LN; tokens 1 and 2
    see only themselves (they stay at angles 1 and 0), token 3 (angle -1) sees all three.
    Token 3's scores are cos(theta_3 + phi - theta_j): its leader is the token nearest to
    the point theta_3 + phi (itself at distance phi). At t = 0 that point is -0.2: token 2
    (distance 0.2) leads, so theta_3 follows tan(-theta_3/2) = tan(1/2) e^{-t}. Tokens 1 and
    2 are equally near when theta_3 + phi = 1/2 (their midpoint), theta_3 = -0.3: at
    t* = log(tan(1/2) / tan(0.15)); past it token 1 leads (theta_3 + phi keeps rising, nearer
    to 1, and within phi of it until theta_3 reaches 1), so for t > t*
    tan((1 - theta_3)/2) = tan(0.65) e^{-(t - t*)}."""
    return float(np.log(np.tan(0.5) / np.tan(0.15)))


def three_token_model(beta: float = np.inf) -> af.Attention:
    return af.Attention(rotation(0.8), None, None, beta=beta, mask=THREE_MASK)


def test_three_tokens_change_leader_at_the_computed_time():
    t_star = three_token_event_time()
    times = np.array([0.0, 0.5, 1.0, 2.0, 3.0])
    tr = af.simulate(three_token_model(), circle(1.0, 0.0, -1.0), 3.0, save_at=times,
                     method="events", dt=0.02)
    (event,) = tr.integrator["events"]
    t, run, token, old, new = event
    assert (run, token, old, new) == (0, 2, [1], [0])
    assert abs(t - t_star) < 1e-8
    th = angle(tr.states[:, 2])
    want = np.where(times < t_star, -2 * np.arctan(np.tan(0.5) * np.exp(-times)),
                    1 - 2 * np.arctan(np.tan(0.65) * np.exp(-(times - t_star))))
    np.testing.assert_allclose(th, want, atol=1e-8)


def test_exactly_tied_start_is_reproducible():
    """The three tokens of `three_token_event_time` started at the event itself: token 3 at
    -0.3, where theta_3 + phi = 1/2 is equally near tokens 1 and 2 (scores equal in exact
    arithmetic, within the tie tolerance in floating point): weights 1/2, 1/2. The shared
    velocity moves theta_3 up, towards token 1, so token 1 leads at once: one event, [0, 1]
    -> [0], right after t = 0, identical in every run; then the closed form from t* = 0."""
    x0 = circle(1.0, 0.0, -0.3)
    np.testing.assert_array_equal(three_token_model().attention_matrix(x0)[2], [0.5, 0.5, 0])
    runs = [af.simulate(three_token_model(), x0, 1.0, save_at=[0, 1], method="events",
                        dt=0.02) for _ in range(2)]
    assert runs[0].integrator["events"] == runs[1].integrator["events"]
    (event,) = runs[0].integrator["events"]
    assert event[2:] == [2, [0, 1], [0]] and 0 < event[0] < 1e-6
    np.testing.assert_array_equal(runs[0].states, runs[1].states)
    np.testing.assert_allclose(angle(runs[0].states[-1, 2]),
                               1 - 2 * np.arctan(np.tan(0.65) * np.exp(-1.0)), atol=1e-6)


def test_sliding_follows_the_tie_the_filippov_way():
    """beta = -inf, causal, tokens at 0.7, -0.7, 0: token 3 is equally far from tokens 1 and
    2, and following either brings it nearer to that one: the flow slides along the tie
    (Filippov), token 3 staying equidistant, theta_3 = (theta_1 + theta_2) / 2, while token 2
    follows token 1 by the closed form tan((0.7 - theta_2)/2) = tan(0.7) e^{-t}."""
    model = af.Attention(beta=-np.inf, mask="causal")
    times = np.linspace(0, 2, 5)
    tr = af.simulate(model, circle(0.7, -0.7, 0.0), 2.0, save_at=times, method="events",
                     dt=0.02)
    th2 = 0.7 - 2 * np.arctan(np.tan(0.7) * np.exp(-times))
    np.testing.assert_allclose(angle(tr.states[:, 1]), th2, atol=1e-8)
    np.testing.assert_allclose(angle(tr.states[:, 2]), (0.7 + th2) / 2, atol=1e-7)
    assert tr.integrator["events"][-1][2:] == [2, [0], [0, 1]]  # sliding on the pair


def generic_model(beta: float) -> af.Attention:
    rng = np.random.default_rng(7)
    M = rng.normal(size=(3, 3))
    return af.Attention(M, M, None, beta=beta, mask="full")


def test_large_finite_beta_tracks_hardmax():
    """Full mask, Q = K = M (B = M^T M positive semi-definite), V = I, 6 tokens on S^2, to
    t = 2 (several events). Softmax at beta = 1e6 differs from hardmax by O(e^{-beta gap})
    away from events; within O(1/beta) of an event the weights split, which shifts the
    later motion by O(1/beta) at most: 1e-6 here, so tolerance 1e-5 (dopri5 at rtol 1e-11)."""
    x0 = af.sphere.uniform(6, 3, 11)
    hard = af.simulate(generic_model(np.inf), x0, 2.0, save_at=[0, 1, 2], method="events",
                       dt=0.005)
    assert len(hard.integrator["events"]) >= 1
    soft = af.simulate(generic_model(1e6), x0, 2.0, save_at=[0, 1, 2], method="dopri5",
                       rtol=1e-11, atol=1e-13)
    err = np.max(np.abs(hard.states - soft.states))
    assert err < 1e-5
    assert np.max(np.abs(hard.states[-1] - x0)) > 0.05  # tokens moved: not a trivial match


def test_causality_earlier_tokens_unchanged_by_a_later_one():
    """Causal hardmax (Q = R(0.8) on the circle): perturbing tokens from k on leaves tokens
    before k unchanged (to the step's accuracy: an event of a later token splits the batch's
    step) and their events."""
    model = af.Attention(rotation(0.8), None, None, beta=np.inf, mask="causal")
    x0 = af.sphere.uniform(10, 2, 3)
    x1 = x0.copy()
    x1[6:] = af.sphere.normalize(x1[6:] + 0.3)
    a = af.simulate(model, x0, 3.0, method="events", dt=0.02)
    b = af.simulate(model, x1, 3.0, method="events", dt=0.02)
    np.testing.assert_allclose(a.states[:, :6], b.states[:, :6], atol=1e-10)
    early = [[e[2:] for e in tr.integrator["events"] if e[2] < 6] for tr in (a, b)]
    assert early[0] == early[1] and len(early[0]) >= 1
    assert not np.allclose(a.states[-1, 6:], b.states[-1, 6:])


def test_record_round_trip_and_progress(tmp_path):
    seen: list[float] = []
    tr = af.simulate(three_token_model(), circle(1.0, 0.0, -1.0), 3.0, method="events",
                     dt=0.05, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 3.0
    back = af.load(tr.save(tmp_path / "hard.nc"))
    assert back.model.beta == np.inf
    assert back.integrator["events"] == tr.integrator["events"]
    np.testing.assert_array_equal(back.states, tr.states)
    again = af.simulate(back.model, back.states[0], 3.0, method="events", dt=0.05)
    np.testing.assert_array_equal(again.states, tr.states)


def test_rk4_at_infinite_beta_is_first_order_across_the_event():
    """Without event location RK4 steps across the jump of the field (|jump| <= 2): its error
    is O(dt), bounded here by dt, and far above the events method's (closed form: 1e-8)."""
    x0 = circle(1.0, 0.0, -1.0)
    t_star = three_token_event_time()
    exact = 1 - 2 * np.arctan(np.tan(0.65) * np.exp(-(2.0 - t_star)))
    for dt in (0.04, 0.005):
        th = angle(af.simulate(three_token_model(), x0, 2.0, save_at=[2.0], method="rk4",
                               dt=dt).states[-1, 2])
        assert 1e-6 < abs(th - exact) < dt


GRID = {"n": 4, "d": 2, "t_end": 1.0, "seeds": 1}


def test_sweep_axis_mixes_finite_and_infinite_beta():
    """A sweep's beta axis takes inf (TOML's inf, or the text "inf") beside finite values;
    negative and NaN values stay refused. (A run of such a sweep with method rk4 was checked
    by hand: both points complete.)"""
    from attnflow.sweeps.spec import parse_spec

    for inf in ("inf", np.inf):
        spec = parse_spec({"grid": {"beta": [10.0, inf], **GRID}})
        assert list(spec.axes["beta"]) == [10.0, np.inf]
    for bad in (np.nan, "nan"):
        with pytest.raises(ValueError, match="beta"):
            parse_spec({"grid": {"beta": [1.0, bad], **GRID}})


def test_cli_simulates_hardmax_with_events(tmp_path):
    """`attnflow simulate --beta inf --method events` writes a run whose model has beta =
    inf and whose record holds the events (in process, through typer's runner). Q = K = I:
    every token leads itself, so nothing moves and there are no events."""
    from typer.testing import CliRunner

    from attnflow.cli import app

    out = tmp_path / "hard.nc"
    result = CliRunner().invoke(app, ["simulate", "--beta", "inf", "--method", "events",
                                      "--n", "5", "--t-end", "2", "--out", str(out),
                                      "--no-progress"])
    assert result.exit_code == 0, result.output
    back = af.load(out)
    assert back.model.beta == np.inf and back.integrator["events"] == []
    np.testing.assert_allclose(back.states[-1], back.states[0], atol=1e-14)
    bad = CliRunner().invoke(app, ["simulate", "--beta", "inf", "--method", "bdf", "--n", "3",
                                   "--t-end", "1", "--out", str(tmp_path / "x.nc")])
    assert bad.exit_code == 2 and "events" in bad.output
