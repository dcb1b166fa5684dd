"""A sweep's results as a tidy table, and the note a sweep over n carries.

`to_dataframe(ds)`: one row per (grid point, seed, time), one column per grid axis and per
metric (and the run's status); the coordinates that take one value (the grid fields given as
one value, axes of length one) go to ``df.attrs["constants"]`` instead of a dozen constant
columns. xarray's own ``ds.to_dataframe()`` repeats each of them in every row.

`nested_note(spec)`: runs of one seed start from the same first tokens for every n (the
`attnflow.sweeps` docstring, Seeds), and under a causal mask those tokens also follow the
same paths: a sweep over n holds nested runs, not independent ones. The store's attribute
``note`` and ``attnflow sweep`` say so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow._checks import fail
from attnflow.kernels.masks import is_lower_triangular, mask_from_text

if TYPE_CHECKING:
    import pandas as pd
    import xarray as xr

    from attnflow.sweeps.spec import SweepSpec

__all__ = ["NOTE_ATTR", "nested_note", "to_dataframe"]

NOTE_ATTR = "note"
_SHARED = ("Runs of one seed share their first tokens across n: the first n tokens of a run "
           "with more tokens are the same points (common random numbers).")
_NESTED = (" Under a causal mask token k sees tokens 1..k only, so those tokens also follow "
           "the same paths: a run with fewer tokens is the prefix of a run with more (nested "
           "runs), not an independent sample.")


def nested_note(spec: SweepSpec) -> str | None:
    """The note for a sweep with an n axis (module docstring), None without one."""
    if len(spec.values("n")) < 2:
        return None
    if spec.models:
        causal = any(model.is_causal for model in spec.models.values())
    else:
        causal = any(is_lower_triangular(mask_from_text(m or "causal"))
                     for m in spec.values("mask"))
    return _SHARED + (_NESTED if causal else "")


def to_dataframe(ds: xr.Dataset, variables: list[str] | None = None) -> pd.DataFrame:
    """The tidy table of a sweep's Dataset (module docstring).

    ds : what `attnflow.sweeps.sweep` returns (or ``xarray.open_zarr`` of its store).
    variables : the metrics to tabulate (default: every variable on the time axis but the
        states, which are a table of their own: ``ds.states.to_dataframe()``).
    Returns a pandas DataFrame with a plain index; ``attrs["constants"]`` holds the dropped
    coordinates {name: value}, ``attrs["note"]`` the sweep's note when it has one.
    """
    names = variables if variables is not None else \
        [v for v in ds.data_vars if "time" in ds[v].dims and v != "states"]
    unknown = sorted(set(names) - set(ds.data_vars))
    if unknown or not names:
        raise fail("variables", f"names among the Dataset's variables {sorted(ds.data_vars)}",
                   repr(unknown or names))
    constants = {name: _value(c.values) for name, c in ds.coords.items() if c.size == 1}
    table = ds[names + (["status"] if "status" in ds.data_vars else [])]
    table = table.squeeze([d for d in table.dims if table.sizes[d] == 1], drop=True)
    df = table.drop_vars([c for c in constants if c in table.coords]).to_dataframe()
    df = df.reset_index()
    df.attrs["constants"] = constants
    if NOTE_ATTR in ds.attrs:
        df.attrs["note"] = ds.attrs[NOTE_ATTR]
    return df


def _value(a: np.ndarray) -> Any:
    """The one value of a size-1 array as a plain Python value."""
    v = a.reshape(-1)[0]
    return v.item() if isinstance(v, np.generic) else v
