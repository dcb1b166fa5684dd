"""Parameter sweeps on Dask: grids of simulations into one resumable Zarr store.

A sweep runs `attnflow.simulate` for every point of a parameter grid and every seed, keeps
summary metrics over time for each run (optionally the states too), and writes them into one
Zarr store that opens as an xarray Dataset with dims (grid axes..., seed, time[, token, coord]).

The spec (a TOML file, or the same nested mapping in Python)::

    batch = 16                  # runs per task (optional; default below)
    entropy = 0                 # root of the seed tree (optional, default 0)

    [grid]                      # a list makes an axis; one value is the same for every run
    model = "stack.nc"          # optional: a saved model instead of the text options below
    beta = [-1, 4, 16]          # inverse temperature, any sign (required, unless the model has it)
    n = 32                      # tokens                                         (required)
    d = [2, 3]                  # ambient dimension >= 2     (required, unless the model has d)
    mask = "causal"             # causal | full | window:W
    Q = "identity"              # matrix presets of `attnflow.presets`: identity,
    K = "identity"              #   gaussian[:SEED], diag:l1,..,ld, orth:..., eig:..., FILE.npy
    V = ["identity", "diag:-1,-1"]
    method = "rk4"              # rk4 | euler | geodesic | dopri5 | bdf | radau | lsoda
    dt = 0.05                   # step (fixed-step methods), first step (the others)
    rtol = 1e-6                 # dopri5, bdf, radau, lsoda (ignored by fixed-step methods);
    atol = 1e-9                 #   unset: simulate's defaults
    backend = "auto"            # attention kernel (attnflow.kernels; default: Attention's)
    norm = ["post", "pre"]      # the model family (attnflow.family.text): post | pre | peri | ngpt
    alpha = 0.2                 #   nGPT's step
    attention = "softmax"       #   softmax | unnormalised | positional | sinkhorn[:IT]
    rope = "none"               #   none | BASE[:halves|adjacent[:OFFSET]]
    alibi = "none"              #   none | default | S | S1,S2,...
    noise = 0.1                 #   sigma: Euler-Maruyama (method euler or geodesic)
    t_end = 50                  # one number: all runs share the time axis        (required)
    save_at = [0, 10, 50]       # save times, a count of evenly spaced times, or "log"
    seeds = 8                   # a count (seeds 0..7) or a list of seed indices  (required)

    [keep]
    metrics = ["max_distance_to_first", "cluster_count"]   # default: DEFAULT_METRICS
    states = false              # also keep the saved states (padded with NaN to max n, d)
    cluster_tol = 0.05          # rad; default |beta|^{-1/2} / 4 per run (1e-2 when beta = 0)
    delta_scale = 4.0           # Rényi radius delta = delta_scale |beta|^-1/2 (docs/science.md §3)
    r_scale = 1.0               # consumption radius r = r_scale |beta|^-1/2 (docs/science.md §4)

``keep.metrics`` takes any of `METRICS`, the scalar entries of the analysis registry
(`attnflow.analysis.metrics.METRICS`: the energy, the cosines, the order parameter, the
counts, ...); without it a sweep keeps `DEFAULT_METRICS` (its six metrics of before the
registry). Radii are capped at pi (beta = 0 gives pi). At each save time t they use the
beta of the layer acting at t (``model.layer_at(t).beta``; a tied model has one beta).

**Models.** Without ``model``, every run builds one `attnflow.Attention` from the text options
(beta, mask, Q, K, V, backend, norm, alpha, attention, rope, alibi). ``model`` names saved
models instead (a list makes an axis; paths relative to the spec's folder; files of one kind):

* a Trajectory file (``.nc``, ``.zarr``, written by `Trajectory.save` or ``attnflow
  simulate``): the model of its record, an Attention or a `attnflow.Stack`, several heads
  included. It holds every model option, so the spec gives none of beta, mask, Q, K, V,
  backend, norm, alpha, attention, rope, alibi;
* an ``.npz`` of per-layer weights (`attnflow.family.text.layers_from_npz`): a Stack whose layers
  get the spec's beta, mask, backend, norm, alpha, attention, rope and alibi; no Q, K, V.

Every run of a grid point then integrates that one model (so its runs share batches); d
defaults to the model's, and n, d and t_end (at most the number of layers of a Stack) are
checked against every model when the spec is read. The driver reads the files (the workers
need none), and the store records a digest of each model: resuming with a changed model file
is refused.

**Seeds.** Run (grid point, seed s) draws its initial tokens (uniform on the sphere) from
``SeedSequence(entropy, spawn_key=(s, 0))`` and (models built from text) the random matrix
presets without a seed of their own from ``spawn_key=(s, 1)`` (V), ``(s, 2)`` (Q) and
``(s, 3)`` (K); with noise, the key of its Brownian path from ``(s, 4)`` (noisy runs are
integrated one by one). The stream depends on the seed coordinate only, not on the other grid
coordinates, the task it lands in, the order of execution or the number of workers: runs that
differ only in beta (say) start from the same tokens (common random numbers, for paired
comparisons), and the first n tokens of a run with more tokens are the same points. Under a
causal mask those tokens then follow the same paths too: a sweep over n holds nested runs
(the smaller ones prefixes of the larger), not independent ones; its store says so in the
attribute ``note`` (`tidy.nested_note`), and ``attnflow sweep`` prints it.

**Tables.** `to_dataframe(ds)` (`attnflow.sweeps.tidy`) gives a tidy pandas table, one row
per (grid point, seed, time), with the constant coordinates in ``df.attrs["constants"]``.

**Tasks.** The runs of one grid point are cut into blocks of `batch` consecutive seeds; a
block is one task, integrated as one batch (``(batch, n, d)`` arrays) when its runs share
their matrices, else run by run. The default batch is min(#seeds, 128, 2^22 / max(n)^2,
max(4, #seeds / 8)): big enough for the batched kernels to pay (`attnflow.kernels.auto` says
from when the fused kernel takes over), small enough for a grid point to make about 8 tasks.
It is a function of the spec only, so the partition, and with it every bit of the result,
does not depend on the cluster. (With "dopri5" the step
size is shared by the runs of a batch: every run meets the tolerance, but its steps depend on
its batch-mates.) If a batch fails, its runs are redone one by one, and a run that still
fails (a non-finite state, say) is recorded as failed with its error while the sweep goes on.

**Execution.** `scheduler=None`: a `distributed.LocalCluster` with one single-threaded
worker process per CPU (and ATTNFLOW_THREADS=1 there: one kernel thread each), listening on
127.0.0.1 only, without a dashboard unless one is asked for, its scheduler and workers
talking TLS with temporary credentials of its own (`Security.temporary()`), so that no other
process on the machine can join it or run code in its workers. An address
("tls://host:8786", with `security=` its credentials) or a `distributed.Client`: a running
cluster (``dask scheduler`` and ``dask worker``,
dask-jobqueue, ...), whose workers need attnflow installed (and ATTNFLOW_THREADS set to their
share of the cores). ``"serial"``: in this process, without Dask. Only the driver writes the
store: the workers need no access to it.

**Store and resume.** The store is created atomically with the full layout, the spec
(JSON attribute ``attnflow_sweep``) and consolidated metadata (``xarray.open_zarr`` opens it
without a warning; the layout never changes afterwards), then filled as tasks finish. Chunks
are one task's block; each finished task writes its data, then its ``status`` (0 pending, 1 done,
2 failed, with ``error`` the message), and Zarr writes every chunk atomically, so a status
other than 0 means the task is complete. Rerunning the same sweep into the same store skips
exactly the finished tasks; a worker lost mid-sweep costs only its in-flight tasks (Dask
reruns them), and a killed driver loses nothing that was recorded.

**Modules.** `attnflow.sweeps.axes` (the grid fields: checkers, defaults), `.spec` (the
spec), `.models` (a run's model), `.metrics`, `.tasks` (what a worker runs), `.store` (the
Zarr store), `.execute` (schedulers, `sweep`), `.tidy` (tables, the note on nested runs).
"""

from attnflow.sweeps.execute import SweepIncompleteError, local_cluster, sweep
from attnflow.sweeps.metrics import DEFAULT_METRICS, METRICS
from attnflow.sweeps.spec import SweepSpec, load_spec, parse_spec
from attnflow.sweeps.store import sweep_status
from attnflow.sweeps.tasks import run_task
from attnflow.sweeps.tidy import nested_note, to_dataframe

__all__ = [
    "DEFAULT_METRICS",
    "METRICS",
    "SweepIncompleteError",
    "SweepSpec",
    "load_spec",
    "local_cluster",
    "nested_note",
    "parse_spec",
    "run_task",
    "sweep",
    "sweep_status",
    "to_dataframe",
]
