"""What verifying the weight cache costs (`attnflow.pretrained.weightcache`): a warm read of
every cached entry of a real model, verified (SHA-256 of every byte against the index) beside
the unverified read it replaced (np.load memory-mapped, which reads nothing until used).

    python benchmarks/weightcache.py [--models smollm2,gemma3-270m] [--repeat 3]
                                     [--results benchmarks/RESULTS.md]

Per model: fill a fresh cache (cold: dequantise everything), then, warm (in the page cache),
the best of `--repeat` of (a) the baseline: the GGUF's SHA-256 (the key, both pay it), the
header JSON parsed, every entry np.load(mmap_mode="r"); (b) ours: `WeightCache` with the
header read by `read_json` and every entry by `get`, verified; (c) for scale, a forward pass
of 16 tokens on the warm model (logits of the last, float32), which touches every weight.
Prints the ratio (b)/(a) and (b)-(a) against (c). Appends a section with date, command and
CPU to `--results` when given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import describe, loadavg

from attnflow.pretrained.forward import forward
from attnflow.pretrained.gguf import GGUFModel
from attnflow.pretrained.models import installed
from attnflow.pretrained.weightcache import WeightCache, file_checksum


def best(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(name: str, repeat: int) -> list[str]:
    path = installed(name)
    if path is None:
        return [f"| {name} | not installed | | | | |"]
    with tempfile.TemporaryDirectory() as root:
        t = time.perf_counter()
        model = GGUFModel(path, cache=root)
        names = list(model._tensors)
        for n in names:
            model.tensor(n)
        cold = time.perf_counter() - t
        folder = Path(root) / "gguf" / file_checksum(path)
        shapes = {n: np.load(folder / f"{n}.npy", mmap_mode="r").shape for n in names}
        size = sum((folder / f"{n}.npy").stat().st_size for n in names)

        def baseline():
            file_checksum(path)
            json.loads((folder / "header.json").read_text(encoding="utf-8"))
            for n in names:
                np.load(folder / f"{n}.npy", mmap_mode="r", allow_pickle=False)

        def verified():
            cache = WeightCache(path, root)
            cache.read_json("header")
            for n in names:
                assert cache.get(n, shapes[n]) is not None

        warm = GGUFModel(path, cache=root)
        ids = warm.token_ids("The capital of France is Paris, and the capital of Italy is")[:16]
        forward(warm, ids, logits="last", dtype=np.float32)
        base, ours = best(baseline, repeat), best(verified, repeat)
        fwd = best(lambda: forward(warm, ids, logits="last", dtype=np.float32), repeat)
    return [f"| {name} | {size / 1e9:.2f} GB in {len(names)} entries | {cold:.1f} s | "
            f"{base:.2f} s | {ours:.2f} s ({ours / base:.1f}x; {size / 1e9 / ours:.2f} GB/s) | "
            f"{fwd:.2f} s ({(ours - base) / fwd:.2f}x of it) |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="smollm2,gemma3-270m")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    rows = ["| model | entries | cold fill | warm, unverified | warm, verified | "
            "forward of 16 tokens (verification's extra) |", "|---|---|---|---|---|---|"]
    for name in args.models.split(","):
        rows += measure(name, args.repeat)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([f"## {stamp}, `python benchmarks/weightcache.py {' '.join(sys.argv[1:])}`",
                      "", f"{describe()}; load average at the end "
                      f"{', '.join(f'{x:.1f}' for x in loadavg())}.", "", *rows, ""])
    print(text)
    if args.results is not None:
        with open(args.results, "a", encoding="utf-8") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
