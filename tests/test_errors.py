"""Every bad input gets a ValueError naming the argument, the expectation and what came."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow.sphere import uniform

X = uniform(5, 3, 0)
MODEL = af.Attention(beta=1.0)
BETA = r"beta: expected a real number or \+-inf \(beta of either sign; inf: hardmax\), received"


@pytest.mark.parametrize("kwargs,pattern", [
    ({"Q": np.eye(2), "V": np.eye(3)}, r"Q, V: expected one dimension d .*received Q of shape "
     r"\(2, 2\) \(d = 2\), V of shape \(3, 3\) \(d = 3\)"),
    # a Q with 3 columns where 2 were meant: the error is about Q's columns, not its rows
    ({"Q": np.ones((2, 3))}, r"Q: expected a square matrix: K is the identity, so the head "
     r"size e \(the rows\) must equal d = 3 \(the columns\), received .*2 rows, 3 columns"),
    ({"Q": np.ones((2, 3)), "K": np.ones((3, 3))},
     r"Q, K: expected one head size e for Q \(e, d\) and K \(e, d\)"),
    ({"Q": np.ones((3, 2)), "K": np.ones((3, 2)), "V": np.eye(3)},
     r"Q, K, V: expected one dimension d"),
    ({"memory": (np.eye(3)[:1], [1.0]), "V": np.eye(2)},
     r"V, memory: expected one dimension d .*memory of shape \(1, 3\) \(d = 3\)"),
    ({"beta": True}, BETA + r" True"),
    ({"beta": "25"}, BETA + r" '25'"),
    ({"beta": np.bool_(True)}, BETA + r" .*True"),
    ({"V": np.ones((3, 2))}, r"V: expected a \(2, 2\) matrix, received an array of shape \(3, 2\)"),
    ({"K": [[np.nan, 0], [0, 1]]}, r"K: expected finite entries, received 1 non-finite"),
    ({"beta": np.nan}, BETA + r" nan"),
    ({"beta": "hot"}, BETA + r" 'hot'"),
    ({"mask": "diagonal"},
     r"mask: expected 'causal', 'full', 'window:W', FILE.npy, \('window', w\)"),
    ({"mask": ("window", 0)}, r"mask: expected a window width 1 <= w <= 2147483647"),
    ({"mask": np.ones((3, 4), bool)}, r"mask: expected a boolean \(n, n\) array"),
    ({"combine": "max"}, r"combine: expected 'sum' or 'mean', received 'max'"),
    ({"backend": "cuda9"}, r"backend: expected one of .*received 'cuda9'"),
    ({"heads": []}, r"heads: expected a non-empty list"),
    ({"heads": [(None, None, None)], "V": np.eye(2)}, r"heads: expected None when Q, K or V"),
    ({"memory": (np.ones((1, 3)), [1.0])}, r"memory points: expected unit vectors .*off 1 by"),
    ({"memory": (np.eye(3)[:1], [0.0])}, r"memory weights: expected multiplicities > 0"),
    ({"memory": (np.eye(3)[:2], [1.0])}, r"memory weights: expected an array of shape \(2,\)"),
    ({"memory": np.eye(3)}, r"memory: expected a \(points, weights\) pair"),
])
def test_model_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        af.Attention(**kwargs)


@pytest.mark.parametrize("x0,kwargs,pattern", [
    # tokens of d = 2 and a V for d = 3: the error names V, the array that fixed d
    (X[:, :2], {"model": af.Attention(V=np.eye(3))},
     r"V: expected a matrix for d = 2, the dimension of x0 \(\.\.\., n, 2\), received shape "
     r"\(3, 3\), which makes d = 3"),
    (X[:, :2], {"model": af.Attention(heads=[(None, None, None), (np.eye(3), None, None)])},
     r"heads\[1\].Q: expected a matrix for d = 2"),
    (X[:, :2], {"model": af.Attention(memory=(np.eye(3)[:1], [1.0]))},
     r"memory: expected points for d = 2, the dimension of x0"),
    (X[0], {}, r"x0: expected an array with at least 2 dimensions"),
    (np.where(np.eye(5, 3) > 0, np.nan, X), {}, r"x0: expected finite entries, received 3 non"),
    (2 * X, {}, r"x0: expected unit vectors .*normalize=True.*off 1 by up to 1"),
    (X, {"t_end": -1.0}, r"t_end: expected a finite number >= 0, received -1.0"),
    (X, {"dt": 0.0}, r"dt: expected a finite number > 0, received 0.0"),
    (X, {"method": "rk45"}, r"method: expected one of .*'dopri5'.*received 'rk45'"),
    (X, {"rtol": 1e-6}, r"rtol/atol: expected None for the fixed-step method 'rk4'"),
    (X, {"save_at": [0.0, 2.0, 1.0]}, r"save_at: expected strictly increasing times"),
    (X, {"save_at": [0.5, 3.0]}, r"save_at: expected strictly increasing times in \[0, t_end"),
    (X, {"model": "attention"},
     r"model: expected an attnflow.Attention, Block or Stack, received str"),
])
def test_simulate_arguments(x0, kwargs, pattern):
    args = {"model": MODEL, "t_end": 1.0, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        af.simulate(args.pop("model"), x0, **args)


def test_off_sphere_tokens_are_accepted_with_normalize():
    traj = af.simulate(MODEL, 2 * X, 0.5, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(traj.final, axis=-1), 1.0, atol=1e-14)


def test_mask_array_must_match_the_number_of_tokens():
    with pytest.raises(ValueError,
                       match=r"x0: expected n = 4 tokens to match the model's \(n, n\) mask"):
        af.simulate(af.Attention(mask=np.tril(np.ones((4, 4), bool))), X, 1.0)


def test_unknown_file_kind_is_refused(tmp_path):
    traj = af.simulate(MODEL, X, 0.1)
    with pytest.raises(ValueError, match=r"path: expected a file name ending in one of"):
        traj.save(tmp_path / "run.csv")
    with pytest.raises(FileNotFoundError, match="no trajectory at"):
        af.load(tmp_path / "missing.nc")
