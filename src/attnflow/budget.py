"""What a run will cost before it starts: its peak memory and the size of its file, and the
refusal of a run over the memory budget (`simulate(..., memory_budget=)`).

The estimate (`Cost`) is the sum of

* the kept states: save times x runs x n x d x the stored dtype's bytes (`attnflow.store`;
  the first and last only, plus the summaries, with store="summaries"), held once: the
  fixed-step methods step through `CHUNK_BYTES` of save times per call into them, while the
  adaptive and implicit methods hold their own stack of the saved states as well (twice);
* the working memory of a step: the current state, the method's stage arrays (`STAGES`,
  in states), one chunk of states (fixed steps), and the peak of one field evaluation,
  measured (tracemalloc) on the first `PROBE` tokens of every run (its second evaluation:
  the first makes one-off allocations) and scaled to n (as n^2 for the dense kernel and for
  hardmax, whose scores are n x n, measured on `PROBE_QUADRATIC` tokens; as n otherwise);
  the implicit methods' (n d)^2 Jacobians.

Not counted: a process's first run loads compiled code (numba's, about 20 MB, once). The
file holds the kept states (and summaries) uncompressed. The default budget is
`BUDGET_FRACTION` of the memory available when the run starts (psutil where installed,
else the free pages os.sysconf reports).

Torch tensors are estimated the same way, with two differences: torch's allocator is not
Python's, so a field evaluation is not measured but counted as `TENSOR_FIELD_STATES` states
per head (queries, keys, values and output), a lower bound (the n x (n + m) float mask that
SDPA holds for a score bias, memory or a mask array is not counted, nor is the autograd
graph of a differentiated run, which `checkpoint=` bounds); and the default budget is
`BUDGET_FRACTION` of the memory free on the tensors' device (`torch.cuda.mem_get_info` on
CUDA, the host's available memory otherwise).
"""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._array import is_tensor
from attnflow._checks import fail
from attnflow._memory import BUDGET_FRACTION, available_memory, device_memory
from attnflow._memory import size_text as _size

__all__ = ["BUDGET_FRACTION", "CHUNK_BYTES", "EVALS", "PROBE", "PROBE_QUADRATIC", "STAGES",
           "TENSOR_FIELD_STATES", "Cost", "available_memory", "check_budget",
           "check_graph_budget", "graph_cost", "run_cost"]

CHUNK_BYTES = 64 << 20  # states a fixed-step method returns per call (simulate.chunk_times)
# Tokens per run on which the field's working memory is measured: two of the harmonic
# kernel's blocks of rows (so that the probe runs every loop the run will); n^2 kernels less.
PROBE = 8192
PROBE_QUADRATIC = 1024
# Arrays of the state's size a step holds beside the current state and one field
# evaluation (integrate.py): rk4 k1, k2, k3 and a stage during the fourth evaluation;
# geodesic also the chart's point, velocity and pulled-back field; dopri5 seven stages, the
# new state, its error and scale; Euler the new state; the implicit methods (run by run)
# scipy's few copies. Fixed-step methods add the states of one chunk (`CHUNK_BYTES`).
# Field evaluations per step of the fixed-step methods (a block in sequential form: one per
# sublayer, at most two).
EVALS = {"euler": 1, "rk4": 4, "geodesic": 4}
STAGES = {"euler": 2, "rk4": 4, "geodesic": 9, "dopri5": 11, "events": 6,
          "bdf": 4, "radau": 6, "lsoda": 4}
# States a field evaluation on tensors holds per head (q, k, v, output): not measured.
TENSOR_FIELD_STATES = 4


@dataclass(frozen=True)
class Cost:
    """The estimated cost of a run, in bytes: `memory` at its peak (`kept` states and
    summaries + `working` memory of a step) and its `file`; `save_times` kept states."""

    memory: int
    kept: int
    working: int
    file: int
    save_times: int

    def describe(self) -> str:
        return (f"peak memory about {_size(self.memory)} ({_size(self.kept)} kept for "
                f"{self.save_times} save times, {_size(self.working)} working), file about "
                f"{_size(self.file)}")


def run_cost(model: Any, x0: np.ndarray, times: np.ndarray, method: str, store: str,
             kernel: Any) -> Cost:
    """The cost (`Cost`) of integrating x0 (..., n, d) under `model` with `method`, keeping
    `store` (`attnflow.store.STORES`) at `times`, the attention computed by `kernel`."""
    from attnflow.methods import FIXED_STEP

    tensor = is_tensor(x0)
    itemsize = x0.element_size() if tensor else x0.dtype.itemsize
    runs = int(np.prod(x0.shape[:-2], dtype=int))
    n, d = x0.shape[-2:]
    state = runs * n * d * itemsize  # (an expanded tensor's steps allocate all of it)
    T = len(times)
    if store == "summaries":
        summary = T * runs * (d + 2) * 8
        kept = min(T, 2) * state + summary
        stored = kept
    else:
        stored = T * runs * n * d * (4 if store == "float32" else itemsize)
        kept = stored if method in FIXED_STEP and method != "events" else stored + 2 * T * state
    chunk = min(T, max(1, CHUNK_BYTES // max(1, state)))  # simulate.chunk_times
    stages = STAGES[method] + (chunk + 1 if method in FIXED_STEP else 0)
    field = (TENSOR_FIELD_STATES * max(len(layer.attention.heads) for layer in model.layers)
             * state if tensor else _field_peak(model, x0, kernel, method))
    working = state * (1 + stages) + field
    if method in ("bdf", "radau", "lsoda"):
        working += 3 * (n * d) ** 2 * 8  # the Jacobian, its factorisation and a copy
    return Cost(memory=kept + working, kept=kept, working=working, file=stored, save_times=T)


def _field_peak(model: Any, x0: np.ndarray, kernel: Any, method: str) -> int:
    """The peak memory of one field evaluation at x0, measured on its first `PROBE` tokens
    (all of them where the model fixes n) and scaled (module docstring)."""
    from attnflow.implicit import IMPLICIT
    from attnflow.kernels import dense

    layer = model.layers[0]
    n = x0.shape[-2]
    x = x0 if method not in IMPLICIT else x0[(0,) * (x0.ndim - 2)]
    quadratic = kernel is dense.attend or layer.attention.is_hardmax
    m = n if layer.attention.fixed_n is not None else min(
        n, PROBE_QUADRATIC if quadratic else PROBE)
    probe = np.ascontiguousarray(x[..., :m, :])
    layer.tangent_field(probe, kernel=kernel)  # first: one-off allocations (caches, imports)
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        layer.tangent_field(probe, kernel=kernel)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if not tracing:
            tracemalloc.stop()
    return int(peak * (n / m) ** (2 if quadratic else 1))


def _limit(budget: Any, device: Any = None) -> tuple[float, str]:
    """The budget in bytes and whose it is (None: `BUDGET_FRACTION` of the memory available
    on `device`, `attnflow._memory.device_memory`: a CUDA device's free memory, else the
    host's)."""
    if budget is None:
        free, where = device_memory(device)
        return (BUDGET_FRACTION * free,
                f"{BUDGET_FRACTION:.0%} of the memory {where} now, the default")
    if isinstance(budget, (bool, np.bool_)) or not isinstance(
            budget, (int, float, np.integer, np.floating)) or not budget > 0:
        raise fail("memory_budget", "a number of bytes > 0 (or None: "
                   f"{BUDGET_FRACTION:.0%} of the available memory)", repr(budget))
    return float(budget), "the budget given"


def check_budget(cost: Cost, budget: Any, runs: int, n: int, d: int, dtype: Any,
                 device: Any = None) -> None:
    """Refuse, in one line naming the cheaper choices, a run whose estimated peak memory
    exceeds `budget` (bytes; None: `BUDGET_FRACTION` of the memory available on `device`)."""
    limit, whose = _limit(budget, device)
    if cost.memory <= limit:
        return
    raise fail("memory_budget", f"a run within {_size(limit)} ({whose}; raise it with "
               "memory_budget=BYTES, --memory-budget GB on the command line)",
               f"a run of {cost.save_times} save times x {runs} run(s) x {n} tokens x d = {d} "
               f"({str(dtype).removeprefix('torch.')}) with an estimated {cost.describe()}; "
               "cheaper: "
               "fewer save times (save_at), store='float32' (half the states) or "
               "store='summaries' (moments, cluster counts, energy per save time)")


def graph_cost(field: Any, x0: Any, params: list[Any]) -> int:
    """Bytes that one evaluation of `field` at the tensor x0 leaves in torch's autograd graph
    for the backward pass: the storages of the tensors it saves (each once; x0's and the
    parameters' own not counted, they exist anyway), measured by running it once under
    `torch.autograd.graph.saved_tensors_hooks` with nothing actually kept."""
    import torch

    existing = {t.untyped_storage().data_ptr() for t in (x0, *params)}
    saved: dict[int, int] = {}

    def pack(t: Any) -> None:
        storage = t.untyped_storage()
        if storage.data_ptr() not in existing:
            saved[storage.data_ptr()] = storage.nbytes()

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None):
        field(x0 if x0.requires_grad else x0.detach().requires_grad_(True))
    return sum(saved.values())


def check_graph_budget(per_eval: int, evals: int, steps: int, kept: int, state: int,
                       budget: Any, device: Any) -> None:
    """Refuse, in one line naming the cheaper choices, backpropagation through `steps` fixed
    steps whose graph (`evals` field evaluations of `per_eval` bytes per step, `graph_cost`,
    plus the step's stage states) and `kept` bytes of saved states exceed `budget` (bytes;
    None: `BUDGET_FRACTION` of the memory available on `device`)."""
    graph = steps * (evals * per_eval + (evals + 1) * state)
    limit, whose = _limit(budget, device)
    if graph + kept <= limit:
        return
    raise fail("memory_budget", f"a run within {_size(limit)} ({whose}; raise it with "
               "memory_budget=BYTES)",
               f"backpropagation through {steps} steps holding an estimated {_size(graph)} of "
               f"autograd graph beside {_size(kept)} of states; cheaper: gradients='adjoint' "
               f"(the same gradients holding one state per step, about {_size(steps * state)})"
               " or checkpoint=STEPS (chunks recomputed in the backward pass)")

