"""Packing a run for the explorer: quantised frames in base64 plus what the page shows beside
them (times, the model, cluster counts, the order parameter, Rényi centers).

The frames are uint16, little-endian, one array of shape (T, n, k), base64 in JSON:

* circle (d = 2): k = 1, the angle theta = atan2(x2, x1) as q = round((theta + pi) / STEP)
  mod 65536 with STEP = 2 pi / 65536; decoded as q STEP - pi, off by at most STEP / 2 =
  4.8e-5 rad (`ANGLE_ERROR`).
* sphere (d >= 3): k = 3, coordinates in [-1, 1] as q = round((x + 1) / 2 * 65535); decoded
  as 2 q / 65535 - 1, off by at most 1 / 65535 = 1.5e-5 per coordinate (`COORD_ERROR`). For
  d > 3 the token directions are projected onto three directions first
  (`attnflow.plot.frame`, default the top principal directions) and lie inside the ball.

So a frame takes 2 n k bytes, 8/3 n k characters of base64: 1000 tokens x 3 coordinates x 200
frames are 1.2 MB of frames, 1.6 MB of text.

Above `DENSITY_N` tokens (or with density=True) a frame is stored as a binned density instead
of points, so that a page of 10^6 tokens is drawn and stays small ("density"; "frames" is
empty):

* circle: counts of tokens in `CIRCLE_BINS` equal arcs of the angle, bin b = floor((theta +
  pi) / (2 pi) * CIRCLE_BINS): uint32 (T, CIRCLE_BINS), 4 kB a frame;
* sphere: counts of the drawn directions (x, y, z) (for d > 3 the directions of the
  projections) in equal-area cells: `SPHERE_BANDS` bands of equal height in z times
  `SPHERE_SECTORS` sectors of the azimuth phi = atan2(y, x), cell (b, s) with b = floor((z +
  1) / 2 * BANDS), s = floor((phi + pi) / (2 pi) * SECTORS): uint32 (T, BANDS, SECTORS), 32 kB
  a frame.

`unpack_density` decodes them. Cluster counts and Rényi centers are left out of such pages
(None): single linkage over 10^6 tokens is too slow to pack and chains through dense tokens.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from attnflow._array import to_numpy
from attnflow._checks import fail, integer
from attnflow.analysis.clusters import default_cluster_tol, length_scale
from attnflow.analysis.metrics import evaluate_metric
from attnflow.analysis.renyi import renyi_centers, strong_renyi_centers
from attnflow.plot import frame
from attnflow.trajectory import Trajectory

__all__ = ["ANGLE_ERROR", "CIRCLE_BINS", "COORD_ERROR", "DENSITY_N", "FORMAT", "SERIES",
           "SPHERE_BANDS", "SPHERE_SECTORS", "VIEWS", "pack", "unpack", "unpack_density"]

FORMAT = "attnflow-explorer/1"
VIEWS = ("circle", "sphere")
# The series panels: their key in a packed run -> the registry entry they draw
# (`attnflow.analysis.metrics.METRICS`).
SERIES = {"clusters": "cluster_count", "order": "order_parameter"}
_LEVELS = 65536
ANGLE_STEP = 2 * np.pi / _LEVELS
ANGLE_ERROR = ANGLE_STEP / 2  # rad: the largest error of a decoded angle
COORD_ERROR = 1 / (_LEVELS - 1)  # the largest error of a decoded coordinate in [-1, 1]
ATTENTION_MAX_N = 400  # the page computes the attention matrix for at most this many tokens
DENSITY_N = 20_000  # above this many tokens a page stores binned densities, not points
CIRCLE_BINS = 1024  # arcs of the circle's density
SPHERE_BANDS, SPHERE_SECTORS = 64, 128  # equal-area cells of the sphere's density: z x phi


def view_for(d: int, view: str | None) -> str:
    """The view of tokens of dimension d: "circle" for d = 2, "sphere" for d >= 3 (default),
    or an error naming `view` when it does not fit the data."""
    if view is None:
        return "circle" if d == 2 else "sphere"
    if view not in VIEWS:
        raise fail("view", f"one of {', '.join(VIEWS)} (or None: by dimension)", repr(view))
    if (view == "circle") != (d == 2):
        need = "d = 2 (tokens on the circle)" if view == "circle" else "d >= 3"
        raise fail("view", f"a view that fits the run ('{view}' needs {need}; this run has "
                   f"d = {d}: use '{view_for(d, None)}')", repr(view))
    return view


def pack(traj: Trajectory, *, run: int = 0, view: str | None = None,
         basis: Any = None, density: bool | None = None) -> dict[str, Any]:
    """Everything the explorer page shows of one run, as JSON-friendly data.

    traj : a Trajectory; its token directions x / |x| are shown (the states on the sphere).
    run : which run of a batch.
    view : "circle" (d = 2) or "sphere" (d >= 3); default by the dimension.
    basis : for d > 3, the three directions to project onto (see `attnflow.plot.frame`;
        default the top principal directions of all frames); None for the circle view.
    density : None (binned densities above `DENSITY_N` tokens, points up to it), True
        (densities), False (points, whatever n).

    Returns a dict with: format, view, n, d, k (coordinates per token: 1 or 3), frames
    (base64 of uint16 (T, n, k), see the module docstring), times (T,), beta (T,) and tol
    (T,) (the layer acting at each time, and the package's default cluster tolerance for
    it, radians), clusters (T,) (single-linkage cluster counts at tol, computed on the
    unquantised directions in R^d), order (T,) (|mean x|, the order parameter, in [0, 1])
    (these two series are the registry's entries named in `SERIES`),
    causal (bool), mask (text), model (its short repr), projection ("" or how d > 3 was
    projected), renyi and strong (token indices of the Rényi and strong Rényi centers of the
    first frame at delta = 4 |beta|^{-1/2}, causal runs only, else None), delta, and attention
    (None, or {"M": (d, d) matrix, "causal": bool}: the page computes the attention matrix
    softmax_j(beta x_i^T M x_j) of a frame, which equals the model's for n <= 400 tokens of
    a single plain layer; checked against the model on the first frame), and density (None,
    or the binned densities of the module docstring: {"kind": "circle", "bins", "counts"} or
    {"kind": "sphere", "bands", "sectors", "counts"}, counts base64 uint32; then frames is
    "", and clusters, renyi and strong are None).
    """
    if not isinstance(traj, Trajectory):
        raise TypeError(f"traj: expected an attnflow.Trajectory, received {type(traj).__name__}")
    X = _one_run(traj, run)
    if not np.all(np.isfinite(X)):
        raise fail("traj", "finite token positions", "non-finite entries")
    view = view_for(traj.d, view)
    if density not in (None, True, False):
        raise fail("density", "None (by n), True or False", repr(density))
    dense = traj.n > DENSITY_N if density is None else density
    times = np.asarray(traj.times, dtype=float)
    layers = [traj.model.layer_at(float(t)) for t in times]
    beta = np.array([float(layer.beta) for layer in layers])
    tol = np.array([default_cluster_tol(b) for b in beta])
    order = evaluate_metric(SERIES["order"], X)
    projection, binned, frames = "", None, ""
    if view == "circle":
        if basis is not None:
            raise fail("basis", "None for the circle view (d = 2 tokens are drawn as they "
                       "are)", repr(basis))
        theta = np.arctan2(X[..., 1], X[..., 0])
        if dense:
            binned = _circle_density(theta)
        else:
            frames = _b64((np.round((theta + np.pi) / ANGLE_STEP) % _LEVELS)[..., None], "<u2")
    else:
        fr = frame(traj, X, 3, basis)
        projection = fr.note
        P = np.clip(fr(X), -1.0, 1.0)
        if dense:
            binned = _sphere_density(P)
        else:
            frames = _b64(np.round((P + 1.0) / 2.0 * (_LEVELS - 1)), "<u2")
    causal = bool(traj.model.is_causal) and not dense
    delta = min(float(np.pi), 4.0 * length_scale(beta[0]))  # pi at beta = 0 and +-inf
    return {
        "format": FORMAT, "view": view, "n": traj.n, "d": traj.d, "k": 1 if view == "circle" else 3,
        "frames": frames, "density": binned,
        "times": times.tolist(), "tol": tol.tolist(),
        "beta": [b if np.isfinite(b) else None for b in beta.tolist()],  # null: hardmax
        "clusters": None if dense else
        [int(evaluate_metric(SERIES["clusters"], X[i:i + 1], tol=tol[i])[0])
         for i in range(len(times))],
        "order": order.tolist(),
        "causal": bool(traj.model.is_causal), "mask": str(getattr(layers[0], "mask", "")),
        "model": repr(traj.model), "projection": projection, "delta": float(delta),
        "renyi": renyi_centers(X[0], delta).tolist() if causal else None,
        "strong": strong_renyi_centers(X[0], delta).tolist() if causal else None,
        "attention": None if dense else _attention(traj, X[0], projection),
    }


def _b64(a: np.ndarray, dtype: str = "<u4") -> str:
    """Base64 of an array of whole numbers as little-endian dtype (default uint32)."""
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


def _circle_density(theta: np.ndarray) -> dict[str, Any]:
    """Counts of the angles theta (T, n) in CIRCLE_BINS equal arcs of [-pi, pi)."""
    b = np.floor((theta + np.pi) / (2 * np.pi) * CIRCLE_BINS).astype(np.int64) % CIRCLE_BINS
    counts = np.stack([np.bincount(row, minlength=CIRCLE_BINS) for row in b])
    return {"kind": "circle", "bins": CIRCLE_BINS, "counts": _b64(counts)}


def _sphere_density(P: np.ndarray) -> dict[str, Any]:
    """Counts of the directions of P (T, n, 3) in SPHERE_BANDS x SPHERE_SECTORS equal-area
    cells (bands of z, sectors of the azimuth); a zero projection counts as z = 0, phi = 0."""
    length = np.linalg.norm(P, axis=-1)
    z = np.divide(P[..., 2], length, out=np.zeros_like(length), where=length > 0)
    band = np.clip(np.floor((z + 1.0) / 2.0 * SPHERE_BANDS), 0, SPHERE_BANDS - 1)
    sector = np.floor((np.arctan2(P[..., 1], P[..., 0]) + np.pi) / (2 * np.pi) * SPHERE_SECTORS)
    cell = (band * SPHERE_SECTORS + sector % SPHERE_SECTORS).astype(np.int64)
    counts = np.stack([np.bincount(row, minlength=SPHERE_BANDS * SPHERE_SECTORS) for row in cell])
    return {"kind": "sphere", "bands": SPHERE_BANDS, "sectors": SPHERE_SECTORS,
            "counts": _b64(counts)}


def unpack(packed: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The times (T,) and decoded frames of `pack`'s output: (T, n, 2) points on the circle
    (each decoded angle within `ANGLE_ERROR` of the original) or (T, n, 3) coordinates
    (each within `COORD_ERROR` of the original, or of its projection for d > 3)."""
    if not isinstance(packed, dict) or packed.get("format") != FORMAT:
        raise fail("packed", f"a dict made by attnflow.explorer.pack (format {FORMAT!r})",
                   f"format {packed.get('format') if isinstance(packed, dict) else packed!r}")
    times = np.asarray(packed["times"], dtype=float)
    if packed.get("density") is not None:
        raise fail("packed", "a packed run holding points", "one holding binned densities "
                   f"(n = {packed['n']} > {DENSITY_N} or density=True: see unpack_density)")
    q = np.frombuffer(base64.b64decode(packed["frames"]), dtype="<u2").astype(float)
    q = q.reshape(len(times), packed["n"], packed["k"])
    if packed["view"] == "circle":
        theta = q[..., 0] * ANGLE_STEP - np.pi
        return times, np.stack([np.cos(theta), np.sin(theta)], axis=-1)
    return times, 2.0 * q / (_LEVELS - 1) - 1.0


def unpack_density(packed: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The times (T,) and token counts of `pack`'s binned densities: (T, CIRCLE_BINS) per arc
    on the circle, (T, SPHERE_BANDS, SPHERE_SECTORS) per cell on the sphere (bands of z,
    sectors of the azimuth); each frame's counts sum to n."""
    dens = packed.get("density") if isinstance(packed, dict) else None
    if dens is None:
        raise fail("packed", "a packed run holding binned densities (pack with density=True "
                   f"or more than {DENSITY_N} tokens)", "one holding points")
    times = np.asarray(packed["times"], dtype=float)
    counts = np.frombuffer(base64.b64decode(dens["counts"]), dtype="<u4").astype(np.int64)
    if dens["kind"] == "circle":
        return times, counts.reshape(len(times), dens["bins"])
    return times, counts.reshape(len(times), dens["bands"], dens["sectors"])


def _one_run(traj: Trajectory, run: int) -> np.ndarray:
    """The token directions (T, n, d) of one run of the batch (a host copy of a run on torch
    tensors)."""
    X = to_numpy(traj.directions).reshape(len(traj.times), -1, traj.n, traj.d)
    integer("run", run, 0, X.shape[1] - 1, expected=f"a run index in [0, {X.shape[1]})")
    return X[:, run]


def _attention(traj: Trajectory, X0: np.ndarray, projection: str) -> dict[str, Any] | None:
    """{"M", "causal"} when softmax_j(beta x_i^T M x_j) under a causal or full mask is the
    model's attention matrix (one layer, one head, no memory; checked on the first frame
    X0 (n, d)), for n <= ATTENTION_MAX_N tokens drawn unprojected; else None."""
    layers = traj.model.layers
    if (projection or traj.n > ATTENTION_MAX_N or len(layers) != 1 or len(layers[0].heads) != 1
            or not np.isfinite(layers[0].beta)):  # hardmax: no softmax matrix to draw
        return None
    layer = layers[0]
    Q, K = (np.eye(traj.d) if M is None else np.asarray(M, dtype=float)
            for M in layer.heads[0][:2])
    M = Q.T @ K
    causal = bool(traj.model.is_causal)
    scores = float(layer.beta) * X0 @ M @ X0.T
    if causal:
        scores = np.where(np.tri(traj.n, dtype=bool), scores, -np.inf)
    A = np.exp(scores - scores.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    try:
        model_A = np.asarray(layer.attention_matrix(X0), dtype=float)
    except (ValueError, TypeError, AttributeError):
        return None
    if model_A.shape != A.shape or not np.allclose(model_A, A, rtol=1e-6, atol=1e-9):
        return None
    return {"M": M.tolist(), "causal": causal}
