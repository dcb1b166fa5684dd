"""Compare the measured numbers of two reproduction folders, recipe by recipe.

    python benchmarks/compare_results.py BEFORE_DIR AFTER_DIR [--rtol 1e-12]

Reads OUT/<recipe>/result.json in both folders and compares every number under "numbers"
(nested dicts and lists walked leaf by leaf): "identical" when bit for bit equal, "close"
when within rtol (relative, or absolute below 1e-300), otherwise "DIFFERENT" with the largest
deviation. Verdict wording and times (any number under a key "timings", "wall_time" or
"*_s") are not compared (a redesign keeps the numbers; the ledger may change the criteria).
Exit status 1 if any number differs beyond rtol or a recipe is missing on one side.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Every leaf of nested dicts and lists, keyed by its path."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(leaves(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(leaves(v, f"{path}[{i}]"))
        return out
    return {path: value}


def timing(path: str) -> bool:
    """True for a leaf that is a time measurement (wall-clock, not a result)."""
    parts = path.replace("[", ".").split(".")
    return any(p in ("timings", "wall_time") or p.endswith("_s") for p in parts)


def deviation(a: Any, b: Any) -> float:
    """0 when equal; the relative deviation of two numbers; inf when not comparable."""
    if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                  and math.isnan(b)):
        return 0.0
    if isinstance(a, bool) or isinstance(b, bool) or not all(
            isinstance(v, (int, float)) for v in (a, b)):
        return math.inf
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 1e-300 else abs(a - b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rtol", type=float, default=1e-12)
    args = parser.parse_args()
    bad = 0
    names = sorted({p.parent.name for d in (args.before, args.after)
                    for p in d.glob("*/result.json")})
    for name in names:
        files = [d / name / "result.json" for d in (args.before, args.after)]
        if not all(f.exists() for f in files):
            print(f"{name:16s} MISSING in {[str(f) for f in files if not f.exists()]}")
            bad += 1
            continue
        a, b = ({k: v for k, v in leaves(json.loads(f.read_text())["numbers"]).items()
                 if not timing(k)} for f in files)
        keys = sorted(set(a) | set(b))
        devs = {k: deviation(a.get(k), b.get(k)) for k in keys}
        worst = max(devs, key=devs.get) if devs else None
        top = devs[worst] if worst else 0.0
        state = "identical" if top == 0 else "close" if top <= args.rtol else "DIFFERENT"
        bad += state == "DIFFERENT"
        detail = "" if top == 0 else f"  (largest {top:.3g} at {worst}: {a.get(worst)!r} vs " \
            f"{b.get(worst)!r})"
        print(f"{name:16s} {len(keys):5d} numbers  {state}{detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
