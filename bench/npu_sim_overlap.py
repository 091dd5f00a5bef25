"""Accelerator loads through the engine, on the simulated NPU: what a load to a device stages and copies, and
how far the device's copies overlap the reads.

    .venv/bin/python bench/npu_sim_overlap.py --size 512M --tensors 320 --reps 5 --delay-us 200,2000,20000
    .venv/bin/python bench/npu_sim_overlap.py --size 64M --tensors 40 --reps 1 --delay-us 200 --markdown OUT.md
    .venv/bin/python bench/run.py --cases none --sections npu-overlap  # runs it into BENCHMARKS.md

The simulator changes the process it runs in (like importing torch_npu), so this script runs alone.

`load_file(path, device="npu:0")` of a checkpoint onto the simulated NPU of tests/python/npu_sim: the engine's
reader threads fill pinned slabs of the process-wide pool, each landed chunk becomes a non-blocking copy queued
on the device's stream, and a slab returns to the pool once that copy's event has completed. The simulator runs
each device's queued copies on one worker thread, waiting the per-copy delay before each (standing in for the
transfer) and then copying the bytes; it timestamps every copy (when the device took it up and when its bytes
landed). The engine's stats give its read phase (from the readers' start to the end of the last read), its
reads, staged bytes and chunks, and how long its readers waited for a slab.

The checkpoint (bf16 tensors of five sizes, 0.25 to 1.75 times the mean size, random values) is written once
and read once before the measured runs (warm page cache). Per delay setting: one warm-up load, not counted,
then the measured loads, of which the first checks every byte on the device against a CPU load; min / median /
max of the measured loads. Overlap is the fraction of the device's copy time (the sum over copies of finished
minus started) that lies inside the read phase: copies that ran while reads were still in flight. What does not
overlap is the tail, the copies still queued when the last read ended. "Before the first read" is the time from
the call to the readers' start: the header, the plan, and the allocation of every tensor on the device (the
simulator fills fresh device memory with a poison byte). The readers' slab wait is summed over the reader
threads; its share is that sum over the reader threads' time in the read phase.

Which side bounds the pipeline, in the observations below the table, is judged from the median slab-wait share: 50%
or more, the device's copies (they hold the readers back); 20% or less, the reads themselves; in between, both in
turn. Whichever it is, the tail after the last read is the device's. The device copy rate is the bytes over the
device's copy time, the readers' rate the bytes staged over the read phase.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "python"))

import torch  # noqa: E402

import npu_sim  # noqa: E402
from suite import section  # noqa: E402
from suite.common import fmt_time, parse_size  # noqa: E402  (as the main report writes them)

TITLE = "Accelerator loads through the engine: the simulated NPU's copy accounting and overlap"
MiB = 2**20


def write_checkpoint(path: Path, size: int, count: int) -> Tuple[int, int, int]:
    """bf16 tensors [rows, 1024] whose sizes cycle through 0.25, 0.5, 1, 1.5 and 1.75 times size/count;
    seeded values. Returns the bytes of the data buffer, and of the smallest and the largest tensor."""
    from safetensors.torch import save_file

    weights = (0.25, 0.5, 1.0, 1.5, 1.75)
    row_bytes = 1024 * 2
    base_rows = max(1, size // count // row_bytes)
    g = torch.Generator().manual_seed(17)
    state = {}
    for i in range(count):
        rows = max(1, int(base_rows * weights[i % len(weights)]))
        state[f"layers.{i // 4}.w{i % 4}"] = torch.randint(-32768, 32767, (rows, 1024), dtype=torch.int16,
                                                           generator=g).view(torch.bfloat16)
    save_file(state, str(path))
    sizes = [t.numel() * 2 for t in state.values()]
    return sum(sizes), min(sizes), max(sizes)


class _RecordingPrefetcher:
    """The engine's Prefetcher, keeping its stats at close."""

    def __init__(self, inner: Any, record: Dict[str, Any]) -> None:
        self._inner = inner
        self._record = record

    def close(self) -> None:
        if "stats" not in self._record:
            self._record["stats"] = dict(self._inner.stats())
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _RecordingQueue:
    """The engine's CopyQueue over a recorded Prefetcher, counting the staged events it hands out (each one a copy
    the loader issues)."""

    def __init__(self, inner: Any, record: Dict[str, Any]) -> None:
        self._inner = inner
        self._record = record

    def next(self, *args: Any, **kwargs: Any) -> Any:
        event, landed = self._inner.next(*args, **kwargs)
        if event.kind == "staged" and event.size:
            self._record["copies_issued"] += 1
        return event, landed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _RecordingModule:
    """Stands in for safetensors._safetensors_cpp.engine inside safetensors._engine: every Prefetcher it makes
    records."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.records: List[Dict[str, Any]] = []

    def Prefetcher(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (the wrapped class's name)
        threads = kwargs.get("threads", args[2] if len(args) > 2 else self._inner.DEFAULT_READER_THREADS)
        record: Dict[str, Any] = {"copies_issued": 0, "threads": threads}
        self.records.append(record)
        return _RecordingPrefetcher(self._inner.Prefetcher(*args, **kwargs), record)

    def CopyQueue(self, prefetcher: _RecordingPrefetcher, *args: Any) -> Any:  # noqa: N802 (the wrapped class's name)
        return _RecordingQueue(self._inner.CopyQueue(prefetcher._inner, *args), prefetcher._record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _WithEngine:
    """Stands in for safetensors._safetensors_cpp inside safetensors._engine, with `engine` (the submodule that
    holds Prefetcher and CopyQueue) replaced."""

    def __init__(self, inner: Any, engine: _RecordingModule) -> None:
        self._inner = inner
        self.engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def inside(start: int, end: int, lo: int, hi: int) -> int:
    return max(0, min(end, hi) - max(start, lo))


def one_run(path: Path, recorder: _RecordingModule, nbytes: int, verify: bool) -> Dict[str, Any]:
    from safetensors import _engine
    from safetensors.torch import load_file

    recorder.records.clear()
    npu_sim.synchronize()
    npu_sim.reset_copy_stats()
    _engine.reset_staging_peak()
    pool_before = _engine.staging_stats()
    npu_sim.record_copy_timeline(True)
    t0_ns = time.monotonic_ns()  # the clock of the engine's and the simulator's timestamps
    t0 = time.perf_counter()
    loaded = load_file(str(path), device="npu:0")
    wall = time.perf_counter() - t0
    npu_sim.record_copy_timeline(False)
    timeline = npu_sim.copy_timeline()
    copies = npu_sim.copy_stats()
    pool = _engine.staging_stats()
    if verify:
        cpu = load_file(str(path))
        bad = [k for k, v in cpu.items() if not torch.equal(loaded[k].cpu().view(torch.int16), v.view(torch.int16))]
        if bad:
            raise SystemExit(f"npu_sim_overlap: {len(bad)} tensors differ on the device, e.g. {bad[0]}")
    del loaded
    (record,) = recorder.records  # one file, one prefetcher
    stats = record["stats"]
    lo, hi = stats["started_ns"], stats["last_read_end_ns"]
    busy = sum(c["finished"] - c["started"] for c in timeline)
    overlapped = sum(inside(c["started"], c["finished"], lo, hi) for c in timeline)
    last_landed = max((c["finished"] for c in timeline), default=hi)
    read_phase = (hi - lo) / 1e9
    return {
        "wall_s": wall,
        "before_reads_s": max(0, lo - t0_ns) / 1e9,
        "read_phase_s": read_phase,
        "copy_busy_s": busy / 1e9,
        "tail_after_reads_s": max(0, last_landed - hi) / 1e9,
        "overlap": overlapped / busy if busy else 0.0,
        "slab_wait_s": stats["slab_wait_ns"] / 1e9,
        "slab_wait_share": (stats["slab_wait_ns"] / 1e9 / (record["threads"] * read_phase) if read_phase
                            else 0.0),
        "copy_gbps": copies["async"]["bytes"] / (busy / 1e9) / 1e9 if busy else 0.0,
        "staged_gbps": stats["bytes_staged"] / read_phase / 1e9 if read_phase else 0.0,
        "threads": record["threads"],
        "bytes_staged": stats["bytes_staged"],
        "bytes_read": stats["bytes_read"],
        "reads": stats["reads"],
        "chunks": stats["chunks"],
        "copies_issued": record["copies_issued"],
        "bytes_copied": copies["h2d"]["bytes"],
        "bytes_copied_async": copies["async"]["bytes"],
        "copies_async": copies["async"]["count"],
        "max_queue_depth": copies["async"]["max_depth"],
        "timeline_copies": len(timeline),
        "slabs_allocated": pool["allocations"] - pool_before["allocations"],
        "slabs_in_use_after": pool["slabs_in_use"],
        "slab_bytes": pool["slab_bytes"],
        "peak_pinned_bytes": pool["peak_bytes"],
        "cap_bytes": pool["capacity"],
        "pool_allocator_ours": pool["pool_allocator_ours"],
        "data_bytes": nbytes,
    }


def mib(n: float) -> str:
    return f"{n / MiB:.0f} MiB" if n % MiB == 0 else f"{n / MiB:.1f} MiB"


def seconds(t: float) -> str:
    return fmt_time(t) if t > 0 else "0"


def gbps(v: float) -> str:
    return f"{v:.2f} GB/s" if v >= 0.1 else f"{v:.3f} GB/s"


def delay_text(us: int) -> str:
    return f"{us} µs"


# The table's columns: heading, sample key, format.
COLUMNS: List[Tuple[str, str, Callable[[float], str]]] = [
    ("wall", "wall_s", fmt_time),
    ("before the first read", "before_reads_s", fmt_time),
    ("read phase", "read_phase_s", fmt_time),
    ("device copy time", "copy_busy_s", fmt_time),
    ("tail after the last read", "tail_after_reads_s", fmt_time),
    ("overlap", "overlap", lambda v: f"{v:.0%}"),
    ("readers' slab wait (summed)", "slab_wait_s", seconds),
    ("slab-wait share", "slab_wait_share", lambda v: f"{v:.0%}"),
    ("device copy rate", "copy_gbps", gbps),
]


def table(results: Dict[int, List[Dict[str, Any]]]) -> List[str]:
    lines = ["| per-copy delay | | " + " | ".join(c[0] for c in COLUMNS) + " |",
             "|---:|---|" + "---:|" * len(COLUMNS)]
    for delay, samples in results.items():
        for i, (name, pick) in enumerate((("min", min), ("median", statistics.median), ("max", max))):
            cells = [fmt(pick([s[key] for s in samples])) for _, key, fmt in COLUMNS]
            if name == "median":
                cells = [f"**{c}**" for c in cells]
            lines.append(f"| {delay_text(delay) if i == 0 else ''} | {name} | " + " | ".join(cells) + " |")
    return lines


def bounds(results: Dict[int, List[Dict[str, Any]]]) -> List[str]:
    """Per setting, which side bounds the pipeline, judged from the readers' slab-wait share (medians)."""
    out = []
    for delay, samples in results.items():
        def med(key: str, samples: List[Dict[str, Any]] = samples) -> float:
            return statistics.median(s[key] for s in samples)

        share, tail, busy = med("slab_wait_share"), med("tail_after_reads_s"), med("copy_busy_s")
        if share >= 0.5:
            verdict = (f"the device's copies bound the pipeline: the readers spent {share:.0%} of their time in the "
                       "read phase waiting for a slab to come back, and the read phase stretched to the copies' pace")
        elif share <= 0.2:
            verdict = (f"the reads bound the read phase: the readers spent {share:.0%} of their time in it waiting "
                       "for a slab, so the device's copies did not hold them back")
        else:
            verdict = (f"both sides bound the pipeline in turn: the readers spent {share:.0%} of their time in the "
                       "read phase waiting for a slab")
        out.append(f"- {delay_text(delay)} per copy: {verdict}. The tail after the last read is {fmt_time(tail)}, "
                   f"{tail / busy if busy else 0:.0%} of the device's copy time; the device copied at "
                   f"{gbps(med('copy_gbps'))}, the readers staged {gbps(med('staged_gbps'))} over the read phase "
                   "(medians).")
    return out


def accounting(results: Dict[int, List[Dict[str, Any]]]) -> List[str]:
    """The exact counts, each as its one value or the range where runs differed."""
    every = [s for samples in results.values() for s in samples]
    varying: List[str] = []

    def exact(key: str, fmt: Callable[[int], str] = lambda v: f"{v:,}") -> str:
        values = {s[key] for s in every}
        if len(values) == 1:
            return fmt(values.pop())
        varying.append(key)
        return f"{fmt(min(values))} to {fmt(max(values))}"

    def same(*keys: str) -> bool:
        return all(len({s[k] for k in keys}) == 1 for s in every)

    data = every[0]["data_bytes"]
    outside = {s["bytes_read"] - data for s in every}
    outside_text = ("nothing outside the tensors" if outside == {0} else
                    f"{min(outside):,} to {max(outside):,} bytes outside the tensors")
    chunks_text = "" if same("reads", "chunks") else f" of {exact('chunks')} planned chunks"
    read_text = ("" if same("bytes_read", "bytes_staged") else f", {exact('bytes_read')} bytes read in all")
    queue_text = ("all of it through the device queue" if same("bytes_copied", "bytes_copied_async") else
                  f"{exact('bytes_copied_async', mib)} of it through the device queue")
    one_each = same("copies_issued", "copies_async", "timeline_copies")
    copies_text = (f"{exact('copies_async')} non-blocking copies from pinned slabs, as many as the loader issued, "
                   "each on the simulator's timeline" if one_each else
                   f"{exact('copies_async')} non-blocking copies from pinned slabs; {exact('copies_issued')} issued "
                   f"by the loader, {exact('timeline_copies')} on the simulator's timeline")
    in_use = {s["slabs_in_use_after"] for s in every}
    returned = ("no slab still in use when the load returned" if in_use == {0} else
                f"{exact('slabs_in_use_after')} slabs still in use when the load returned")
    body = (f"**{exact('bytes_staged', mib)} staged** ({exact('bytes_staged')} bytes read into slabs in "
            f"{exact('reads')} reads{chunks_text}{read_text}, {outside_text}), "
            f"**{exact('bytes_copied', mib)} copied** to the device, {queue_text} ({copies_text}); "
            f"**{exact('slabs_allocated')} slabs** of {exact('slab_bytes', mib)} allocated for {exact('threads')} "
            f"reader threads, **peak pinned {exact('peak_pinned_bytes', mib)} against the pool's cap of "
            f"{exact('cap_bytes', mib)}**, {returned}.")
    depth = sorted({s["max_queue_depth"] for s in every})
    depth_text = f"{depth[0]}" if len(depth) == 1 else f"{depth[0]} to {depth[-1]}"
    lead = ("Copy accounting: " if len(every) == 1 else
            "Copy accounting, the same in every run and setting: " if not varying else
            f"Copy accounting (a range where the runs differed: {', '.join(varying)}): ")
    return [lead + body + f" At most {depth_text} copies were queued on the device at once "
            "(the most of each run).", ""]


def report(results: Dict[int, List[Dict[str, Any]]], meta: Dict[str, str], conditions: str) -> str:
    threads = {s["threads"] for samples in results.values() for s in samples}
    lines = section.heading(TITLE, meta, conditions) + section.doc_paragraphs(__doc__, 0, 1) \
        + section.doc_paragraphs(__doc__, 3)
    lines += [f"Reader threads: {', '.join(map(str, sorted(threads)))}. Medians in bold.", ""]
    lines += table(results) + [""] + bounds(results) + [""] + accounting(results)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="512M", help="checkpoint size (default 512M)")
    ap.add_argument("--tensors", type=int, default=320)
    ap.add_argument("--reps", type=int, default=5, help="measured loads per delay setting (default 5)")
    ap.add_argument("--delay-us", default="200,2000,20000", help="comma-separated per-copy delays of the simulator")
    ap.add_argument("--tmpdir", default=str(ROOT / "build" / "bench-results" / "tmp"))
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--markdown", type=Path, help="write the report section here (default: print it)")
    args = ap.parse_args()

    npu_sim.install(1)
    npu_sim.set_async_copies(True)
    from safetensors import _engine

    recorder = _RecordingModule(_engine._cpp.engine)
    _engine._cpp = _WithEngine(_engine._cpp, recorder)  # type: ignore[assignment]

    Path(args.tmpdir).mkdir(parents=True, exist_ok=True)
    delays = [int(d) for d in args.delay_us.split(",")]
    results: Dict[int, List[Dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as tmp:
        path = Path(tmp) / "model.safetensors"
        nbytes, smallest, largest = write_checkpoint(path, parse_size(args.size), args.tensors)
        with open(path, "rb") as f:  # warm the page cache
            while f.read(64 * MiB):
                pass
        meta = section.start()
        for delay in delays:
            npu_sim.set_copy_delay_us(delay)
            one_run(path, recorder, nbytes, verify=False)  # warm-up, not counted
            results[delay] = [one_run(path, recorder, nbytes, verify=(rep == 0)) for rep in range(args.reps)]
            print(f"[npu-sim-overlap] {delay} us: walls "
                  + ", ".join(f"{s['wall_s']:.3f}" for s in results[delay]) + " s", file=sys.stderr)

    conditions = (f"torch {torch.__version__}; the simulated NPU, one device; {mib(nbytes)} in {args.tensors} bf16 "
                  f"tensors of {smallest / MiB:.1f} to {largest / MiB:.1f} MiB; page cache warm; {args.reps} "
                  f"measured load{'s' if args.reps != 1 else ''} per delay")
    text = report(results, meta, conditions)
    section.emit(text, args.markdown)
    if args.json:
        Path(args.json).write_text(json.dumps({"size": nbytes, "tensors": args.tensors, "results": results},
                                              indent=1))


if __name__ == "__main__":
    main()
