"""StackedHeads: the heads' matrices as views of one stack per dtype, against the products
written out head by head; and the W6 benchmark script at a tiny size."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

import attnflow as af
from attnflow.family.heads import StackedHeads, check_head

RNG = np.random.default_rng(11)
D = 6


def mat(rows: int, cols: int = D, dtype=np.float64) -> np.ndarray:
    return RNG.standard_normal((rows, cols)).astype(dtype)


def heads_mixed() -> list[tuple]:
    """Grouped-query heads sharing K and V, an identity head, a float32 factored head and a
    three-matrix head (whose V, a square matrix, is stored in float64)."""
    K, V = mat(4), mat(3)
    raw = [(mat(4), K, V, mat(D, 3)), (mat(4), K, V, mat(D, 3)), (None, None, None),
           (mat(2, dtype=np.float32), mat(2, dtype=np.float32), mat(5, dtype=np.float32),
            mat(D, 5, np.float32)), (mat(4), mat(4), mat(D))]
    return [check_head(h, D, i) for i, h in enumerate(raw)]


def test_views_keep_values_sharing_and_dtypes():
    raw = heads_mixed()
    stacked = StackedHeads(raw)
    assert len(stacked.heads) == len(raw)
    for old, new in zip(raw, stacked.heads):
        assert len(old) == len(new)
        for a, b in zip(old, new):
            if a is None:
                assert b is None
            else:
                assert b is not a and b.dtype == a.dtype and np.array_equal(a, b)
    h = stacked.heads
    assert h[0][1] is h[1][1] and h[0][2] is h[1][2]  # grouped-query K, V stay one array
    assert h[0][0].base is h[4][2].base  # float64 Q and V: blocks of one stack
    assert h[0][0].base is not h[3][0].base  # float32 in a stack of its own
    assert len(stacked.inputs) == 2 and len(stacked.outputs) == 2


def test_project_and_combine_equal_the_products_head_by_head():
    stacked = StackedHeads(heads_mixed())
    u = RNG.standard_normal((2, 7, D))
    projected = stacked.project(u)
    distinct = {id(m): m for head in stacked.heads for m in head[:3] if m is not None}
    assert set(projected) == set(distinct)
    for key, m in distinct.items():
        want = u @ m.T
        assert projected[key].dtype == want.dtype
        np.testing.assert_allclose(projected[key], want, rtol=1e-13, atol=1e-13)
    ys = [RNG.standard_normal((2, 7, D if len(head) == 3 else head[3].shape[1]))
          for head in stacked.heads]
    want = sum(y if len(head) == 3 else y @ head[3].T for y, head in zip(ys, stacked.heads))
    np.testing.assert_allclose(stacked.combine(ys), want, rtol=1e-12, atol=1e-12)


def test_grouped_query_output_equals_unshared_copies():
    """Sharing K, V (computed once) gives what separate copies of them give."""
    K, V = mat(4), mat(3)
    Qs, Os = [mat(4) for _ in range(3)], [mat(D, 3) for _ in range(3)]
    shared = af.Attention(heads=[(Q, K, V, O) for Q, O in zip(Qs, Os)], beta=0.7,
                          norm="pre", rope=af.RoPE(100.0, "adjacent"))
    copies = af.Attention(heads=[(Q, K.copy(), V.copy(), O) for Q, O in zip(Qs, Os)],
                          beta=0.7, norm="pre", rope=af.RoPE(100.0, "adjacent"))
    x = RNG.standard_normal((3, 9, D))
    np.testing.assert_allclose(shared.field(x), copies.field(x), rtol=1e-12, atol=1e-12)


def test_w6_script_tiny(tmp_path):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "w6.py"
    spec = importlib.util.spec_from_file_location("bench_w6", path)
    w6 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w6)
    results = tmp_path / "RESULTS.md"
    text = w6.main(["--n", "24", "--alternations", "1", "--dtypes", "float64",
                    "--results", str(results)])
    assert "| float64 | 24 |" in text and "max dev. from the written-out layer 0e+00" in text
    assert results.read_text() == "\n" + text
