"""Benchmarks against the reference safetensors 0.8.0, torch.save/torch.load, numpy and the machine's limits.

Run through `bash scripts/bench.sh [options]` (which sets up first); `python bench/run.py --help` lists the
options. One run measures every selected case and the machine's ceilings, then writes BENCHMARKS.md (tables,
each target with met / not met), bench/results.png (the plot) and bench/results.json (every sample).

Cases (numbers for --cases):
  1  open + keys (+ every shape) of files with 1k, 20k, 100k tensors
  2  lazy load_file (mmap): time and RSS
  3  materialized load, warm page cache, both backends; reads into pre-faulted buffers
  4  materialized load, cold page cache (posix_fadvise DONTNEED, checked with mincore)
  5  save, with and without fsync, with peak RSS
  6  tensor-parallel slicing: 1/8 of the columns of every 2-D tensor
  7  get_tensor per-tensor overhead on a 20k-tensor file
  8  what a user sees: each load in a new interpreter that loads once (2 GiB and 6 GiB files and 20k small
     tensors, warm and cold), this package through the page cache, direct (O_DIRECT) and auto, against the
     peers (Run:ai model streamer; fastsafetensors without GDS, with and without O_DIRECT; installed in
     build/bench-peers from requirements-bench.txt), the reference and torch.load
The ceilings (memcpy, first touch, warm / fresh / cold pread, cold O_DIRECT reads at several queue depths) are
measured for the sizes the cases use.

Sections (names for --sections; each a script of bench/ that measures against its own peers and ceilings):
  remote        loads from an S3 server on loopback (SeaweedFS) against Run:ai, boto3 and raw range requests
  prefetch-cpu  safe_open.prefetch to the CPU against load_file and a one-thread pread ceiling
  npu-overlap   loads onto the simulated NPU: copy accounting and how reads overlap the device's copies
  distributed   safetensors.distributed.load_file over gloo, world 1/2/4, against every rank loading alone
  sharded       DTensor checkpoints (FSDP, tensor parallel) loaded and saved, against DCP and rank-0 gathering
  strided       slices of an inner dimension: strided runs against reading the covering rows
  fresh-memory  warm owned loads into fresh memory, with page faults and CPU time, against Run:ai and the C fills
  threads       loads from 8 threads on free-threaded Python 3.14t, GIL off and on, against the reference
A full run measures every case and every section; --cases alone measures no section unless --sections names
some, and `--cases none --sections NAME` reruns one section, leaving the rest of the report as it is.
"""

# This file reads the options and hands over; the code is in bench/suite/ (its __init__.py maps the modules).

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite.common import CASES, HERE, IDLE_SECONDS, ROOT, config, parse_size  # noqa: E402
from suite import sections  # noqa: E402
from suite.session import measure, render  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repetitions: a smoke test (under 2 minutes)")
    ap.add_argument("--cases", help="comma-separated case numbers, or none (default: all)")
    ap.add_argument("--sections", help="comma-separated section names, all or none (default: all, or none when "
                                       "--cases is given)")
    ap.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")],
                    help="model file sizes, e.g. 512M,2G (default: 512M,2G; --quick: 16M,64M)")
    ap.add_argument("--fresh-sizes", type=lambda s: [parse_size(x) for x in s.split(",")],
                    help="case 8 file sizes (default: 2G,6G; --quick: 64M)")
    ap.add_argument("--fresh-count", type=int, help="case 8: tensors in the small-tensor file (default 20000; "
                    "0 leaves that file out)")
    ap.add_argument("--fresh-idle", type=float, help="case 8: seconds each new process waits before it loads, so "
                    f"that memory the last one freed has gone idle, as before a user's process (default {IDLE_SECONDS})")
    ap.add_argument("--cold-size", type=parse_size, help="size for the cold-cache case (default: the smallest)")
    ap.add_argument("--slice-size", type=parse_size, help="size for the slicing case (default: the largest)")
    ap.add_argument("--reps", type=int, help="repetitions per measurement (default 5, --quick 3)")
    ap.add_argument("--tmpdir", type=Path, help="where the benchmark files go (default: build/bench-results/tmp)")
    ap.add_argument("--out", type=Path, help="the Markdown report (default: BENCHMARKS.md; --quick: "
                                             "build/bench-results/quick/BENCHMARKS.md)")
    ap.add_argument("--spawn", action="store_true", help="a new interpreter for every measurement instead of "
                                                         "forking one (slower, same numbers)")
    ap.add_argument("--reference", type=Path, default=ROOT / ".ref", help="the reference's --target dir")
    ap.add_argument("--ours-path", type=Path, help="a directory holding another build of this package's "
                                                   "`safetensors` (put first on PYTHONPATH for its worker)")
    ap.add_argument("--render", type=Path, metavar="JSON", help="measure nothing: write the report and the plot "
                                                                  "again from the samples of an earlier run")
    args = ap.parse_args()
    try:
        chosen = sections.select(args.sections or ("none" if args.cases is not None else "all"))
    except ValueError as e:
        ap.error(str(e))
    spec = "1,2,3,4,5,6,7,8" if args.cases is None else args.cases
    args.cases = [] if spec == "none" else [c.strip() for c in spec.split(",") if c.strip()]
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        ap.error(f"unknown case(s) {bad}; cases are {', '.join(f'{k}: {v}' for k, v in CASES.items())}")
    cfg = config(args)

    outdir = ROOT / "build" / "bench-results" / ("quick" if args.quick else "full")
    outdir.mkdir(parents=True, exist_ok=True)
    out_md = args.out or (outdir / "BENCHMARKS.md" if args.quick else ROOT / "BENCHMARKS.md")
    out_md = out_md.resolve()
    out_md.parent.mkdir(parents=True, exist_ok=True)
    if args.render:
        return render(args, out_md)
    plot = (outdir / "results.png") if args.quick else HERE / "results.png"
    out_json = (outdir / "results.json") if args.quick else HERE / "results.json"
    if args.out and not args.quick:  # a report elsewhere keeps its plot and samples beside it
        plot, out_json = out_md.parent / "results.png", out_md.parent / "results.json"
    if args.cases:
        rc = measure(args, cfg, outdir, out_md, plot, out_json)
        if rc:
            return rc
    elif not chosen:
        ap.error("--cases none and no --sections: nothing to measure")
    done = sections.run(chosen, args.quick, out_md, outdir / "sections")
    if done:
        print("bench: sections: " + "; ".join(d.line for d in done))
    return 0 if all(d.ok for d in done) else 1


if __name__ == "__main__":
    sys.exit(main())
