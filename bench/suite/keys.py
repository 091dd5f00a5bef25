"""The row keys of a run: one function per kind of row builds its key, and every place that adds a row
(the cases, the ceilings) or reads one (targets, observations, the plot) calls the same function. A
misspelt function is an AttributeError, and a value outside the names a kind of row has (an implementation,
a method, a backend) is a ValueError, instead of a row that silently shows as "not measured".

The keys are the strings bench/results.json has always stored ("3/536870912/ours/st_pread"), so that
`bench/run.py --render` reads the samples of earlier runs.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

# The two implementations of the format that most cases compare.
IMPLS = ("ours", "ref")
# Case 1: what is timed after safe_open.
OPEN_WHAT = ("open+keys", "open+keys+shapes")
# Cases 3 and 4: the ways this package and the reference load a whole file.
LOAD_METHODS = ("st_pread", "st_mmap_clone", "st_mmap_touch")
# Cases 3 and 4: the loads that are not safetensors files (no method in the key).
BASELINES = ("torch", "numpy")
# Case 3: this package's reads into a pre-faulted buffer (API, backend).
PREALLOC = (("read_many", "pread"), ("read_range", "pread"), ("read_many", "mmap"))
BACKENDS = ("mmap", "pread")
FRAMEWORKS = ("pt", "np")
SYNCS = ("nofsync", "fsync")
TEMPS = ("warm", "cold")
# Case 8's rows (suite/case_fresh.py FRESH has each row's implementation, server and method), and the
# other ways to get the same tensors in memory of their own, the reference's and torch.load included:
# case 8's "fastest peer" is the fastest of these.
FRESH_ROWS = ("ours", "ours_direct", "ours_auto", "ref", "runai", "runai_io_uring", "fst", "fst_odirect", "torch",
              "ours_lazy", "ref_lazy")
PEER_ROWS = ("ref", "torch", "runai", "runai_io_uring", "fst", "fst_odirect")
# The ceilings of bench/ceilings.c with one row per size.
CEILINGS = ("memcpy", "touch", "touch_thp", "touch_thp_idle", "pread_warm", "pread_fresh", "pread_fresh_thp",
            "pread_fresh_pop", "pread_cold", "write", "write_fsync")
# Reads in flight for the cold O_DIRECT ceiling rows: from as many threads, and from one thread's io_uring.
DIRECT_DEPTHS = (1, 2, 4, 8, 16)
URING_DEPTHS = (4, 16)
# Case 8's small-tensor file, in place of a size.
TINY = "tiny"


def _check(value: object, allowed: Sequence[object], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(map(repr, allowed))}")
    return str(value)


def _size(size: int) -> str:
    if not isinstance(size, int) or isinstance(size, bool):
        raise ValueError(f"a size in bytes, not {size!r}")
    return str(size)


def open_keys(what: str, count: int, impl: str) -> str:
    """Case 1: safe_open + keys (+ shapes) of a file of `count` tensors."""
    return f"1/{_check(what, OPEN_WHAT, 'case 1 step')}/{_size(count)}/{_check(impl, IMPLS, 'implementation')}"


def lazy(size: int, impl: str) -> str:
    """Case 2: a lazy load (mmap) by `impl` (this package, the reference, torch, numpy)."""
    return f"2/{_size(size)}/{_check(impl, IMPLS + BASELINES, 'implementation')}"


def _load(case: str, size: int, impl: str, method: Optional[str], impls: Sequence[str]) -> str:
    if method is None:
        return f"{case}/{_size(size)}/{_check(impl, BASELINES, 'baseline')}"
    return f"{case}/{_size(size)}/{_check(impl, impls, 'implementation')}/{_check(method, LOAD_METHODS, 'method')}"


def warm(size: int, impl: str, method: Optional[str] = None) -> str:
    """Case 3: a materialized warm load by this package ("ours", or "ours_thp": torch allocating huge pages)
    or the reference with `method`, or by torch or numpy (no method)."""
    return _load("3", size, impl, method, IMPLS + ("ours_thp",))


def prealloc(size: int, api: str, backend: str) -> str:
    """Case 3: this package's read_many or read_range into one pre-faulted buffer."""
    _check((api, backend), PREALLOC, "pre-faulted read")
    return f"3/{_size(size)}/prealloc/{api}/{backend}"


def cold(size: int, impl: str, method: Optional[str] = None) -> str:
    """Case 4: a cold load by this package or the reference with `method`, or by torch or numpy (no method)."""
    return _load("4", size, impl, method, IMPLS)


def cold_all(size: int) -> str:
    """Case 4's one row where the page cache cannot be emptied here."""
    return f"4/{_size(size)}"


def save(size: int, impl: str, sync: str) -> str:
    """Case 5: a save by `impl`, with or without fsync."""
    return f"5/{_size(size)}/{_check(impl, IMPLS + BASELINES, 'implementation')}/{_check(sync, SYNCS, 'sync')}"


def slicing(size: int, backend: str, impl: str, views: bool = False) -> str:
    """Case 6: 1/8 of the columns of every 2-D tensor, made contiguous, or with `views` (mmap only) as returned."""
    if views:
        _check(backend, ("mmap",), "backend of the views")
    key = f"6/{_size(size)}/{_check(backend, BACKENDS, 'backend')}/{_check(impl, IMPLS, 'implementation')}"
    return key + "/views" if views else key


def get_tensor(framework: str, backend: str, impl: str) -> str:
    """Case 7: get_tensor of every tensor of the small-tensor file, per tensor."""
    return (f"7/{_check(framework, FRAMEWORKS, 'framework')}/{_check(backend, BACKENDS, 'backend')}/"
            f"{_check(impl, IMPLS, 'implementation')}")


def _fresh_size(size: Union[int, str, None]) -> str:
    if size is None or isinstance(size, str):
        return TINY if size is None else _check(size, (TINY,), "case 8 file")
    return _size(size)


def fresh(temp: str, size: Union[int, str, None], row: str) -> str:
    """Case 8: one load per new interpreter, warm or cold, of a file of `size` (None or TINY: the
    small-tensor file) by the row of FRESH_ROWS."""
    return f"8/{_check(temp, TEMPS, 'temperature')}/{_fresh_size(size)}/{_check(row, FRESH_ROWS, 'case 8 row')}"


def fresh_all(temp: str, size: Union[int, str, None]) -> str:
    """Case 8's one row of a temperature where the page cache cannot be emptied here."""
    return f"8/{_check(temp, TEMPS, 'temperature')}/{_fresh_size(size)}"


def ceiling(name: str, size: int) -> str:
    """A ceiling of bench/ceilings.c measured in the run's own process (suite/ceilings.py Ceilings)."""
    return f"C/{_check(name, CEILINGS, 'ceiling')}/{_size(size)}"


def direct(size: int, depth: int, uring: bool = False) -> str:
    """The cold O_DIRECT ceiling with `depth` reads in flight, from as many threads or one thread's io_uring."""
    if uring:
        return f"C/direct_uring/{_size(size)}/{_check(depth, URING_DEPTHS, 'io_uring depth')}"
    return f"C/direct/{_size(size)}/{_check(depth, DIRECT_DEPTHS, 'depth')}"


def fresh_ceiling(temp: str, size: int) -> str:
    """Case 8's ceiling: the read into fresh memory in a new process, in the loads' own rounds."""
    return f"C/fresh_proc/{_check(temp, TEMPS, 'temperature')}/{_size(size)}"
