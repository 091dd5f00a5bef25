"""What every part of bench/run.py shares: paths, the case list, the names of implementations and methods,
sizes and their names, the run's configuration, the measuring processes (Server), the rows of a run
(Results) and how a row's time and bandwidth are shown."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent.parent  # bench/
ROOT = HERE.parent

MiB = 1 << 20
GiB = 1 << 30
# Seconds the idle first-touch ceiling lets freed memory sit before each run (see Ceilings.memory).
IDLE_SECONDS = 5

CASES = {
    "1": "open + keys + shapes",
    "2": "lazy load (mmap)",
    "3": "materialized load, warm cache",
    "4": "materialized load, cold cache",
    "5": "save",
    "6": "tensor-parallel slicing",
    "7": "get_tensor overhead",
    "8": "fresh-process loads vs peers",
}
# Benchmark-only peers (requirements-bench.txt, installed by scripts/bench.sh), imported only by case 8.
PEERS_DIR = ROOT / "build" / "bench-peers"

# What each implementation/method is called in the tables.
IMPL = {"ours": "this package", "ref": "reference 0.8.0", "torch": "torch", "numpy": "numpy",
        "runai": "Run:ai model streamer 0.17.0", "fst": "fastsafetensors 0.5.0"}
METHOD = {
    "st_pread": 'load_file(backend="pread")',
    "st_direct": 'load_file(backend="direct")',
    "st_auto": 'load_file(backend="auto")',
    "st_mmap_clone": "load_file() + .clone() of every tensor",
    "st_mmap_touch": "load_file() + one read per 4 KiB page (not tensor-owned)",
    "st_mmap": "load_file() (lazy, mmap)",
    "torch_load": "torch.load(weights_only=True)",
    "torch_load_mmap": "torch.load(weights_only=True, mmap=True)",
    "np_fromfile": "np.fromfile of the data bytes (one array)",
    "np_memmap": "np.memmap of the data bytes",
    "runai": "SafetensorsStreamer.stream_file + get_tensors (default reader)",
    "runai_io_uring": "SafetensorsStreamer, RUNAI_STREAMER_FS_STRATEGY=io_uring_buffered",
    "fst": "fastsafe_open(nogds=True), FASTSAFETENSORS_ODIRECT=0, get_tensor of every key",
    "fst_odirect": "fastsafe_open(nogds=True), FASTSAFETENSORS_ODIRECT=1, get_tensor of every key",
}

# ---------------------------------------------------------------------------------------------------------
# Configuration

def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)i?B?", text.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 512M, 2G)")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": MiB, "G": GiB}[m.group(2).upper()])


def size_name(n: int) -> str:
    if n >= GiB and n % GiB == 0:
        return f"{n // GiB} GiB"
    if n >= MiB and n % MiB == 0:
        return f"{n // MiB} MiB"
    return f"{n / MiB:.1f} MiB"


def count_name(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def config(args: argparse.Namespace) -> Dict[str, Any]:
    if args.quick:
        cfg = {"sizes": [16 * MiB, 64 * MiB], "hidden": 512, "counts": [1000, 5000], "get_tensor_count": 5000,
               "reps": 3, "inner_reps": 3, "fresh_sizes": [64 * MiB], "fresh_count": 5000}
    else:
        cfg = {"sizes": [512 * MiB, 2 * GiB], "hidden": 2048, "counts": [1000, 20000, 100000],
               "get_tensor_count": 20000, "reps": 5, "inner_reps": 5, "fresh_sizes": [2 * GiB, 6 * GiB],
               "fresh_count": 20000}
    if args.fresh_sizes:
        cfg["fresh_sizes"] = sorted(args.fresh_sizes)
    if args.fresh_count is not None:
        cfg["fresh_count"] = args.fresh_count
    cfg["fresh_idle"] = IDLE_SECONDS if args.fresh_idle is None else args.fresh_idle
    if args.sizes:
        cfg["sizes"] = sorted(args.sizes)
    if args.reps:
        cfg["reps"] = cfg["inner_reps"] = args.reps
    cfg["cold_size"] = args.cold_size or cfg["sizes"][0]
    cfg["slice_size"] = args.slice_size or cfg["sizes"][-1]
    cfg["cases"] = args.cases
    cfg["quick"] = args.quick
    return cfg


# ---------------------------------------------------------------------------------------------------------
# Measuring processes

class MeasurementError(RuntimeError):
    pass


class Server:
    """A worker.py process for one implementation: a fork server (default) or, with spawn, a new interpreter
    for every request."""

    def __init__(self, name: str, env: Dict[str, str], spawn: bool) -> None:
        self.name, self.env, self.spawn = name, env, spawn
        self.proc: Optional[subprocess.Popen] = None
        if not spawn:
            self.proc = subprocess.Popen([sys.executable, str(HERE / "worker.py"), "serve"], env=env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            line = self.proc.stdout.readline()
            if not line or not json.loads(line).get("ready"):
                raise MeasurementError(f"the {name} worker did not start (see its messages above)")

    def __call__(self, request: Dict[str, Any]) -> Dict[str, Any]:
        if self.spawn:
            out = subprocess.run([sys.executable, str(HERE / "worker.py"), "once", json.dumps(request)], env=self.env,
                                 text=True, stdout=subprocess.PIPE)
            lines = out.stdout.strip().splitlines()
            if not lines:
                raise MeasurementError(f"worker exited with {out.returncode} and no answer")
            answer = json.loads(lines[-1])
        else:
            assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise MeasurementError(f"the {self.name} worker died")
            answer = json.loads(line)
        if not answer["ok"]:
            if answer.get("traceback"):
                sys.stderr.write(answer["traceback"])
            raise MeasurementError(answer["error"])
        return answer["result"]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()


# ---------------------------------------------------------------------------------------------------------
# Results

class Results:
    def __init__(self) -> None:
        self.rows: Dict[str, Dict[str, Any]] = {}
        self.notes: List[str] = []
        self.t0 = time.monotonic()

    def add(self, key: str, case: str, group: str, label: str, seconds: List[float], **extra: Any) -> Dict[str, Any]:
        row = {"key": key, "case": case, "group": group, "label": label, "seconds": seconds, **extra}
        self.rows[key] = row
        self._print(row)
        return row

    def fail(self, key: str, case: str, group: str, label: str, error: str) -> None:
        self.rows[key] = {"key": key, "case": case, "group": group, "label": label, "seconds": [], "error": error}
        self._print(self.rows[key])

    def _print(self, row: Dict[str, Any]) -> None:
        elapsed = time.monotonic() - self.t0
        if row.get("error"):
            text = "ERROR " + row["error"].splitlines()[0][:150]
        else:
            text = f"{fmt_time(median(row))}  [{fmt_time(min(row['seconds']))} .. {fmt_time(max(row['seconds']))}]"
            if gbps(row) is not None:
                text += f"  {gbps(row):.2f} GB/s"
            if row.get("peak_delta") is not None:
                text += f"  peak +{row['peak_delta'] / MiB:.0f} MiB"
        print(f"[{elapsed:6.0f}s] {row['case']:>2} {row['group']:<28} {row['label']:<58} {text}", flush=True)

    def get(self, key: str) -> Optional[Dict[str, Any]]:
        row = self.rows.get(key)
        return row if row and not row.get("error") and row["seconds"] else None


def median(row: Dict[str, Any]) -> float:
    return statistics.median(row["seconds"])


def gbps(row: Optional[Dict[str, Any]]) -> Optional[float]:
    if not row or not row.get("bytes") or not row.get("seconds"):
        return None
    return row["bytes"] / median(row) / 1e9


def fmt_time(t: float) -> str:
    if t < 1e-3:
        return f"{t * 1e6:.2f} µs"
    if t < 1:
        return f"{t * 1e3:.2f} ms"
    return f"{t:.3f} s"


