"""The Triton fused kernel against the dense reference: on CPU in Triton's interpreter (tiny
sizes), on CUDA compiled when a GPU is present (the tests marked `gpu` only there)."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
if not CUDA:  # before triton is first imported (also set by conftest.py, for the suite)
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from attnflow.kernels import dense, triton_fused  # noqa: E402
from attnflow.kernels.masks import mask_matrix  # noqa: E402
from attnflow.kernels.types import Memory  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
TOL = {np.float64: 1e-12, np.float32: 1e-5}


def run(q, k, v, beta, mask, memory=None, bias=None, tangent=None, **blocks):
    """triton_fused.attend_tensor on numpy inputs, moved to the device; numpy out."""
    as_t = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(DEVICE)  # noqa: E731
    return triton_fused.attend_tensor(as_t(q), as_t(k), as_t(v), beta, mask, memory, bias,
                                      tangent=as_t(tangent), **blocks).cpu().numpy()


def reference(q, k, v, beta, mask, memory=None, bias=None):
    """dense.attend in float64 on the same (rounded) inputs."""
    up = lambda a: a.astype(np.float64)  # noqa: E731
    mem = None if memory is None else Memory(*(up(np.asarray(a)) for a in memory))
    return dense.attend(up(q), up(k), up(v), beta, mask, mem, bias)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mask", ["full", "causal", ("window", 7)])
@pytest.mark.parametrize("beta", [5.0, -3.0, 0.0])
def test_matches_dense(dtype, mask, beta):
    """Runs along two leading axes, e = 3, f = 2, n = 37 (not a multiple of the blocks of
    16: three row blocks, windows starting inside a key block)."""
    rng = np.random.default_rng(1)
    q, k = (rng.standard_normal((2, 3, 37, 3)).astype(dtype) for _ in range(2))
    v = rng.standard_normal((2, 3, 37, 2)).astype(dtype)
    out = run(q, k, v, beta, mask, block_m=16, block_n=16)
    assert out.dtype == dtype and out.shape == v.shape
    np.testing.assert_allclose(out, reference(q, k, v, beta, mask), rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("e,f", [(2, 2), (5, 3), (16, 16), (1, 7)])
def test_head_sizes_padded_inside(e, f):
    rng = np.random.default_rng(e)
    q, k = (rng.standard_normal((4, 21, e)) for _ in range(2))
    v = rng.standard_normal((4, 21, f))
    np.testing.assert_allclose(run(q, k, v, 2.0, "causal"), reference(q, k, v, 2.0, "causal"),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sphere_field_at_large_beta(dtype):
    """The dynamics' field P_x(attention) at beta = 64 (W1's), keys shared by broadcasting:
    q (3, n, 2) against one set of keys (n, 2)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 50, 2))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    x = x.astype(dtype)
    out = run(x, x[0], x, 64.0, "causal", tangent=x)
    a = reference(x, np.broadcast_to(x[0], x.shape), x, 64.0, "causal")
    x64 = x.astype(np.float64)
    want = a - np.sum(a * x64, axis=-1, keepdims=True) * x64
    np.testing.assert_allclose(out, want, rtol=0, atol=TOL[dtype])


def test_memory_bias_and_mask_arrays():
    """Memory keys with log-weights, an ALiBi-like bias with -inf entries, a boolean mask
    array: each alone and together, small blocks so that several key blocks are visited."""
    rng = np.random.default_rng(3)
    n = 29
    q, k, v = (rng.standard_normal((2, n, 3)) for _ in range(3))
    memory = Memory(rng.standard_normal((5, 3)), rng.standard_normal((5, 3)),
                    np.log(rng.uniform(0.5, 3.0, 5)))
    i = np.arange(n)
    bias = -0.3 * np.abs(i[:, None] - i[None, :])
    bias[3, :2] = -np.inf
    arr = rng.uniform(size=(n, n)) < 0.6
    arr[np.arange(n), np.arange(n)] = True
    for mask, mem, b in [("causal", memory, None), ("full", None, bias), (arr, None, None),
                         (arr, memory, bias), (("window", 4), memory, bias)]:
        got = run(q, k, v, 1.5, mask, mem, b, block_m=16, block_n=16)
        np.testing.assert_allclose(got, reference(q, k, v, 1.5, mask, mem, b), rtol=0,
                                   atol=1e-12)


def test_causality_bit_identical():
    """Changing token t leaves every row before t bit-identical (causal and window)."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 40, 2)) for _ in range(3))
    for mask in ("causal", ("window", 6)):
        base = run(q, k, v, 8.0, mask, block_m=16, block_n=16)
        for t in (5, 16, 31):
            q2, k2, v2 = q.copy(), k.copy(), v.copy()
            for a in (q2, k2, v2):
                a[:, t] += 1.0
            moved = run(q2, k2, v2, 8.0, mask, block_m=16, block_n=16)
            assert np.array_equal(moved[:, :t], base[:, :t])
            assert not np.array_equal(moved[:, t], base[:, t])
            assert mask_matrix(mask, 40)[t, t]


def test_bad_input_one_line():
    x = torch.zeros((4, 2), dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="^beta: expected a finite number"):
        triton_fused.attend_tensor(x, x, x, float("inf"), "causal")
    with pytest.raises(ValueError, match="^k: expected float32 or float64, the dtype of q"):
        triton_fused.attend_tensor(x, x.float(), x, 1.0, "causal")
    with pytest.raises(ValueError, match=r"^v: expected \(\.\.\., 4, f\)"):
        triton_fused.attend_tensor(x, x, x[:3], 1.0, "causal")
    with pytest.raises(ValueError, match="^bias: expected an \\(4, 4\\) score bias"):
        triton_fused.attend_tensor(x, x, x, 1.0, "causal", bias=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="^mask: expected"):
        triton_fused.attend_tensor(x, x, x, 1.0, "diagonal")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_at_size(dtype):
    """Compiled on the GPU at sizes the interpreter cannot reach: W1's shape (many runs,
    n = 200, d = 2, beta = 64, causal) and one long causal sequence."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((512, 200, 2))
    x = (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(dtype)
    np.testing.assert_allclose(run(x, x, x, 64.0, "causal"), reference(x, x, x, 64.0, "causal"),
                               rtol=0, atol=TOL[dtype] * 10)
    y = rng.standard_normal((1, 3000, 2)).astype(dtype)
    np.testing.assert_allclose(run(y, y, y, 4.0, ("window", 700)),
                               reference(y, y, y, 4.0, ("window", 700)), rtol=0,
                               atol=TOL[dtype] * 10)


def test_exp_floor_chain():
    """The floor kernel of benchmarks/gpu.py computes the chain it claims: x <- 2^-x."""
    from attnflow.kernels._triton_attend import exp2_chain

    x0 = torch.rand(64, dtype=torch.float64, device=DEVICE)
    x = x0.clone()
    exp2_chain[(2,)](x, 5, BLOCK=32)
    want = x0.cpu().numpy()
    for _ in range(5):
        want = 2.0 ** -want
    np.testing.assert_allclose(x.cpu().numpy(), want, rtol=1e-14)


@pytest.mark.skipif(CUDA, reason="the interpreter's setup, on a machine without a GPU")
def test_interpreter_selected_too_late_is_named():
    """TRITON_INTERPRET=1 set after triton was imported: one clear line, not Triton's error
    from inside the interpreter."""
    import subprocess
    import sys

    code = ("import os, torch, triton\n"
            "os.environ['TRITON_INTERPRET'] = '1'\n"
            "from attnflow.kernels import triton_fused\n"
            "x = torch.zeros((4, 2))\n"
            "try:\n"
            "    triton_fused.attend_tensor(x, x, x, 1.0, 'causal')\n"
            "except RuntimeError as err:\n"
            "    print(err)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert "TRITON_INTERPRET=1 was set after triton was first imported" in done.stdout, (
        done.stdout + done.stderr)


AOT = """
import subprocess, sys, tempfile, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnflow.kernels import _triton_attend as ta
from attnflow.kernels.triton_fused import _blocks, _next_power_of_2
ints = ["n", "m", "window", "blocks", "sqb", "sqn", "skb", "skn", "svb", "svn", "sxb", "sxn",
        "sob", "son"]
dump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
cases = [("fp32", 1, False, True, 2, 2), ("fp64", 1, False, True, 2, 2),
         ("fp32", 2, True, False, 3, 2)]
for dt, mask, bias, project, e, f in cases:
    dtype = torch.float32 if dt == "fp32" else torch.float64
    plain = mask != ta.WINDOW.value and not bias
    bm, bn, warps = _blocks(10**6, e, f, dtype, plain, True, None, None, None)
    const = dict(MASK=mask, HAS_BIAS=bias, PROJECT=project, E=e, F=f, FP=_next_power_of_2(f),
                 BLOCK_M=bm, BLOCK_N=bn)
    sig = {a: "*" + dt for a in ["Q", "K", "V", "X", "OUT", "BIAS", "MK", "MV", "MLOG"]}
    sig.update({a: "i32" for a in ints}, **{a: "constexpr" for a in const})
    kernel = triton.compile(ASTSource(fn=ta.attend_kernel, signature=sig, constexprs=const),
                            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
    usage = "no cuobjdump"
    if dump.exists():
        with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as out:
            out.write(kernel.asm["cubin"])
        usage = subprocess.run([str(dump), "--dump-resource-usage", out.name],
                               capture_output=True, text=True).stdout
    print(dt, mask, bias, project, "STACK:0" in usage or usage == "no cuobjdump")
"""


@pytest.mark.slow
def test_default_blocks_compile_for_sm90_without_spills():
    """The program compiles for an H100/H200 (sm_90) without a GPU, at the default blocks,
    and uses no stack (no register spills): what the interpreter cannot check. Minutes."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", AOT], capture_output=True, text=True, env=env,
                          timeout=1800)
    lines = done.stdout.split("\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert sum(line.endswith(" True") for line in lines) == 3, done.stdout


def test_attend_or_sdpa_runs_triton_without_gradients_and_sdpa_with_them():
    """auto.choose_tensor's kernel for CUDA heads of 2 to 16: the Triton kernel where no
    gradient is taken (its output has no graph), SDPA where one is (gradients as the dense
    reference's); both values equal the dense kernel's."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 12, 3))
    want = dense.attend(x, x, x, 1.5, "causal", bias=-0.2 * np.abs(
        np.arange(12)[:, None] - np.arange(12)[None, :]))
    from attnflow.kernels.options import LinearBias

    t = torch.from_numpy(x).to(DEVICE)
    out = triton_fused.attend_or_sdpa(t, t, t, 1.5, "causal", bias=LinearBias(0.2))
    assert not out.requires_grad
    np.testing.assert_allclose(out.cpu().numpy(), want, rtol=0, atol=TOL[np.float64])
    leaf = t.clone().requires_grad_(True)
    out = triton_fused.attend_or_sdpa(leaf, leaf, leaf, 1.5, "causal", bias=LinearBias(0.2))
    assert out.requires_grad
    np.testing.assert_allclose(out.detach().cpu().numpy(), want, rtol=0, atol=TOL[np.float64])
    assert not triton_fused.covers(torch.zeros(2, 12, 3), 3, 3)  # a CPU tensor: not this kernel
