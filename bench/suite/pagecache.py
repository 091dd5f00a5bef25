"""Page cache and memory accounting for the benchmarks, torch-free: residency by mincore, eviction, warming,
this process's RSS and peak RSS, and durable writes. The measuring children (bench/worker.py), the ceilings
of bench/run.py and the other scripts of bench/ (through worker.py) all use these."""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import time
from typing import Any, Dict, Optional, Sequence, Tuple

PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_fraction(path: str) -> float:
    """Fraction of the file's pages in the page cache, by mincore() over a fresh shared mapping of it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0.0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(b & 1 for b in bytes(vec)) / pages
        finally:
            _libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def evict(path: str) -> float:
    """Drops the file's clean pages from the page cache (posix_fadvise DONTNEED, after an fdatasync so no
    page is dirty) and returns the fraction still resident afterwards, checked with mincore."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_fraction(path)


def warm(path: str) -> None:
    """Reads the file once so every page is in the page cache."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(8 << 20)
        while f.readinto(buf):
            pass


# A measured load whose clock started more than this after its start_at is reported as late.
LATE_SECONDS = 0.05


def wait_until(start_at: float) -> float:
    """Sleeps until `start_at` on time.monotonic()'s clock (CLOCK_MONOTONIC, shared by every process of the
    machine, bench/ceilings.c's CEILINGS_START_AT included); returns how many seconds past it this returns
    (0: on time)."""
    left = start_at - time.monotonic()
    if left > 0:
        time.sleep(left)
        return 0.0
    return -left


def start_after(idle: float) -> float:
    """The moment a measured load whose request is sent now starts its clock: `idle` seconds from now. The
    harness calls it right after the previous measured process ended, so a load in a new interpreter (start-up
    and imports inside the pause) and a C ceiling (none) both meet memory that was freed `idle` seconds before
    their clocks start. On a VM with free page reporting that matters more than anything the load does: the
    host takes freed memory back over tens of seconds, and on this machine a C fill of 6 GiB into memory freed
    20 s before took about 3x as long as into memory freed 0.3 s before, so a row that started 1.5 s later
    than another met measurably dearer memory."""
    return time.monotonic() + idle


def start_of(request: Dict[str, Any]) -> Optional[float]:
    """When a measured load's clock starts: the request's "start_at" where the harness stamped one, otherwise
    "idle" seconds from now where the request has an idle, otherwise None (at once)."""
    if "start_at" in request:
        return request["start_at"]
    return start_after(request["idle"]) if request.get("idle") else None


def setup_of(request: Dict[str, Any]) -> Tuple[str, bool, Tuple[str, ...], bool]:
    """prepare's arguments for a measured read's request: the file it reads (request["pt"], the checkpoint in
    torch's format, for a torch method; else request["path"]), whether cold (request["evict"]), the request's
    other files (evicted) and whether to read the file first where warm (request["warm"], default yes)."""
    path, pt = request["path"], request.get("pt", "")
    src = pt if str(request.get("method", "")).startswith("torch") else path
    others = (path, pt, *request.get("others", ()))
    return src, bool(request.get("evict")), others, bool(request.get("warm", True))


def prepare(path: str, cold: bool, others: Sequence[str] = (), read: bool = True,
            start_at: Optional[float] = None) -> Dict[str, float]:
    """Sets the page cache up for one measured read of `path`, as a user's load would meet it: the run's other
    files (`others`: the same checkpoint in torch's format) evicted, so that only `path` can be cached and a
    6 GiB load does not meet 12 GiB of page cache, and (cold) `path` evicted too, or (warm, with `read`) `path`
    read once; then, given `start_at` (start_after), a wait until then, so that the memory those evictions and
    the previous measurement freed sits idle for the same time before every row's clock, as before a user's
    new process (on a VM with free page reporting, memory freed a moment ago is far cheaper than idle memory,
    and reporting gigabytes of it to the host takes CPU time from a measurement that starts at once). Returns
    "late_seconds" (how far past start_at the wait ended: the row started late) where it waited, and (cold)
    the fraction of `path` still resident as resident_before."""
    dropped = [other for other in others if other and other != path] + ([path] if cold else [])
    for other in dropped:
        if os.path.exists(other):
            evict(other)
    if read and not cold:
        warm(path)
    out: Dict[str, float] = {}
    if start_at is not None:
        out["late_seconds"] = wait_until(start_at)
    if cold:
        out["resident_before"] = resident_fraction(path)
    return out


def memory() -> Dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of this process, in bytes."""
    with open("/proc/self/status") as f:
        fields = dict(re.findall(r"^(Vm\w+):\s+(\d+) kB", f.read(), re.M))
    return {"rss": int(fields["VmRSS"]) * 1024, "hwm": int(fields["VmHWM"]) * 1024}


def reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux clear_refs 5); False where that is not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def fsync_path(path: str) -> None:
    """Makes a written file and its directory entry durable (what save_file(fsync=True) does)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
