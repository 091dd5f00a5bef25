"""The machine's ceilings, measured with bench/ceilings.c in the same run as the cases: building it
(build_ceilings), the in-process ceilings for each size (Ceilings), case 8's ceiling run as a row of the
loads' own rounds (FreshCeiling), and which ceiling row a target holds a load against (direct_ceiling,
fresh_ceiling)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from suite import keys, pagecache
from suite.common import HERE, IDLE_SECONDS, MeasurementError, MiB, Results, median, size_name

def build_ceilings(outdir: Path) -> Optional[Path]:
    """outdir/ceilings, built from bench/ceilings.c when missing or older than it; None without a compiler."""
    exe = outdir / "ceilings"
    src = HERE / "ceilings.c"
    if exe.exists() and exe.stat().st_mtime >= src.stat().st_mtime:
        return exe
    cc = os.environ.get("CC", "cc")
    r = subprocess.run([cc, "-O2", "-pthread", "-o", str(exe), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"cannot build bench/ceilings.c with {cc}: {r.stderr.strip()}", file=sys.stderr)
        return None
    return exe


def settle(exe: Optional[Path], nbytes: int) -> None:
    """Writes `nbytes` of fresh memory in a new process that then exits (bench/ceilings.c's first touch, on
    all CPUs), so that every measured load of a round follows the same predecessor: what the process before a
    load freed, and how, changes what its fill costs on a VM with free page reporting (rows taking turns
    otherwise follow different rows: in one fresh-memory run every Python row of 6 GiB took 4.5-5.6 s and
    the C fill 3.7 s, while this package's load after the same predecessor, paired with the C fill, took as
    long or less). Nothing without a C compiler."""
    if exe is None:
        return
    out = subprocess.run([str(exe), "touch", str(nbytes), str(os.cpu_count() or 1), "1", "0"], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise MeasurementError(f"settling {nbytes} bytes of memory: {out.stderr.strip()}")


def settle_and_start(exe: Optional[Path], nbytes: Optional[int], idle: float,
                     setup: Optional[Tuple[Any, ...]] = None) -> float:
    """The start of a fresh-process row, called right after the previous measured process ended: the row's page
    cache set up (`setup`: pagecache.prepare's arguments, the evictions and the warming read), so that what
    evicting frees is freed before the predecessor, not inside the row's pause; then the common predecessor
    (settle, where `nbytes` is given); then the moment the row's clock starts, `idle` seconds from now
    (pagecache.start_after). Case 8's rounds (runner.Runner) and the fresh-memory section share it."""
    if setup is not None:
        pagecache.prepare(*setup)
    if nbytes is not None:
        settle(exe, nbytes)
    return pagecache.start_after(idle)


class Ceilings:
    """The in-process ceilings: each method runs bench/ceilings.c on 1 and all CPUs (cold also 8 threads) and
    adds the best as one row of case "C"."""

    def __init__(self, exe: Optional[Path], results: Results, reps: int) -> None:
        self.exe, self.results, self.reps = exe, results, reps
        nproc = os.cpu_count() or 1
        self.threads = sorted({1, nproc})
        self.cold_threads = sorted({1, nproc, 8})

    def _run(self, *args: Any, env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        out = subprocess.run([str(self.exe), *map(str, args)], capture_output=True, text=True,
                             env=None if env is None else {**os.environ, **env})
        if out.returncode != 0:
            raise MeasurementError(out.stderr.strip())
        return json.loads(out.stdout)

    def measure(self, key: str, group: str, label: str, runs: List[Tuple[int, Any]]) -> None:
        """Runs each (threads, thunk) and keeps the thread count with the best median."""
        if self.exe is None:
            self.results.fail(key, "C", group, label, "no C compiler: ceiling not measured")
            return
        best = None
        try:
            for _threads, thunk in runs:
                r = thunk()
                if best is None or statistics.median(r["seconds"]) < statistics.median(best["seconds"]):
                    best = r
        except MeasurementError as e:
            self.results.fail(key, "C", group, label, str(e))
            return
        how = best.get("how") or f"{best['threads']} thread{'s' if best['threads'] > 1 else ''}"
        self.results.add(key, "C", group, f"{label} ({how})",
                         best["seconds"], bytes=best["bytes"], threads=best["threads"],
                         **({"resident_before": best["resident_before"]} if "resident_before" in best else {}))

    def memory(self, size: int, idle: bool = False) -> None:
        n = min(size, 512 * MiB)
        self.measure(keys.ceiling("memcpy", size), size_name(size), "memcpy between pre-faulted buffers",
                     [(t, lambda t=t: self._run("memcpy", n, t, self.reps)) for t in self.threads])
        self.measure(keys.ceiling("touch", size), size_name(size), "first touch: write once into fresh mmap memory",
                     [(t, lambda t=t: self._run("touch", size, t, self.reps, 0)) for t in self.threads])
        self.measure(keys.ceiling("touch_thp", size), size_name(size),
                     "first touch, MADV_HUGEPAGE memory (as numpy allocates)",
                     [(t, lambda t=t: self._run("touch", size, t, self.reps, 1)) for t in self.threads])
        if idle:
            # The same with memory freed a few seconds earlier, which is what a new process or a load a
            # while after the last one usually gets (this benchmark's fresh children included).
            t = max(self.threads)
            self.measure(keys.ceiling("touch_thp_idle", size), size_name(size),
                         f"first touch, MADV_HUGEPAGE memory, each run after {IDLE_SECONDS} s idle",
                         [(t, lambda: self._run("touch", size, t, min(self.reps, 3), 1, IDLE_SECONDS))])

    def warm_pread(self, path: str, size: int) -> None:
        pagecache.warm(path)
        self.measure(keys.ceiling("pread_warm", size), size_name(size), "warm pread into a pre-faulted buffer",
                     [(t, lambda t=t: self._run("pread", path, t, self.reps, 0)) for t in self.threads])
        self.measure(keys.ceiling("pread_fresh", size), size_name(size), "warm pread into fresh memory",
                     [(t, lambda t=t: self._run("pread", path, t, self.reps, 1)) for t in self.threads])
        self.measure(keys.ceiling("pread_fresh_thp", size), size_name(size),
                     "warm pread into fresh MADV_HUGEPAGE memory",
                     [(t, lambda t=t: self._run("pread", path, t, self.reps, 2)) for t in self.threads])
        self.measure(keys.ceiling("pread_fresh_pop", size), size_name(size),
                     "warm pread into fresh memory, each 512 KiB step faulted in first (MADV_POPULATE_WRITE)",
                     [(t, lambda t=t: self._run("pread", path, t, self.reps, 3)) for t in self.threads])

    def cold_pread(self, path: str, size: int) -> None:
        def cold(t: int, piece_mib: int) -> Dict[str, Any]:
            seconds, resident = [], 0.0
            for _ in range(self.reps):
                resident = max(resident, pagecache.evict(path))
                r = self._run("pread", path, t, 1, 0, piece_mib)
                seconds += r["seconds"]
            how = (f"{t} thread{'s' if t > 1 else ''}, 8 MiB pieces" if piece_mib else "1 thread, one pread call")
            return {**r, "seconds": seconds, "resident_before": resident, "how": how}

        # 8 MiB pieces on 1, all CPUs and 8 threads (deeper queues), or the whole file in one pread call.
        self.measure(keys.ceiling("pread_cold", size), size_name(size), "cold pread into a pre-faulted buffer",
                     [(t, lambda t=t: cold(t, 8)) for t in self.cold_threads] + [(1, lambda: cold(1, 0))])

    def direct(self, path: str, size: int) -> None:
        """Cold O_DIRECT reads of the whole file into a pre-faulted aligned buffer (no page cache, no fresh
        memory: the device's own rate), 8 MiB reads with several in flight: from as many threads, and from one
        thread on an io_uring."""
        def run(depth: int, uring: int) -> Dict[str, Any]:
            r = self._run("direct", path, depth, self.reps, 8192, uring)
            how = f"{depth} io_uring reads in flight from 1 thread" if uring else \
                f"{depth} thread{'s' if depth > 1 else ''}, one read each"
            return {**r, "how": how + ", 8 MiB reads"}

        for depth in keys.DIRECT_DEPTHS:
            self.measure(keys.direct(size, depth), size_name(size),
                         "cold O_DIRECT read into a pre-faulted aligned buffer", [(depth, lambda d=depth: run(d, 0))])
        for depth in keys.URING_DEPTHS:
            self.measure(keys.direct(size, depth, uring=True), size_name(size),
                         "cold O_DIRECT read into a pre-faulted aligned buffer", [(1, lambda d=depth: run(d, 1))])

    def write(self, size: int, tmp: Path) -> None:
        path = tmp / "ceiling-write.out"
        self.measure(keys.ceiling("write", size), size_name(size), "pwrite of a pre-faulted buffer to a new file",
                     [(t, lambda t=t: self._run("write", path, size, t, self.reps, 0)) for t in self.threads])
        self.measure(keys.ceiling("write_fsync", size), size_name(size),
                     "the same + fsync of the file and its directory",
                     [(1, lambda: self._run("write", path, size, 1, self.reps, 1))])


class FreshCeiling:
    """Case 8's ceiling as a row of its rounds, served like a worker: each request runs bench/ceilings.c once, a new
    process, after the same eviction (or warming) as the loads beside it, with its clock started as long after
    the previous measured process ended (start_at) and holding as much memory as this package's load process had
    when its clock started (hold), so it meets the memory and page cache they meet. The in-process ceilings
    above recycle memory unmapped a moment before, which a new process after a pause does not get (on a VM with
    free page reporting that memory has gone back to the host and each page is faulted in again on first touch)."""

    def __init__(self, ceilings: Ceilings) -> None:
        self.ceilings = ceilings

    def __call__(self, request: Dict[str, Any]) -> Dict[str, Any]:
        if self.ceilings.exe is None:
            raise MeasurementError("no C compiler: ceiling not measured")
        path = request["path"]
        # The C process waits for the start itself (CEILINGS_START_AT), as a Python load does after its imports,
        # holding what such a load's process holds (request["hold"] bytes: CEILINGS_HOLD_BYTES).
        extra = pagecache.prepare(*pagecache.setup_of(request))
        start_at = pagecache.start_of(request)
        env = {"CEILINGS_HOLD_BYTES": str(request.get("hold", 0))}
        if start_at is not None:
            env["CEILINGS_START_AT"] = repr(start_at)
        r = self.ceilings._run("pread", path, request["threads"], 1, request["memory"], env=env)
        return {"seconds": r["seconds"][0], "bytes": r["bytes"], "late_seconds": r["late_seconds"],
                "held_bytes": r["held_bytes"], **extra}

    def close(self) -> None:
        pass


def direct_ceiling(res: Results, size: int) -> Optional[Dict[str, Any]]:
    """The fastest of the cold O_DIRECT ceiling rows of `size` (Ceilings.direct), or None."""
    rows = [res.get(keys.direct(size, d)) for d in keys.DIRECT_DEPTHS]
    rows += [res.get(keys.direct(size, d, uring=True)) for d in keys.URING_DEPTHS]
    rows = [r for r in rows if r and r.get("seconds")]
    return min(rows, key=median) if rows else None


def fresh_ceiling(res: Results, temp: str, size: int) -> Optional[Dict[str, Any]]:
    """What case 8's loads of `size` are held against: the same read in a new process in the loads' own rounds
    (FreshCeiling) where it was measured; otherwise cold, the cold pread ceiling, and warm, the faster of the
    two ways of reading into fresh memory (plain, or each step faulted in first)."""
    own = res.get(keys.fresh_ceiling(temp, size))
    if own and not own.get("error"):
        return own
    if temp == "cold":
        return res.get(keys.ceiling("pread_cold", size))
    rows = [r for r in (res.get(keys.ceiling("pread_fresh", size)), res.get(keys.ceiling("pread_fresh_pop", size)))
            if r]
    return min(rows, key=median) if rows else None

