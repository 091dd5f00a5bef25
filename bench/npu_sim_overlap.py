"""Copy accounting and read/copy overlap of an accelerator load through the engine, on the simulated NPU.

``load_file(path, device="npu:0")`` of a checkpoint onto the simulator of tests/python/npu_sim: the engine's
reader threads fill pinned slabs of the process-wide pool, each landed chunk becomes a non-blocking copy queued
on the device's stream, and a slab returns to the pool once that copy's event completed. The simulator delays
every queued copy (``--delay-us``, standing in for the transfer) and timestamps it (``npu_sim.copy_timeline``:
when the device took it up and when its bytes landed); the engine reports its read phase (``Prefetcher.stats``:
when the readers started, when the last read ended). Reported per setting, medians over the repetitions:

- bytes staged (read into slabs), bytes copied to the device (all of them, and those that went through the
  device queue), staged chunks = copies issued, slabs allocated, peak pinned bytes against the pool's cap;
- overlap: the fraction of the device's copy time (the sum over copies of finished - started) that lies inside
  the read phase -- copies that ran while reads were still in flight; the rest is the tail after the last read;
- the wall time of the load, the read phase and the copy time, and how long readers waited for slabs.

The checkpoint (``--size``, ``--tensors`` bf16 tensors of five sizes around size/tensors) is written once and
read once before the measured runs (warm page cache). The first run checks every byte on the device against a
CPU load. The simulator changes the process it runs in (like importing torch_npu), so this runs alone:

    .venv/bin/python bench/npu_sim_overlap.py --size 512M --tensors 320 --reps 5 --delay-us 200,2000,20000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

import torch  # noqa: E402

import npu_sim  # noqa: E402

MiB = 2**20


def parse_size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def write_checkpoint(path: Path, size: int, count: int) -> int:
    """bf16 tensors [rows, 1024] whose sizes cycle through 0.25, 0.5, 1, 1.5 and 1.75 times size/count;
    seeded values. Returns the bytes written to the data buffer."""
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
    return sum(t.numel() * 2 for t in state.values())


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
    """Stands in for safetensors._safetensors_cpp inside safetensors._engine: every Prefetcher it makes records."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.records: List[Dict[str, Any]] = []

    def Prefetcher(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (the wrapped class's name)
        record: Dict[str, Any] = {"copies_issued": 0}
        self.records.append(record)
        return _RecordingPrefetcher(self._inner.Prefetcher(*args, **kwargs), record)

    def CopyQueue(self, prefetcher: _RecordingPrefetcher, *args: Any) -> Any:  # noqa: N802 (the wrapped class's name)
        return _RecordingQueue(self._inner.CopyQueue(prefetcher._inner, *args), prefetcher._record)

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
    pinned_before = npu_sim.memory_stats(-1)["total_bytes"]
    npu_sim.record_copy_timeline(True)
    t0 = time.perf_counter()
    loaded = load_file(str(path), device="npu:0")
    wall = time.perf_counter() - t0
    npu_sim.record_copy_timeline(False)
    timeline = npu_sim.copy_timeline()
    copies = npu_sim.copy_stats()
    pool = _engine.staging_stats()
    pinned_total = npu_sim.memory_stats(-1)["total_bytes"] - pinned_before
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
    return {
        "wall_s": wall,
        "read_phase_s": (hi - lo) / 1e9,
        "copy_busy_s": busy / 1e9,
        "tail_after_reads_s": max(0, last_landed - hi) / 1e9,
        "overlap": overlapped / busy if busy else 0.0,
        "slab_wait_s": stats["slab_wait_ns"] / 1e9,
        "bytes_staged": stats["bytes_staged"],
        "bytes_read": stats["bytes_read"],
        "chunks": stats["chunks"],
        "copies_issued": record["copies_issued"],
        "bytes_copied": copies["h2d"]["bytes"],
        "bytes_copied_async": copies["async"]["bytes"],
        "copies_async": copies["async"]["count"],
        "max_queue_depth": copies["async"]["max_depth"],
        "timeline_copies": len(timeline),
        "slabs_allocated": pool["allocations"] - pool_before["allocations"],
        "slab_bytes": pool["slab_bytes"],
        "peak_pinned_bytes": pool["peak_bytes"],
        "pinned_bytes_allocated": pinned_total,
        "cap_bytes": pool["capacity"],
        "pool_allocator_ours": pool["pool_allocator_ours"],
        "data_bytes": nbytes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="512M")
    ap.add_argument("--tensors", type=int, default=320)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--delay-us", default="200,2000,20000", help="comma-separated per-copy delays of the simulator")
    ap.add_argument("--tmpdir", default=str(ROOT / "build" / "bench-results" / "tmp"))
    ap.add_argument("--json", help="write every sample here")
    args = ap.parse_args()

    npu_sim.install(1)
    npu_sim.set_async_copies(True)
    from safetensors import _engine

    recorder = _RecordingModule(_engine._cpp)
    _engine._cpp = recorder  # type: ignore[assignment]

    Path(args.tmpdir).mkdir(parents=True, exist_ok=True)
    delays = [int(d) for d in args.delay_us.split(",")]
    results: Dict[str, List[Dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as tmp:
        path = Path(tmp) / "model.safetensors"
        nbytes = write_checkpoint(path, parse_size(args.size), args.tensors)
        with open(path, "rb") as f:  # warm the page cache
            while f.read(64 * MiB):
                pass
        for delay in delays:
            npu_sim.set_copy_delay_us(delay)
            one_run(path, recorder, nbytes, verify=False)  # warm-up, not counted
            samples = [one_run(path, recorder, nbytes, verify=(rep == 0)) for rep in range(args.reps)]
            results[str(delay)] = samples

    print(f"npu_sim_overlap: {nbytes / MiB:.0f} MiB in {args.tensors} bf16 tensors, {args.reps} runs per delay, "
          f"load average {os.getloadavg()[0]:.1f}, torch {torch.__version__}")
    keys = ["wall_s", "read_phase_s", "copy_busy_s", "tail_after_reads_s", "overlap", "slab_wait_s",
            "bytes_staged", "bytes_copied", "bytes_copied_async", "copies_issued", "timeline_copies",
            "slabs_allocated", "peak_pinned_bytes", "cap_bytes", "max_queue_depth"]
    for delay, samples in results.items():
        print(f"-- delay {delay} us per copy (medians; min-max)")
        for key in keys:
            values = [s[key] for s in samples]
            print(f"   {key:22s} {statistics.median(values):>14.4g}   ({min(values):.4g} - {max(values):.4g})")
    if args.json:
        Path(args.json).write_text(json.dumps({"size": nbytes, "tensors": args.tensors, "results": results},
                                              indent=1))


if __name__ == "__main__":
    main()
