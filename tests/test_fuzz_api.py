"""Fuzz of the Python API: bad inputs of every kind (wrong types, NaN and inf, empty, wrong
shapes, bad files, out-of-range and conflicting arguments) each end in a ValueError whose
message names the argument, never in another exception, a NaN result or a half-written file.

Each case is (call, the argument the message must name). The message format is the
package's: "<argument>: expected <what>, received <what>" (attnflow._checks.fail).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import attnflow as af
from attnflow.analysis.clusters import cluster_count
from attnflow.analysis.renyi import consumed_fraction, renyi_centers
from attnflow.explorer.pack import pack
from attnflow.presets import matrix_from_spec
from attnflow.sphere import uniform
from attnflow.sweeps import parse_spec

X = uniform(5, 2, 0)  # (5, 2) tokens on the circle
X3 = uniform(5, 3, 0)
MODEL = af.Attention(beta=1.0)
ONE_HEAD = af.Attention(beta=1.0, mask="full")
GRID = {"beta": 1.0, "n": 4, "d": 2, "t_end": 0.1, "seeds": 1}


def sim(x0=X, t_end=0.1, model=MODEL, **kwargs) -> Callable[[], object]:
    return lambda: af.simulate(model, x0, t_end, **kwargs)


def zero_token() -> np.ndarray:
    x = 2 * X.copy()
    x[3] = 0.0
    return x


CASES: list[tuple[str, Callable[[], object], str]] = [
    # ---- Attention: wrong types, non-finite and mis-shaped matrices, bad masks
    ("beta string", lambda: af.Attention(beta="hot"), "beta"),
    ("beta nan", lambda: af.Attention(beta=float("nan")), "beta"),
    ("beta inf with alibi", lambda: af.Attention(beta=np.inf, alibi=0.5), "beta"),
    ("beta None", lambda: af.Attention(beta=None), "beta"),
    ("Q with nan", lambda: af.Attention(Q=[[np.nan, 0], [0, 1]]), "Q"),
    ("K with inf", lambda: af.Attention(K=[[np.inf, 0], [0, 1]]), "K"),
    ("V not square", lambda: af.Attention(V=np.ones((2, 3))), "V"),
    ("V 1-d", lambda: af.Attention(V=np.ones(3)), "V"),
    ("V of strings", lambda: af.Attention(V=[["a", "b"], ["c", "d"]]), "V"),
    ("V complex", lambda: af.Attention(V=np.eye(2) * 1j), "V"),
    ("Q and V of different d", lambda: af.Attention(Q=np.eye(2), V=np.eye(3)), "Q, V"),
    ("mask unknown", lambda: af.Attention(mask="diagonal"), "mask"),
    ("mask window 0", lambda: af.Attention(mask=("window", 0)), "mask"),
    ("mask not square", lambda: af.Attention(mask=np.ones((3, 4), bool)), "mask"),
    ("mask of floats", lambda: af.Attention(mask=np.ones((3, 3))), "mask"),
    ("mask with an empty row", lambda: af.Attention(mask=np.zeros((3, 3), bool)).field(
        uniform(3, 2, 0)), "mask"),
    ("combine unknown", lambda: af.Attention(combine="max"), "combine"),
    ("backend unknown", lambda: af.Attention(backend="cuda9"), "backend"),
    ("heads empty", lambda: af.Attention(heads=[]), "heads"),
    ("memory weights zero", lambda: af.Attention(memory=(np.eye(3)[:1], [0.0])), "memory"),
    ("memory not a pair", lambda: af.Attention(memory=np.eye(3)), "memory"),
    ("attention_matrix head 1 of 1", lambda: ONE_HEAD.attention_matrix(X, head=1), "head"),
    ("attention_matrix head -1", lambda: ONE_HEAD.attention_matrix(X, head=-1), "head"),
    # ---- simulate: x0
    ("x0 string", sim(x0="tokens"), "x0"),
    ("x0 None", sim(x0=None), "x0"),
    ("x0 1-d", sim(x0=X[0]), "x0"),
    ("x0 no tokens", sim(x0=np.zeros((0, 2))), "x0"),
    ("x0 batch of no tokens", sim(x0=np.zeros((3, 0, 2))), "x0"),
    ("x0 with nan", sim(x0=np.where(np.eye(5, 2) > 0, np.nan, X)), "x0"),
    ("x0 with inf", sim(x0=np.where(np.eye(5, 2) > 0, np.inf, X)), "x0"),
    ("x0 off the sphere", sim(x0=2 * X), "x0"),
    ("x0 complex", sim(x0=X.astype(complex)), "x0"),
    ("x0 wrong d for V", sim(x0=X, model=af.Attention(V=np.eye(3))), "V"),
    ("x0 zero vector normalize", sim(x0=zero_token(), normalize=True), "x0"),
    ("x0 n for a fixed mask", sim(model=af.Attention(mask=np.tril(np.ones((4, 4), bool)))),
     "x0"),
    # ---- simulate: times, steps, tolerances, method, seed
    ("t_end nan", sim(t_end=float("nan")), "t_end"),
    ("t_end inf", sim(t_end=np.inf), "t_end"),
    ("t_end negative", sim(t_end=-1.0), "t_end"),
    ("t_end string", sim(t_end="long"), "t_end"),
    ("dt zero", sim(dt=0.0), "dt"),
    ("dt nan", sim(dt=float("nan")), "dt"),
    ("dt negative", sim(dt=-0.1), "dt"),
    ("bdf dt beyond the span", sim(method="bdf", dt=5.0, t_end=1.0), "dt"),
    ("rtol with rk4", sim(rtol=1e-6), "rtol"),
    ("rtol negative", sim(method="dopri5", rtol=-1e-6), "rtol"),
    ("atol inf", sim(method="dopri5", atol=np.inf), "atol"),
    ("method unknown", sim(method="rk45"), "method"),
    ("method None", sim(method=None), "method"),
    ("save_at decreasing", sim(save_at=[0.0, 0.08, 0.05]), "save_at"),
    ("save_at beyond t_end", sim(save_at=[0.0, 3.0]), "save_at"),
    ("save_at empty", sim(save_at=[]), "save_at"),
    ("save_at 2-d", sim(save_at=[[0.0, 0.05]]), "save_at"),
    ("save_at nan", sim(save_at=[0.0, np.nan]), "save_at"),
    ("seed negative", sim(seed=-1), "seed"),
    ("seed float", sim(seed=1.5), "seed"),
    ("seed string", sim(seed="0"), "seed"),
    ("seed bool", sim(seed=True), "seed"),
    ("model not a model", sim(model="attention"), "model"),
    # ---- sphere, presets, analysis
    ("uniform n negative", lambda: uniform(-1, 2, 0), "shape"),
    ("uniform d zero", lambda: uniform(3, 0, 0), "d"),
    ("preset unknown", lambda: matrix_from_spec("spiral", 2, "V"), "V"),
    ("preset wrong count", lambda: matrix_from_spec("diag:1,2,3", 2, "V"), "V"),
    ("preset nan eigenvalue", lambda: matrix_from_spec("diag:nan,1", 2, "V"), "V"),
    ("preset missing file", lambda: matrix_from_spec("missing.npy", 2, "V"), "V"),
    ("cluster tol negative", lambda: cluster_count(X, -1.0), "tol"),
    ("cluster tol above pi", lambda: cluster_count(X, 4.0), "tol"),
    ("cluster tol nan", lambda: cluster_count(X, float("nan")), "tol"),
    ("cluster X with nan", lambda: cluster_count(np.full((3, 2), np.nan), 0.1), "X"),
    ("renyi delta nan", lambda: renyi_centers(X, float("nan")), "delta"),
    ("consumed r negative", lambda: consumed_fraction(X[None], np.array([0]), -1.0), "r"),
    # ---- sweeps
    ("sweep grid not a table", lambda: parse_spec({"grid": 3}), "grid"),
    ("sweep seeds float", lambda: parse_spec({"grid": {**GRID, "seeds": 1.5}}), "grid.seeds"),
    ("sweep beta nan", lambda: parse_spec({"grid": {**GRID, "beta": float("nan")}}),
     "grid.beta"),
    ("sweep n zero", lambda: parse_spec({"grid": {**GRID, "n": 0}}), "grid.n"),
    ("sweep scheduler unknown", lambda: af.sweep(GRID, scheduler="localhost"), "scheduler"),
]

# Issue 44's fuzz findings (hangs, OverflowError, values silently misread before): each also
# answered within 10 s (test_former_hangs_are_answered_within_10_s).
BOUNDED: list[tuple[str, Callable[[], object], str]] = [
    ("t_end 2**70", sim(t_end=2**70), "t_end"),
    ("t_end 1e308", sim(t_end=1e308), "t_end"),
    ("t_end 1e308 dopri5", sim(t_end=1e308, method="dopri5"), "t_end"),
    ("t_end 1e308 bdf", sim(t_end=1e308, method="bdf"), "t_end"),
    ("dt 1e-320", sim(dt=1e-320), "dt"),
    ("dt 1e-320 with noise", sim(dt=1e-320, method="euler", noise=0.1), "dt"),
    ("save_at True", sim(save_at=True), "save_at"),
    ("save_at bool array", sim(save_at=np.array([False, True])), "save_at"),
    ("mask window 10**20", lambda: af.Attention(mask=("window", 10**20)), "mask"),
    ("mask window:1e20 text", lambda: af.Attention(mask="window:99999999999999999999"),
     "mask"),
    ("harmonic beta 1e308", lambda: af.Attention(beta=1e308, backend="harmonic").field(X3),
     "beta"),
    ("explorer basis for d 2", lambda: pack(af.simulate(MODEL, X, 0.1), basis="abc"), "basis"),
    ("animate size 100000", lambda: af.plot.animate(af.simulate(MODEL, X, 0.1), "m.gif",
                                                    size=100_000), "size"),
    ("sweep t_end 1e308", lambda: parse_spec({"grid": {**GRID, "t_end": 1e308}}),
     "grid.t_end"),
]
CASES += BOUNDED


@pytest.mark.parametrize("call, name", [pytest.param(c, n, id=i) for i, c, n in CASES])
def test_bad_input_is_a_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert re.match(rf"^[\w\[\]., /]*{re.escape(name)}[\w\[\]., /]*: expected .+, received ",
                    message), message
    assert "\n" not in message


@pytest.mark.timeout(10, func_only=True)
@pytest.mark.parametrize("call, name", [pytest.param(c, n, id=i) for i, c, n in BOUNDED])
def test_former_hangs_are_answered_within_10_s(call, name):
    with pytest.raises(ValueError, match=rf"{re.escape(name)}[\w\[\]., /]*: expected "):
        call()


def test_there_are_at_least_sixty_cases():
    assert len(CASES) >= 60 and len({i for i, _, _ in CASES}) == len(CASES)


# ---------------------------------------------------------------------------- files
def _bad_files(tmp: Path) -> dict[str, Path]:
    import xarray as xr

    corrupt = tmp / "corrupt.nc"
    corrupt.write_bytes(b"\x89HDF\r\n\x1a\n" + b"not a file" * 50)
    text = tmp / "text.nc"
    text.write_text("states = 1\n")
    foreign = tmp / "foreign.nc"
    xr.Dataset({"a": ("x", np.arange(3))}).to_netcdf(foreign, engine="h5netcdf")
    empty = tmp / "empty.zarr"
    empty.mkdir()
    store = tmp / "sweep.zarr"
    af.sweep(GRID, {"metrics": ["cluster_count"]}, out=store, scheduler="serial")
    truncated = tmp / "truncated.nc"
    af.simulate(MODEL, X, 0.1).save(truncated)
    truncated.write_bytes(truncated.read_bytes()[:2000])
    return {"corrupt": corrupt, "text": text, "foreign": foreign, "empty": empty,
            "sweep store": store, "truncated": truncated}


def test_loading_what_is_not_a_run_names_the_file(tmp_path):
    for kind, path in _bad_files(tmp_path).items():
        with pytest.raises(ValueError, match=rf"^path: expected a run written by attnflow .*"
                           rf"received {re.escape(str(path))}") as info:
            af.load(path)
        assert "\n" not in str(info.value), kind
    with pytest.raises(ValueError, match=r"received .*sweep\.zarr, a sweep store"):
        af.load(tmp_path / "sweep.zarr")


def test_a_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    traj = af.simulate(MODEL, X, 0.1)
    target = tmp_path / "run.nc"
    traj.save(target)
    before = target.read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    import xarray as xr

    monkeypatch.setattr(xr.Dataset, "to_netcdf", broken)
    with pytest.raises(OSError, match="disk full"):
        traj.save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.nc"]  # no temporaries
    assert target.read_bytes() == before  # the old file is intact


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def test_outputs_get_the_usual_permissions(tmp_path, umask_027):
    """Atomically written outputs get 0666/0777 less the umask (0640/0750 under umask 027),
    not the 0600/0700 of a temporary file or folder."""
    import matplotlib.pyplot as plt

    from attnflow._files import atomic_path, write_text
    from attnflow.experiments._recipe import save_figure
    from attnflow.plot import animate
    from attnflow.report import write_report

    traj = af.simulate(MODEL, X, 0.1)
    fig = plt.figure()
    save_figure(fig, tmp_path, "figure.png")
    plt.close(fig)
    with atomic_path(tmp_path / "recipe") as folder:  # as reproduce writes a recipe's folder
        folder.mkdir()
        write_text(folder / "result.json", "{}")
    files = [traj.save(tmp_path / "run.nc"), animate(traj, tmp_path / "movie.gif", frames=2,
                                                     size=64),
             tmp_path / "figure.png", tmp_path / "recipe" / "result.json",
             *write_report([], tmp_path / "report")]
    folders = [traj.save(tmp_path / "run.zarr"), tmp_path / "recipe"]
    af.sweep(GRID, {"metrics": ["cluster_count"]}, out=tmp_path / "sweep.zarr",
             scheduler="serial")
    folders.append(tmp_path / "sweep.zarr")
    for path in files:
        assert oct(path.stat().st_mode & 0o777) == oct(0o640), path
    for path in folders:
        assert oct(path.stat().st_mode & 0o777) == oct(0o750), path
        inner = [p for p in path.rglob("*") if p.is_file()]
        assert inner and all(p.stat().st_mode & 0o777 == 0o640 for p in inner), path
    assert not [p for p in tmp_path.rglob(".*")]  # no temporaries left


# ---------------------------------------------------------------------------- lead's fixes
def test_numpy_integer_seeds_are_recorded_as_ints(tmp_path):
    traj = af.simulate(MODEL, X, 0.1, seed=np.int64(7))
    assert type(traj.seed) is int and traj.seed == 7
    assert af.load(traj.save(tmp_path / "run.nc")).seed == 7


def test_float32_tokens_from_uniform_are_on_the_sphere():
    traj = af.simulate(MODEL, X3.astype(np.float32), 0.5)
    assert traj.states.dtype == np.float32 and np.isfinite(traj.states).all()
    np.testing.assert_allclose(np.linalg.norm(traj.final, axis=-1), 1.0, atol=1e-6)


def test_a_mask_row_without_keys_is_fine_with_memory_tokens():
    memory = (np.array([[1.0, 0.0]]), np.array([2.0]))
    field = af.Attention(mask=np.zeros((3, 3), bool), memory=memory).field(X[:3])
    assert np.isfinite(field).all() and np.abs(field).max() > 0


@pytest.mark.parametrize("beta", [0.0, 1e-300, 1e8, 1e308])
@pytest.mark.parametrize("method", ["rk4", "dopri5", "bdf"])
def test_extreme_but_valid_settings_stay_finite(beta, method):
    """No NaN from valid input: softmax at beta = 1e8 (scores up to 1e8), 1e308 (beyond the
    harmonic kernel's truncation, which auto leaves for one that takes it) or ~0."""
    traj = af.simulate(af.Attention(beta=beta), X3, 0.5, method=method)
    assert np.isfinite(traj.states).all()
    np.testing.assert_allclose(np.linalg.norm(traj.states, axis=-1), 1.0, atol=1e-8)


@pytest.mark.parametrize("method", ["bdf", "radau", "lsoda"])
def test_implicit_blow_up_is_a_non_finite_state_error(method):
    huge = af.Attention(V=np.diag([1e308, 1e308]), beta=1.0)
    with pytest.raises(af.NonFiniteStateError, match=r"non-finite at t = "), \
            np.errstate(all="ignore"):
        af.simulate(huge, X, 1.0, method=method)


# ---------------------------------------------------------------------------- generated
# Every integer, size and shape argument of the API, given values of the wrong kind, below its
# range and (for sizes) beyond any memory: a ValueError of one line naming the argument.
# (call taking the value, the argument named, whether a huge value is bad: sizes are, seeds
# are not). The checks: attnflow._checks.integer, attnflow._memory.check_allocation.
TRAJ = af.simulate(MODEL, X, 0.1)
DENSITY = af.meanfield.from_function(lambda th: 1.0 + 0.5 * np.cos(th), modes=8)


def _flat(th):
    return 1.0 + 0.0 * th


INTEGER_ARGS: list[tuple[str, Callable[[object], object], str, bool]] = [
    ("uniform n", lambda v: uniform(v, 2, 0), "shape", True),
    ("uniform batch", lambda v: uniform((v, 3), 2, 0), "shape", True),
    ("uniform d", lambda v: uniform(3, v, 0), "d", True),
    ("simulate seed", lambda v: af.simulate(MODEL, X, 0.1, seed=v), "seed", False),
    ("simulate noise seed", lambda v: af.simulate(MODEL, X, 0.1, method="euler", noise=0.1,
                                                  seed=v), "seed", False),
    ("window", lambda v: af.Attention(mask=("window", v)), "mask", True),
    ("preset d", lambda v: matrix_from_spec("gaussian", v, "V"), "d", True),
    ("preset seed", lambda v: matrix_from_spec(f"gaussian:{v}", 2, "V"), "V", False),
    ("mlp width", lambda v: af.family.MLP.random(2, v), "width", True),
    ("log_times num", lambda v: af.log_times(1.0, v), "num", True),
    ("from_function modes", lambda v: af.meanfield.from_function(_flat, modes=v), "modes",
     True),
    ("from_function modes S^2", lambda v: af.meanfield.from_function(
        lambda x: 1.0 + 0.0 * x[..., 0], modes=v, d=3), "modes", True),
    ("from_function modes S^4", lambda v: af.meanfield.from_function(_flat, modes=v, d=5),
     "modes", True),
    ("from_function labels", lambda v: af.meanfield.from_function(
        lambda s, th: 1.0 + 0.0 * s * th, modes=8, labels=v), "labels", True),
    ("from_function d", lambda v: af.meanfield.from_function(_flat, modes=8, d=v), "d", False),
    ("from_tokens modes", lambda v: af.meanfield.from_tokens(X, v, 0.3), "modes", True),
    ("sample n", lambda v: af.meanfield.sample(DENSITY, v), "n", True),
    ("solve refine_to", lambda v: af.meanfield.solve(af.Attention(beta=1.0, mask="full"),
                                                     DENSITY, 0.1, refine_to=v),
     "refine_to", True),
    ("animate frames", lambda v: af.plot.animate(TRAJ, "m.gif", frames=v), "frames", True),
    ("animate size", lambda v: af.plot.animate(TRAJ, "m.gif", size=v), "size", True),
    ("pack run", lambda v: pack(TRAJ, run=v), "run", True),
    ("sweep workers", lambda v: af.sweep(GRID, workers=v), "workers", True),
    ("sweep seeds", lambda v: parse_spec({"grid": {**GRID, "seeds": v}}), "grid.seeds", True),
    ("checkpoint", lambda v: af.simulate(MODEL, _tensor(X), 0.1, checkpoint=v), "checkpoint",
     False),
]
BAD_INTEGERS = {"text": "abc", "float": 2.5, "integral float": 3.0, "bool": True,
                "negative": -1, "numpy float": np.float64(3.0)}
HUGE_INTEGERS = {"2**63": 2**63, "10**30": 10**30}


def _tensor(a):
    import torch

    return torch.as_tensor(a)


def _integer_cases():
    for label, call, name, size in INTEGER_ARGS:
        bad = {**BAD_INTEGERS, **(HUGE_INTEGERS if size else {})}
        for kind, value in bad.items():
            yield pytest.param(lambda call=call, value=value: call(value), name,
                               id=f"{label} {kind}")


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("call, name", list(_integer_cases()))
def test_generated_bad_integers_name_the_argument(call, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pytest.importorskip("torch")
    test_bad_input_is_a_value_error_naming_the_argument(call, name)
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_integer_generator_covers_sizes_and_seeds():
    assert len(INTEGER_ARGS) >= 20
    assert {size for *_, size in INTEGER_ARGS} == {True, False}


# Tensors: every tensor slot of a run (tokens, each matrix, memory, beta, the device) given
# a tensor of each kind that no kernel runs (no storage, an unaccepted dtype): one line naming
# the slot. Tokens are float32 or float64, as arrays (numba) and as tensors.
def _tensor_cases():
    torch = pytest.importorskip("torch")
    x = torch.as_tensor(X)
    kinds = {"meta": lambda t: t.to("meta"), "int64": lambda t: t.to(torch.int64),
             "complex": lambda t: t.to(torch.complex128)}
    tokens = {**kinds, "bfloat16": lambda t: t.to(torch.bfloat16),
              "float16": lambda t: t.to(torch.float16)}
    eye = torch.eye(2, dtype=torch.float64)
    slots = {"x0": (tokens, lambda v: af.simulate(MODEL, v, 0.1, dt=0.05), x),
             "Q": (kinds, lambda v: af.Attention(Q=v), eye),
             "K": (kinds, lambda v: af.Attention(K=v), eye),
             "V": (kinds, lambda v: af.Attention(V=v), eye),
             "memory points": (kinds, lambda v: af.Attention(memory=(v, np.ones(1))), eye[:1]),
             "memory weights": (kinds, lambda v: af.Attention(memory=(np.eye(2)[:1], v)),
                                torch.ones(1, dtype=torch.float64)),
             "beta": (kinds, lambda v: af.Attention(beta=v), torch.tensor(1.0,
                                                                          dtype=torch.float64))}
    for slot, (bad, call, good) in slots.items():
        for kind, make in bad.items():
            yield pytest.param(lambda call=call, make=make, good=good: call(make(good)), slot,
                               id=f"{slot} {kind}")
    yield pytest.param(lambda: af.simulate(MODEL, X.astype(np.float16), 0.1), "x0",
                       id="x0 numpy float16")  # (numba has no float16)
    for device in ("meta", "cuda:7", "xpu", "tpu", "nonsense", 3.5):
        yield pytest.param(lambda device=device: af.simulate(MODEL, X, 0.1, device=device),
                           "device", id=f"device {device}")


@pytest.mark.parametrize("call, name", list(_tensor_cases()))
def test_tensors_no_kernel_runs_are_refused_naming_the_slot(call, name):
    test_bad_input_is_a_value_error_naming_the_argument(call, name)


def test_the_token_dtype_message_lists_what_runs():
    torch = pytest.importorskip("torch")
    for dtype in (torch.int64, torch.bfloat16):
        with pytest.raises(ValueError, match=r"x0: expected float32 or float64 tokens"):
            af.simulate(MODEL, torch.as_tensor(X).to(dtype), 0.1)
    for dtype in (torch.float32, torch.float64):  # and what it lists runs
        run = af.simulate(MODEL, torch.as_tensor(X).to(dtype), 0.1)
        assert run.states.dtype == dtype and bool(torch.isfinite(run.states).all())


def test_an_expanded_tensor_is_refused_by_the_budget_before_its_values_are_read():
    """10^8 tokens that hold 2 numbers: the same refusal as numpy's, at once (checking the
    values first costs isfinite over 2 x 10^8 entries: 1.7 s on a quiet 2-core machine,
    about 14 s under load)."""
    torch = pytest.importorskip("torch")
    import time

    x = torch.tensor([[1.0, 0.0]], dtype=torch.float64).expand(10**8, 2)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"^memory_budget: expected a run within .* 101 save "
                       r"times x 1 run\(s\) x 100000000 tokens x d = 2 \(float64\)"):
        af.simulate(MODEL, x, 1.0, save_at=np.linspace(0, 1, 101), memory_budget=1e9)
    assert time.perf_counter() - start < 5


def test_a_tensor_run_is_estimated_like_the_numpy_run():
    """The kept states are the same bytes (101 save times x n x d x 8); the working memory a
    formula (4 states per head, `budget.TENSOR_FIELD_STATES`), not measured."""
    torch = pytest.importorskip("torch")
    from attnflow.budget import STAGES, TENSOR_FIELD_STATES

    times = np.linspace(0, 1, 11)
    x = uniform((3, 50), 2, 0)
    cpu = af.estimate_run(MODEL, x, 1.0, save_at=times)
    tensor = af.estimate_run(MODEL, torch.as_tensor(x), 1.0, save_at=times)
    state = 3 * 50 * 2 * 8
    assert cpu.kept == tensor.kept == 11 * state and cpu.file == tensor.file
    chunk = 11  # every save time in one chunk (budget.CHUNK_BYTES)
    assert tensor.working == state * (1 + STAGES["rk4"] + chunk + 1 + TENSOR_FIELD_STATES)


def test_cuda_tensors_are_budgeted_against_the_device_free_memory(monkeypatch):
    """The rule for CUDA tensors with a stubbed free-memory figure (no CUDA here): the default
    budget is 80% of torch.cuda.mem_get_info's free bytes of that device."""
    from attnflow import _memory
    from attnflow.budget import Cost, check_budget

    asked = []
    monkeypatch.setattr(_memory, "_cuda_free", lambda device: asked.append(device) or 10**9)
    fits = Cost(memory=int(0.79e9), kept=0, working=int(0.79e9), file=0, save_times=2)
    check_budget(fits, None, 1, 10, 2, "torch.float32", device="cuda:1")
    over = Cost(memory=int(0.81e9), kept=0, working=int(0.81e9), file=0, save_times=2)
    with pytest.raises(ValueError, match=r"^memory_budget: expected a run within 800 MB \(80% "
                       r"of the memory free on cuda:1 now, the default.*\(float32\)"):
        check_budget(over, None, 1, 10, 2, "torch.float32", device="cuda:1")
    assert asked == ["cuda:1", "cuda:1"]
    check_budget(over, None, 1, 10, 2, "float64")  # the host's memory for numpy runs


@pytest.mark.parametrize("tensor_run", [False, True])
@pytest.mark.parametrize("mask", ["causal", "window", "random"])
def test_a_torch_boolean_mask_runs_as_its_numpy_twin(mask, tensor_run):
    torch = pytest.importorskip("torch")
    n = 5
    allowed = {"causal": np.tril(np.ones((n, n), bool)),
               "window": np.tril(np.ones((n, n), bool)) & ~np.tril(np.ones((n, n), bool), -2),
               "random": np.random.default_rng(0).random((n, n)) < 0.6
               }[mask] | np.eye(n, dtype=bool)
    x0 = torch.as_tensor(X) if tensor_run else X
    twin = af.simulate(af.Attention(beta=2.0, mask=allowed), x0, 0.5)
    run = af.simulate(af.Attention(beta=2.0, mask=torch.as_tensor(allowed)), x0, 0.5)
    assert np.array_equal(af._array.to_numpy(run.states), af._array.to_numpy(twin.states))
    if mask == "causal":  # and the causal mask's own run, by name
        named = af.simulate(af.Attention(beta=2.0, mask="causal"), x0, 0.5)
        np.testing.assert_allclose(af._array.to_numpy(run.states),
                                   af._array.to_numpy(named.states), atol=1e-12)


def test_a_torch_mask_of_other_kinds_is_refused():
    torch = pytest.importorskip("torch")
    for bad in (torch.ones(3, 3), torch.ones(3, 4, dtype=torch.bool),
                torch.ones(3, 3, dtype=torch.bool, device="meta")):
        with pytest.raises(ValueError, match=r"^mask: expected .*, received "):
            af.Attention(mask=bad)


# Movies: fps that a frame delay can hold (GIF: 2 to 65535 centiseconds; MP4: <= 240).
@pytest.mark.parametrize("fps, suffix", [(1e308, ".gif"), (51.0, ".gif"), (1e-3, ".gif"),
                                         (0.0, ".gif"), (float("nan"), ".gif"),
                                         (float("inf"), ".mp4"), (241.0, ".mp4"),
                                         ("12", ".gif"), (True, ".gif")])
def test_fps_no_frame_delay_holds_is_refused(fps, suffix, tmp_path):
    with pytest.raises(ValueError, match=r"^fps: expected frames per second in \[0.001526, "):
        af.plot.animate(TRAJ, tmp_path / f"m{suffix}", fps=fps, frames=2, size=64)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("fps", [50.0, 12.0, 100 / 65535])
def test_a_gif_holds_the_delay_of_its_fps(fps, tmp_path):
    from PIL import Image

    path = af.plot.animate(TRAJ, tmp_path / "m.gif", fps=fps, frames=2, size=64)
    with Image.open(path) as gif:
        delay_ms = gif.info["duration"]  # read back from the file (centiseconds x 10)
    assert delay_ms == 10 * round(100 / fps)
