"""Compare sweep stores made by two checkouts of attnflow: the same values, bit for bit.

Every array of the Zarr groups (metrics, states, status, error, coordinates) must have the
same dtype, shape and bytes (NaNs equal), and the attributes must agree except those naming
the version and commit that made them. Prints one line per store; exits 1 on a difference.

    PYTHONPATH=OLD/src python run_sweeps.py before  &&  PYTHONPATH=NEW/src python ... after
    python benchmarks/compare_sweep_stores.py before/a.zarr after/a.zarr [before/b.zarr ...]
"""

from __future__ import annotations

import sys

import numpy as np
import zarr

ALLOWED = {"attnflow_version", "attnflow_commit"}  # attributes that may differ


def differences(a_path: str, b_path: str) -> list[str]:
    """What differs between the stores at a_path and b_path (empty: identical values)."""
    a, b = zarr.open_group(a_path, mode="r"), zarr.open_group(b_path, mode="r")
    out = []
    attrs_a, attrs_b = (({k: v for k, v in g.attrs.items() if k not in ALLOWED}) for g in (a, b))
    if attrs_a != attrs_b:
        out.append(f"attributes: {sorted(set(attrs_a.items()) ^ set(attrs_b.items()))}")
    names_a, names_b = set(a.array_keys()), set(b.array_keys())
    if names_a != names_b:
        out.append(f"arrays: {sorted(names_a ^ names_b)}")
    for name in sorted(names_a & names_b):
        x, y = np.asarray(a[name][...]), np.asarray(b[name][...])
        if x.dtype != y.dtype or x.shape != y.shape:
            out.append(f"{name}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
        elif x.dtype.kind not in "biufc":  # strings, objects
            if not np.array_equal(x, y):
                out.append(f"{name}: {int(np.sum(x != y))} entries differ")
        elif x.tobytes() != y.tobytes() and not np.array_equal(x, y, equal_nan=True):
            out.append(f"{name}: max |difference| {np.nanmax(np.abs(x - y)):.3g}")
        if dict(a[name].attrs) != dict(b[name].attrs):
            out.append(f"{name}: attributes differ")
    return out


def main(paths: list[str]) -> int:
    if len(paths) % 2:
        raise SystemExit("usage: compare_sweep_stores.py BEFORE AFTER [BEFORE AFTER ...]")
    failed = 0
    for a, b in zip(paths[::2], paths[1::2]):
        diff = differences(a, b)
        print(f"{a} vs {b}: " + ("identical" if not diff else "; ".join(diff)))
        failed += bool(diff)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
