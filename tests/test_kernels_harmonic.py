"""The harmonic kernels (attnflow.kernels.harmonic) against independent truth: the dense
reference kernel, direct sums in extended precision, closed forms of the expansion."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.special import eval_legendre
from scipy.stats import special_ortho_group

import attnflow as af
from attnflow.kernels import auto, dense, fused, get_kernel, harmonic
from attnflow.kernels._harmonic import degrees, feature_count
from attnflow.kernels.options import LinearBias
from attnflow.kernels.types import Memory
from attnflow.sphere import uniform

MASKS = ["full", "causal", ("window", 1), ("window", 9)]


def orthogonal_multiple(d: int, scale: float, seed: int) -> np.ndarray:
    return scale * special_ortho_group.rvs(d, random_state=seed)


# ---------------------------------------------------------------- the expansion
@pytest.mark.parametrize("B", [0.5, 9.0, 64.0, -25.0])
def test_tail_bounds_the_circle_truncation_on_a_fine_grid(B):
    c = harmonic.coefficients(B, 2)
    T = harmonic.tail(B, 2)
    u = np.linspace(-np.pi, np.pi, 4001)
    exact = np.exp(B * np.cos(u) - abs(B))
    for K in (1, 5, 20, 60):
        K = min(K, c.size - 1)
        partial = c[0] + 2 * sum(c[k] * np.cos(k * u) for k in range(1, K + 1))
        err = np.max(np.abs(exact - partial))
        assert err <= T[K] * (1 + 1e-9) + 1e-14  # + the round-off of K terms of size <= 1
        if T[K] > 1e-10:  # the bound is not vacuous: within 3x of the error at u = 0 or pi
            assert err >= T[K] / 3


@pytest.mark.parametrize("B", [0.5, 9.0, -9.0, 30.0])
def test_tail_bounds_the_sphere_truncation(B):
    """exp(B t - |B|) against sum_l (2l + 1) c_l P_l(t) (scipy's Legendre polynomials)."""
    c = harmonic.coefficients(B, 3)
    T = harmonic.tail(B, 3)
    t = np.linspace(-1, 1, 2001)
    exact = np.exp(B * t - abs(B))
    for L in (2, 8, 20):
        L = min(L, c.size - 1)
        partial = sum((2 * ell + 1) * c[ell] * eval_legendre(ell, t) for ell in range(L + 1))
        assert np.max(np.abs(exact - partial)) <= T[L] * (1 + 1e-9) + 1e-14


def test_one_key_gives_the_weight_itself():
    """With one key and value 1 the kernel's sum is exp(B <u, w> - shift) itself: the
    features' products summed with their coefficients (the addition theorems) reproduce it
    (or, where the bound does not cover the row, the direct sum does)."""
    for d, B in ((2, 0.7), (2, 40.0), (3, 5.0), (3, -12.0)):
        u, w = uniform(2, d, seed=3)
        _, Z, shift = harmonic.sums(u[None], w[None], np.ones((1, 1)), B, "full", None, None,
                                    1e-13, (1.0, 1.0))
        assert Z[0] * math.exp(shift[0]) == pytest.approx(math.exp(B * (u @ w)), rel=1e-12)
        K = harmonic.order(B, d, 1e-13)
        assert feature_count(d, K) == degrees(d, K).size


# ---------------------------------------------------------------- against dense
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.sampled_from([2, 3]), n=st.integers(1, 90), beta=st.floats(-30, 70),
       mask=st.sampled_from(MASKS), slope=st.sampled_from([None, 0.0, 0.03, 0.7]),
       norm=st.sampled_from(["softmax", "unnormalised"]), f=st.integers(1, 4),
       runs=st.sampled_from([(), (2,)]), memory=st.booleans(), qk=st.booleans(),
       seed=st.integers(0, 2**16), block=st.sampled_from([7, 64, 4096]))
def test_harmonic_agrees_with_dense_to_its_tolerance(d, n, beta, mask, slope, norm, f, runs,
                                                    memory, qk, seed, block):
    rng = np.random.default_rng(seed)
    x = uniform((*runs, n), d, seed=seed)
    if qk:  # Q, K multiples of orthogonal matrices: scores c beta <u_i, w_j>
        q = x @ orthogonal_multiple(d, 1.3, seed).T
        k = x @ orthogonal_multiple(d, 0.6, seed + 1).T
    else:
        q = k = x
    v = rng.normal(size=(*runs, n, f))
    mem = None
    if memory:  # memory keys are summed directly: any norm
        mem = Memory(k=0.9 * uniform(3, d, seed=seed + 2), v=rng.normal(size=(3, f)),
                     log_weights=np.log([1.0, 2.0, 5.0]))
    bias = None if slope is None else LinearBias(slope)
    tol = 1e-10
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(harmonic, "BLOCK", block)  # several blocks: block totals, two passes
        got = harmonic.attend(q, k, v, beta, mask, mem, bias, norm, tol=tol)
    ref = dense.attend(q, k, v, beta, mask, mem, bias, norm)
    scale = np.abs(v).max() if mem is None else max(np.abs(v).max(), np.abs(mem.v).max())
    if norm == "softmax":
        bound = 2 * tol * scale
    else:  # tol times the row's weight sum times max |v|
        wsum = dense.attention_weights(q, k, beta, mask, mem, bias, norm).sum(-1)
        bound = tol * wsum[..., None] * scale
    np.testing.assert_array_less(np.abs(got - ref), bound + 1e-12 * (1 + np.abs(ref)))


def test_rows_far_from_every_key_are_summed_directly():
    """beta 300, keys clustered near angle 0, queries near pi (Q a rotation by pi): every
    weight is about e^{-600} of the scale, so every row fails the a priori bound and must
    come out right all the same."""
    n = 40
    theta = np.linspace(-0.05, 0.05, n)
    x = np.stack([np.cos(theta), np.sin(theta)], -1)
    q = -x  # rotated by pi
    v = np.random.default_rng(1).normal(size=(n, 2))
    for mask in ("causal", "full", ("window", 5)):
        # from |B| = 373 on every weight exp(score - |B|) of these rows underflows: each
        # directly summed row carries its own shift
        for beta, query in ((300.0, q), (400.0, q), (-400.0, x)):
            got = harmonic.attend(query, x, v, beta, mask)
            ref = dense.attend(query, x, v, beta, mask)
            np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)
        for slope in (800.0, 1e3):  # e^{-slope} = 0: each row sees its own key only
            got = harmonic.attend(q, x, v, 64.0, mask, bias=LinearBias(slope))
            np.testing.assert_allclose(got, dense.attend(q, x, v, 64.0, mask,
                                                         bias=LinearBias(slope)), atol=1e-12)


def test_window_and_causal_rows_at_2e4_tokens_against_exact_sums():
    """n = 2e4, beta = 64: rows checked against direct sums in long double."""
    n, beta = 20_000, 64.0
    x = uniform(n, 2, seed=5)
    v = np.random.default_rng(2).normal(size=(n, 3))
    rows = np.r_[0, 1, 77, 5000, np.arange(n - 5, n)]
    for mask, bias in (("causal", None), (("window", 300), LinearBias(0.01)),
                       ("full", LinearBias(0.002))):
        got = harmonic.attend(x, x, v, beta, mask, bias=bias, tol=1e-12)
        slope = 0.0 if bias is None else bias.slope
        for i in rows:
            lo = max(0, i - mask[1] + 1) if isinstance(mask, tuple) else 0
            hi = n if mask == "full" else i + 1
            xl = x[lo:hi].astype(np.longdouble)
            s = beta * (xl @ x[i].astype(np.longdouble)) - slope * np.abs(i - np.arange(lo, hi))
            wts = np.exp(s - s.max())
            exact = (wts @ v[lo:hi].astype(np.longdouble)) / wts.sum()
            np.testing.assert_allclose(got[i], exact.astype(float), rtol=0, atol=2e-12)


def test_float32_in_float32_out():
    x = uniform(500, 2, seed=1)
    got = harmonic.attend(x.astype(np.float32), x.astype(np.float32), x.astype(np.float32),
                          20.0, "causal", tol=1e-7)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, dense.attend(x, x, x, 20.0, "causal"), atol=2e-6)


# ---------------------------------------------------------------- invariants
@pytest.mark.parametrize("mask", ["causal", ("window", 4)])
def test_later_tokens_never_change_earlier_rows(mask, monkeypatch):
    monkeypatch.setattr(harmonic, "BLOCK", 16)
    for d in (2, 3):
        x = uniform(100, d, seed=1)
        y = x.copy()
        y[60:] = uniform(40, d, seed=2)
        a = harmonic.attend(x, x, x, 25.0, mask)
        b = harmonic.attend(y, y, y, 25.0, mask)
        np.testing.assert_array_equal(a[:60], b[:60])
        assert not np.allclose(a[60:], b[60:])


def test_full_attention_is_permutation_equivariant():
    x = uniform(300, 3, seed=4)
    perm = np.random.default_rng(0).permutation(300)
    a = harmonic.attend(x, x, x, 9.0, "full")
    b = harmonic.attend(x[perm], x[perm], x[perm], 9.0, "full")
    np.testing.assert_allclose(a[perm], b, atol=1e-13)


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("call, match", [
    (lambda x: harmonic.attend(x, x, x, 1.0, np.tril(np.ones((5, 5), bool))),
     "mask: expected 'full', 'causal' or \\('window', w\\) for the harmonic kernel"),
    (lambda x: harmonic.attend(x, x, x, 1.0, "full", normalization=("sinkhorn", 3)),
     "normalization: expected 'softmax', 'unnormalised' or 'positional'"),
    (lambda x: harmonic.attend(x, x, x, 1.0, "causal", bias=np.zeros((5, 5))),
     "bias: expected None or a LinearBias"),
    (lambda x: harmonic.attend(np.ones((5, 4)), np.ones((5, 4)), x, 1.0, "causal"),
     "q: expected queries and keys of one size, 2 \\(the circle\\) or 3"),
    (lambda x: harmonic.attend(x * np.arange(1, 6)[:, None], x, x, 1.0, "causal"),
     "q: expected rows of one common norm .*Q a multiple of an orthogonal matrix.*"
     "received norms from 1 to 5"),
    (lambda x: harmonic.attend(x, x, x, 1.0, "causal", tol=1e-16),
     "tol: expected a tolerance in \\[1e-14, 1\\)"),
])
def test_refusals_name_the_argument_and_the_reason(call, match):
    with pytest.raises(ValueError, match=match):
        call(uniform(5, 2, seed=0))


def test_backend_text_forms():
    assert get_kernel("harmonic").tol == harmonic.DEFAULT_TOL
    assert get_kernel("harmonic:1e-9").tol == 1e-9
    for bad in ("harmonic:", "harmonic:x", "harmonic:1e-20", "harmonic:2"):
        with pytest.raises(ValueError, match="backend: expected harmonic:TOL"):
            get_kernel(bad)
    x0 = uniform(30, 2, seed=0)
    traj = af.simulate(af.Attention(beta=4.0, backend="harmonic:1e-9"), x0, 0.2, dt=0.1)
    assert traj.model.backend == "harmonic:1e-9"  # the tolerance is recorded with the run


def test_auto_picks_harmonic_for_long_runs_and_falls_back_where_it_does_not_apply():
    n = 4 * harmonic.features(64.0, 2) + 1
    x = uniform(n, 2, seed=0)
    assert auto.choose(x, x, mask="causal", beta=64.0) is auto.harmonic_or_blocked
    assert auto.choose(x[:50], x[:50], mask="causal", beta=64.0) is not \
        auto.harmonic_or_blocked
    ens = np.zeros((8, 6 * harmonic.features(64.0, 2), 2))  # an ensemble of long runs
    assert auto.choose(ens, ens, mask="causal", beta=64.0) is auto.harmonic_or_blocked
    assert auto.choose(ens[:, :200], ens[:, :200], mask="causal", beta=64.0) is fused.attend
    q = x * np.linspace(1, 2, n)[:, None]  # no common norm: the blocked kernel takes it
    np.testing.assert_allclose(auto.attend(q, x, x, 3.0, "causal"),
                               dense.attend(q, x, x, 3.0, "causal"), atol=1e-12)


# ---------------------------------------------------------------- in a simulation
def test_simulation_with_the_harmonic_backend_matches_dense():
    """Geodesic RK4 evaluates on the sphere: equal to dense within the kernel's tolerance;
    RK4's stages lie off the sphere, where the harmonic backend reads directions: equal to
    within RK4's local error (dt^5 per step)."""
    x0 = uniform(120, 2, seed=3)
    for method, atol in (("geodesic", 1e-10), ("rk4", 1e-7)):
        runs = [af.simulate(af.Attention(beta=16.0, mask="causal", backend=b), x0, 2.0,
                            method=method, dt=0.05).states for b in ("harmonic:1e-13", "dense")]
        np.testing.assert_allclose(runs[0], runs[1], atol=atol)


@pytest.mark.slow
def test_prefix_round_off_at_a_million_tokens():
    """n = 1e6, causal, beta = 64: the last rows (the longest prefixes) against direct sums
    in long double, to the tolerance 1e-12 (Kahan-compensated moments)."""
    n, beta = 1_000_000, 64.0
    x = uniform(n, 2, seed=7)
    got = harmonic.attend(x, x, x, beta, "causal", tol=1e-12)
    for i in (n - 1, n - 2, n // 2):
        xl = x[: i + 1].astype(np.longdouble)
        s = beta * (xl @ x[i].astype(np.longdouble))
        wts = np.exp(s - s.max())
        exact = (wts @ xl) / wts.sum()
        np.testing.assert_allclose(got[i], exact.astype(float), rtol=0, atol=2e-12)


def test_log_energy_against_the_dense_energy():
    from attnflow.analysis.energy import log_energy
    for d, beta in ((2, 64.0), (3, 9.0), (2, 0.3)):
        x = uniform((2, 400), d, seed=d)
        np.testing.assert_allclose(harmonic.log_energy(x, x, beta), log_energy(x, beta),
                                   rtol=0, atol=1e-11)
    R = orthogonal_multiple(3, 1.0, 4)
    x = uniform(300, 3, seed=1)
    np.testing.assert_allclose(harmonic.log_energy(x, x @ R.T, 5.0),
                               log_energy(x, 5.0, None, R), atol=1e-11)
    with pytest.raises(ValueError, match="beta: expected a number > 0"):
        harmonic.log_energy(x, x, 0.0)


def test_non_finite_inputs_give_nan_and_shapes_are_checked():
    x = uniform(6, 2, seed=0)
    bad = x.copy()
    bad[2, 0] = np.nan
    assert np.isnan(harmonic.attend(bad, bad, bad, 3.0, "causal")).all()  # as dense: the
    # integrators then report the non-finite state
    with pytest.raises(ValueError, match="v: expected 6 rows, one per query"):
        harmonic.attend(x, x, x[:1], 3.0, "causal")
    with pytest.raises(ValueError, match="k: expected queries and keys of one size"):
        harmonic.attend(x, np.ones((6, 4)), x, 3.0, "causal")
    with pytest.raises(ValueError, match="beta: expected a finite number"):
        harmonic.attend(x, x, x, np.inf, "causal")
    c = harmonic.coefficients(9.0, 2)  # cached: shared by every caller, so read-only
    with pytest.raises(ValueError):
        c[1] = 0.0


def test_auto_reads_directions_under_rk4():
    """auto's harmonic_or_blocked, like the harmonic backend, reads x / |x| on a sphere
    scheme, so that RK4's off-sphere stages stay on the harmonic kernel."""
    n = 4 * harmonic.features(64.0, 2) + 1
    model = af.Attention(beta=64.0, mask="causal")
    x = uniform(n, 2, seed=1) * 1.01  # a stage point off the sphere
    kernel = model.attention.kernel_for(x)
    assert kernel is auto.harmonic_or_blocked
    u = model.attention_inputs(x, kernel)
    np.testing.assert_allclose(np.linalg.norm(u, axis=-1), 1.0, atol=1e-15)
    np.testing.assert_array_equal(model.attention_inputs(x, dense.attend), x)


@pytest.mark.timeout(60)
def test_a_score_scale_beyond_max_b_is_refused_with_its_reason_and_auto_leaves_it():
    """|beta a b| > MAX_B (a legal beta such as 1e308 has no truncation to compute): the
    harmonic kernel refuses it naming beta and why; auto picks another kernel, and
    harmonic_or_blocked falls back when the norms a b carry B past it. Truth: the dense
    kernel."""
    x = uniform(1000, 2, 0)
    assert auto.choose(x, x, mask="causal", beta=64.0) is auto.harmonic_or_blocked
    assert auto.choose(x, x, mask="causal", beta=1e308) is not auto.harmonic_or_blocked
    with pytest.raises(ValueError, match=r"^beta: expected a score scale \|beta a b\| <= "
                       r"1e\+06 for the harmonic kernel \(its order grows like sqrt\|B\|"):
        harmonic.attend(x, x, x, 1e308, "causal")
    q = 40.0 * x  # a b = 40: B = 4e6 at beta = 1e5
    with pytest.raises(ValueError, match=r"^beta: .*received 4e\+06$"):
        harmonic.check(q, x, "causal", None, "softmax", 1e5)
    np.testing.assert_allclose(auto.harmonic_or_blocked(q, x, x, 1e5, "causal"),
                               dense.attend(q, x, x, 1e5, "causal"), atol=1e-12)

def test_the_parallel_prefix_scan_equals_one_thread_and_dense(monkeypatch):
    """The causal scan on 2 threads (blocks of 512 rows: block totals, their scan, then each
    block's rows) is bit for bit the 1-thread result, and dense's to within the tolerance."""
    x = uniform(5000, 2, seed=3)
    v = np.random.default_rng(3).normal(size=(5000, 2))
    monkeypatch.setattr(harmonic, "BLOCK", 512)
    got = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("ATTNFLOW_THREADS", threads)
        got[threads] = harmonic.attend(x, x, v, 64.0, "causal")
    np.testing.assert_array_equal(got["1"], got["2"])
    ref = dense.attend(x, x, v, 64.0, "causal")
    assert np.abs(got["2"] - ref).max() <= 2 * harmonic.DEFAULT_TOL * np.abs(v).max() + 1e-13
