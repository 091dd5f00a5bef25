"""Where reading a shard of an inner dimension as strided runs stops paying against reading the covering rows.

A tensor sharded on its last dimension over ``world`` ranks is, on each rank, one run of ``row / world`` bytes
per row with a gap of ``row - row / world`` bytes between runs. The library's slice reader (``File.read_slice``)
reads runs whose gap is under its coalesce gap (``kCoalesceGap`` in src/file/file.cc, the remote source's merge gap
where larger) as one read of the covering bytes, and each other run with a read of its own. This script times,
per run length, both ways on the same file with ``backend="pread"``: the runs one read each (``strided``), and
the covering rows read whole (``covering``: one read per 8 MiB, then the runs copied out), warm (file in the page
cache) and cold (dropped before each read); the median of ``--reps``.

    .venv/bin/python bench/strided_crossover.py [--mib 256] [--reps 5] [--world 2] [--markdown FILE]

With ``--markdown`` the section (this description and the table) is written to FILE; bench/run.py
``--sections strided`` puts it into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import torch

from safetensors import _safetensors_cpp as _cpp
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker import evict  # noqa: E402  (bench/worker.py: the page-cache helpers every benchmark uses)
from suite import section  # noqa: E402


def measure(path: str, run: int, row: int, rows: int, reps: int, cache: str) -> Tuple[float, float]:
    """Median seconds of (strided, covering) reads of the first ``run`` bytes of each row."""
    f = _cpp.File(path, "pread")
    plan = f.plan_slice("w", [slice(None), slice(0, run)])
    out = torch.empty(plan.nbytes, dtype=torch.uint8)
    cover = torch.empty(rows * row, dtype=torch.uint8)

    def strided() -> None:
        f.read_slice("w", plan, out.data_ptr())

    def covering() -> None:
        f.read_range(0, cover.data_ptr(), cover.numel())
        out.view(rows, run).copy_(cover.view(rows, row)[:, :run])

    times: Dict[str, List[float]] = {"strided": [], "covering": []}
    for _ in range(reps):
        for name, fn in (("strided", strided), ("covering", covering)):
            if cache == "cold":
                evict(path)
            else:
                fn()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return statistics.median(times["strided"]), statistics.median(times["covering"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--runs", default="512,1024,2048,4096,8192,16384,65536")
    ap.add_argument("--markdown", help="write the section (description and table) to this file")
    args = ap.parse_args()
    total = args.mib << 20
    meta = section.start()
    lines = ["| run bytes | gap bytes | cache | strided (ms) | covering rows (ms) | strided / covering |",
             "|---:|---:|---|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp:
        for run in [int(x) for x in args.runs.split(",")]:
            row = run * args.world
            rows = total // row
            path = os.path.join(tmp, "t.safetensors")
            save_file({"w": torch.zeros(rows, row, dtype=torch.uint8)}, path)
            for cache in ("warm", "cold"):
                s, c = measure(path, run, row, rows, args.reps, cache)
                lines.append(f"| {run} | {row - run} | {cache} | {s * 1e3:.1f} | {c * 1e3:.1f} | {s / c:.2f} |")
                print(lines[-1], flush=True)
            os.unlink(path)
    if args.markdown:
        head = section.heading("Strided runs against covering rows", meta,
                               f"a {args.mib} MiB tensor, world {args.world}, median of {args.reps}")
        with open(args.markdown, "w") as out:
            out.write("\n".join(head + section.doc_paragraphs(__doc__, 0, 2) + lines) + "\n")


if __name__ == "__main__":
    main()
