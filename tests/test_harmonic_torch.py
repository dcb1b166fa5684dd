"""The harmonic kernel on torch tensors against the dense reference (CPU tensors, float64)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnflow.kernels import dense, harmonic_torch  # noqa: E402
from attnflow.kernels.types import Memory  # noqa: E402

TOL = 1e-10


def sphere(rng, shape):
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def run(q, k, v, beta, mask, memory=None, **kw):
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return harmonic_torch.attend_tensor(t(q), t(k), t(v), beta, mask, memory, **kw).numpy()


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("beta", [64.0, 9.0, -4.0, 0.0])
def test_self_attention_matches_dense(d, mask, beta):
    rng = np.random.default_rng(d)
    x = sphere(rng, (2, 90, d))
    v = rng.standard_normal((2, 90, 3))
    np.testing.assert_allclose(run(x, x, v, beta, mask), dense.attend(x, x, v, beta, mask),
                               rtol=0, atol=TOL)


@pytest.mark.parametrize("d", [2, 3])
def test_orthogonal_q_k_memory_and_broadcast(d):
    """Q = 2 R1, K = 0.5 R2 (R orthogonal), keys shared by broadcasting, memory keys."""
    rng = np.random.default_rng(10 + d)
    x = sphere(rng, (3, 80, d))
    r1, r2 = (np.linalg.qr(rng.standard_normal((d, d)))[0] for _ in range(2))
    q, k = 2.0 * x @ r1.T, 0.5 * x[0] @ r2.T
    v = rng.standard_normal((80, 2))
    memory = Memory(rng.standard_normal((4, d)), rng.standard_normal((4, 2)),
                    np.log(rng.uniform(0.5, 2.0, 4)))
    for mask in ("full", "causal"):
        got = run(q, k, v, 6.0, mask, memory)
        want = dense.attend(q, np.broadcast_to(k, q.shape), np.broadcast_to(v, (3, 80, 2)),
                            6.0, mask, memory)
        assert got.shape == (3, 80, 2)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_rows_far_from_their_keys_summed_directly():
    """q = -k at B = 40: a causal row's only keys lie opposite its query, Z_i ~ e^{-80}, far
    below what the truncation can resolve; those rows are summed directly."""
    rng = np.random.default_rng(3)
    x = sphere(rng, (1, 60, 2))
    v = rng.standard_normal((1, 60, 2))
    np.testing.assert_allclose(run(-x, x, v, 40.0, "causal"),
                               dense.attend(-x, x, v, 40.0, "causal"), rtol=0, atol=TOL)


def test_chunked_two_level_scan(monkeypatch):
    """Small scan blocks and chunks: chunks of 80 rows (five blocks of 16; H = 55 features at
    B = 8, F = 3, two runs), the last of 61 (three blocks and 13 rows), the carry between."""
    monkeypatch.setattr(harmonic_torch, "SCAN_BLOCK", 16)
    monkeypatch.setattr(harmonic_torch, "CHUNK_ELEMENTS", 2 * 3 * 55 * 80)
    assert harmonic_torch._chunks(2, 301, 3, 55) == (range(0, 301, 80), 80)
    rng = np.random.default_rng(4)
    x = sphere(rng, (2, 301, 2))
    v = rng.standard_normal((2, 301, 2))
    np.testing.assert_allclose(run(x, x, v, 8.0, "causal"), dense.attend(x, x, v, 8.0, "causal"),
                               rtol=0, atol=TOL)


def test_features_reproduce_the_kernel():
    """sum_h lam_h phi_h(u) phi_h(w) = exp(B <u, w> - |B|) on S^2 (the addition theorem with
    the numpy kernel's coefficients), to the tail bound."""
    from attnflow.kernels import _harmonic, harmonic

    rng = np.random.default_rng(5)
    u, w = sphere(rng, (50, 3)), sphere(rng, (50, 3))
    B = 5.0
    K = harmonic.order(B, 3, 1e-13)
    lam = harmonic.coefficients(B, 3)[_harmonic.degrees(3, K)]
    fu, fw = (harmonic_torch.features(torch.from_numpy(a), K).numpy() for a in (u, w))
    got = (fu * lam) @ fw.T
    np.testing.assert_allclose(got, np.exp(B * u @ w.T - B), rtol=0, atol=1e-13)


def test_float32_in_float32_out():
    """float32 inputs are computed in float64 and returned in float32."""
    rng = np.random.default_rng(7)
    x = sphere(rng, (1, 40, 2)).astype(np.float32)
    got = run(x, x, x, 10.0, "causal")
    assert got.dtype == np.float32
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, dense.attend(x64, x64, x64, 10.0, "causal"), rtol=0,
                               atol=1e-7)


def test_gradients_match_finite_differences():
    """torch.autograd through the kernel (in-place scans included), with respect to the
    tokens' angles and the values, against central differences (gradcheck)."""
    gen = torch.Generator().manual_seed(0)
    angle = torch.rand(1, 12, dtype=torch.float64, generator=gen).requires_grad_(True)
    v = torch.randn(1, 12, 2, dtype=torch.float64, generator=gen).requires_grad_(True)

    def field(angle, v):
        u = torch.stack([torch.cos(angle), torch.sin(angle)], -1)
        return harmonic_torch.attend_tensor(u, u, v, 4.0, "causal")

    assert torch.autograd.gradcheck(field, (angle, v), atol=1e-8)


def test_refusals_one_line():
    x = torch.from_numpy(sphere(np.random.default_rng(6), (5, 2)))
    with pytest.raises(ValueError, match="^mask: expected 'full' or 'causal'"):
        harmonic_torch.attend_tensor(x, x, x, 1.0, ("window", 2))
    with pytest.raises(ValueError, match="^bias: expected None"):
        harmonic_torch.attend_tensor(x, x, x, 1.0, "causal", bias=np.zeros((5, 5)))
    with pytest.raises(ValueError, match="^q: expected queries and keys of one size"):
        harmonic_torch.attend_tensor(torch.ones(5, 4), torch.ones(5, 4), x, 1.0, "causal")
    with pytest.raises(ValueError, match="^k: expected rows of one common norm"):
        harmonic_torch.attend_tensor(x, x * torch.arange(1, 6)[:, None], x, 1.0, "causal")
    assert np.isnan(harmonic_torch.attend_tensor(x * np.nan, x, x, 1.0, "causal").numpy()).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("d", [2, 3])
def test_on_the_device_matches_numpy_kernel(d):
    """On CUDA at n = 2e5 (several chunks of the scan), against the numpy harmonic kernel."""
    from attnflow.kernels import harmonic

    rng = np.random.default_rng(20 + d)
    x = sphere(rng, (1, 200_000, d))
    beta = 64.0 if d == 2 else 9.0
    got = harmonic_torch.attend_tensor(*(torch.from_numpy(x).cuda(),) * 3, beta, "causal")
    np.testing.assert_allclose(got.cpu().numpy(), harmonic.attend(x, x, x, beta, "causal"),
                               rtol=0, atol=TOL)
