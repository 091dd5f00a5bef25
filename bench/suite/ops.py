"""What the measuring children of bench/worker.py run: the benchmark files' layouts and one function per
request op (OPS maps the op name of a request to it). Each takes the request dict and returns what it
measured as a dict; times are time.perf_counter() seconds. The frameworks are imported lazily, inside the
ops, so that the fork server pays for them once, before any child starts."""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

from suite.pagecache import PAGE, fsync_path, memory, prepare, reset_peak, setup_of, start_of, warm

# ---------------------------------------------------------------------------------------------------------
# Model layouts: which tensors a benchmark file holds

def model_layout(total_bytes: int, hidden: int) -> List[Tuple[str, List[int]]]:
    """An LLM-like bf16 state dict of about `total_bytes`: per layer four square attention projections, three
    MLP matrices (hidden x 2.75 hidden) and two norm vectors, as many layers as fit, then one last matrix
    that fills up the remainder."""
    mlp = hidden * 11 // 4
    per_layer = [("self_attn.q_proj.weight", [hidden, hidden]), ("self_attn.k_proj.weight", [hidden, hidden]),
                 ("self_attn.v_proj.weight", [hidden, hidden]), ("self_attn.o_proj.weight", [hidden, hidden]),
                 ("mlp.gate_proj.weight", [mlp, hidden]), ("mlp.up_proj.weight", [mlp, hidden]),
                 ("mlp.down_proj.weight", [hidden, mlp]), ("input_layernorm.weight", [hidden]),
                 ("post_attention_layernorm.weight", [hidden])]
    layer_bytes = sum(2 * _numel(s) for _, s in per_layer)
    out: List[Tuple[str, List[int]]] = []
    used = 0
    i = 0
    while used + layer_bytes <= total_bytes:
        out += [(f"model.layers.{i}.{n}", s) for n, s in per_layer]
        used += layer_bytes
        i += 1
    rows = (total_bytes - used) // (2 * hidden)
    if rows:
        out.append(("lm_head.weight", [rows, hidden]))
    return out


def tiny_layout(count: int) -> List[Tuple[str, List[int], str]]:
    """`count` small tensors named like a transformer's, F32 and F16 (numpy has both, so the reference's numpy side can read them too)."""
    return [(f"model.layers.{i // 16}.mlp.proj_{i % 16}.weight", [4, 2], "F32" if i % 3 == 0 else "F16")
            for i in range(count)]


def _numel(shape: List[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ---------------------------------------------------------------------------------------------------------
# Operations (run in a child; they import the frameworks lazily so the server pays for them once)

def _state(layout: List[Tuple[str, List[int]]]) -> Dict[str, Any]:
    """bf16 tensors of `layout`, every page written (a distinct fill per tensor, no zero pages)."""
    import torch

    state = {}
    for i, (name, shape) in enumerate(layout):
        t = torch.empty(shape, dtype=torch.bfloat16)
        t.view(torch.int16).fill_(1 + i % 30000)
        state[name] = t
    return state


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _touch(state: Dict[str, Any]) -> None:
    """Reads one byte of every 4 KiB page of every tensor."""
    import torch

    for t in state.values():
        if t.numel():
            t.reshape(-1).view(torch.uint8)[::PAGE].sum()


def op_identify(p: Dict[str, Any]) -> Dict[str, Any]:
    import numpy
    import torch

    import safetensors

    return {"safetensors": safetensors.__version__, "file": safetensors.__file__, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "numpy": numpy.__version__, "python": sys.version.split()[0]}


def op_make(p: Dict[str, Any]) -> Dict[str, Any]:
    """Writes the benchmark files: p["path"] (safetensors, this layout) and, if asked, p["pt"] (torch.save of
    the same tensors); both fsynced, so that their pages are clean and can be evicted later."""
    import torch

    from safetensors.torch import save_file

    if "tiny" in p:
        dtypes = {"F32": torch.float32, "F16": torch.float16}
        state = {n: torch.ones(s, dtype=dtypes[d]) for n, s, d in tiny_layout(p["tiny"])}
    else:
        state = _state(model_layout(p["bytes"], p["hidden"]))
    save_file(state, p["path"])
    fsync_path(p["path"])
    if p.get("pt"):
        torch.save(state, p["pt"])
        fsync_path(p["pt"])
    with open(p["path"], "rb") as f:
        header = int.from_bytes(f.read(8), "little")
    return {"tensors": len(state), "bytes": _nbytes(state.values()), "data_offset": 8 + header}


def _timed(once: Callable[[], Any], reps: int) -> List[float]:
    """Seconds of each of `reps` calls of `once`, after one untimed warm-up call."""
    once()
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        seconds.append(time.perf_counter() - t0)
    return seconds


def op_open(p: Dict[str, Any]) -> Dict[str, Any]:
    """safe_open + keys() (+ every tensor's shape through get_slice), p["reps"] times after one warm-up."""
    from safetensors import safe_open

    path, shapes = p["path"], p["shapes"]

    def once() -> int:
        with safe_open(path, "pt") as f:
            keys = f.keys()
            if shapes:
                for k in keys:
                    f.get_slice(k).get_shape()
        return len(keys)

    return {"seconds": _timed(once, p["reps"])}


def op_get_tensor(p: Dict[str, Any]) -> Dict[str, Any]:
    """Seconds per get_tensor call over every tensor of a file, within one safe_open (keys listed first)."""
    from safetensors import safe_open

    seconds = []
    with safe_open(p["path"], p["framework"], backend=p["backend"]) as f:
        keys = f.keys()
        for rep in range(p["reps"] + 1):
            out = []
            t0 = time.perf_counter()
            for k in keys:
                out.append(f.get_tensor(k))
            t = time.perf_counter() - t0
            if rep:  # the first pass is a warm-up
                seconds.append(t / len(keys))
            del out
    return {"seconds": seconds}


def data_offset(path: str) -> int:
    """Where a safetensors file's data buffer starts: 8 bytes of header length, then the header."""
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def _load(method: str, path: str, pt: str) -> Tuple[Any, int]:
    """One way of getting a file's tensors; returns (what keeps them alive, bytes)."""
    import numpy as np
    import torch

    if method == "np_fromfile":
        arr = np.fromfile(path, dtype=np.uint8, offset=data_offset(path))
        return arr, arr.nbytes
    if method.startswith("torch_load"):
        state = torch.load(pt, weights_only=True, mmap=method.startswith("torch_load_mmap"))
    elif method == "np_memmap":
        arr = np.memmap(path, dtype=np.uint8, mode="r", offset=data_offset(path))
        return arr, arr.nbytes
    elif method.startswith("runai"):
        # Run:ai model streamer; owned=True (its default) hands every tensor to the caller, so no copy is
        # needed to keep them. The reader strategy was chosen by _import_peer.
        from runai_model_streamer import SafetensorsStreamer

        with SafetensorsStreamer() as streamer:
            streamer.stream_file(path)
            state = dict(streamer.get_tensors())
    elif method.startswith("fst"):
        # fastsafetensors on the CPU without GDS (its pread copier); O_DIRECT or not chosen by _import_peer.
        from fastsafetensors import fastsafe_open

        with fastsafe_open(path, framework="pt", device="cpu", nogds=True) as f:
            state = {k: f.get_tensor(k) for k in f.keys()}
    else:
        from safetensors.torch import load_file

        backend = {"st_pread": "pread", "st_direct": "direct", "st_auto": "auto"}.get(method, "mmap")
        state = load_file(path, backend=backend)
        if method == "st_mmap_clone":
            state = {k: v.clone() for k, v in state.items()}
        elif method == "st_mmap_touch":
            _touch(state)
    if method == "torch_load_mmap_touch":
        _touch(state)
    return state, _nbytes(state.values())


def _import_peer(method: str) -> None:
    """Imports a peer (case 8) before the clock starts, with the environment that selects its reader."""
    if method.startswith("runai"):
        if method == "runai_io_uring":
            os.environ["RUNAI_STREAMER_FS_STRATEGY"] = "io_uring_buffered"
        import runai_model_streamer  # noqa: F401
    elif method.startswith("fst"):
        os.environ["FASTSAFETENSORS_ODIRECT"] = "1" if method == "fst_odirect" else "0"
        import fastsafetensors  # noqa: F401


def op_load(p: Dict[str, Any]) -> Dict[str, Any]:
    """One load by p["method"], its clock started at p["start_at"] (pagecache.start_after: the harness's
    previous measured process ended p["idle"] seconds before), or p["idle"] seconds from now; with p["evict"],
    the file it reads is evicted first (checked with mincore), and the other file of the request (the
    checkpoint in the other format) always is (pagecache.prepare). The peer's imports come first, inside the
    pause."""
    method, path, pt = p["method"], p["path"], p.get("pt", "")
    _import_peer(method)
    out: Dict[str, Any] = prepare(*setup_of(p), start_at=start_of(p))
    reset_peak()
    m0 = memory()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    state, nbytes = _load(method, path, pt)
    t = time.perf_counter() - t0
    # Page faults and CPU time the load took (every thread of the process, those that ended included): how its
    # destinations met fresh memory, and how much of the time the kernel spent.
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    m1 = memory()
    out.update(seconds=t, bytes=nbytes, rss_before=m0["rss"], rss_delta=m1["rss"] - m0["rss"],
               peak_delta=m1["hwm"] - m0["rss"],
               minor_faults=r1.ru_minflt - r0.ru_minflt, user_seconds=r1.ru_utime - r0.ru_utime,
               sys_seconds=r1.ru_stime - r0.ru_stime)
    del state
    return out


def op_prealloc(p: Dict[str, Any]) -> Dict[str, Any]:
    """This package's native reads into one already-faulted buffer: read_many (one request per tensor, the
    loader's path) or read_range (the whole data buffer), p["reps"] times after one warm-up."""
    import torch

    from safetensors import _safetensors_cpp as cpp

    path = p["path"]
    warm(path)
    f = cpp.File(path, p["backend"])
    infos = f.infos()
    size = f.size - f.data_offset
    buf = torch.empty(size, dtype=torch.uint8)
    buf.fill_(0)  # fault every page in before timing
    base = buf.data_ptr()
    if p["api"] == "read_many":
        items = [(name, base + begin, end - begin) for name, (_, _, begin, end) in infos if end > begin]

        def once() -> None:
            f.read_many(items)
    else:

        def once() -> None:
            f.read_range(0, base, size)

    return {"seconds": _timed(once, p["reps"]), "bytes": size}


def op_slice(p: Dict[str, Any]) -> Dict[str, Any]:
    """Tensor-parallel rank k of 8: columns [k*cols//8, (k+1)*cols//8) of every 2-D tensor, made contiguous
    (a no-op where the library returns contiguous memory; a copy of strided views of the mapping) unless
    p["contiguous"] is False."""
    from safetensors import safe_open

    path, k = p["path"], p["k"]
    warm(path)
    reset_peak()
    m0 = memory()
    t0 = time.perf_counter()
    parts = []
    with safe_open(path, "pt", backend=p["backend"]) as f:
        for name in f.keys():
            sl = f.get_slice(name)
            shape = sl.get_shape()
            if len(shape) != 2:
                continue
            cols = shape[1]
            t = sl[:, k * cols // 8 : (k + 1) * cols // 8]
            if p.get("contiguous", True) and not t.is_contiguous():
                t = t.contiguous()
            parts.append(t)
    t = time.perf_counter() - t0
    m1 = memory()
    return {"seconds": t, "bytes": _nbytes(parts), "tensors": len(parts), "rss_delta": m1["rss"] - m0["rss"],
            "peak_delta": m1["hwm"] - m0["rss"]}


def op_save(p: Dict[str, Any]) -> Dict[str, Any]:
    """Saves a freshly built state dict with p["method"] (st: save_file, torch: torch.save, np: the same bytes
    written with ndarray.tofile), with or without fsync; peak RSS above the RSS before the call."""
    import torch

    state = _state(model_layout(p["bytes"], p["hidden"]))
    nbytes = _nbytes(state.values())
    path, method, fsync = p["path"], p["method"], p["fsync"]
    if method == "np":
        arrays = [t.reshape(-1).view(torch.uint8).numpy() for t in state.values()]
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    reset_peak()
    m0 = memory()
    t0 = time.perf_counter()
    if method == "st":
        import inspect

        from safetensors.torch import save_file

        if "fsync" in inspect.signature(save_file).parameters:
            save_file(state, path, fsync=fsync)
        else:  # the reference has no fsync option: the same durability by hand
            save_file(state, path)
            if fsync:
                fsync_path(path)
    elif method == "torch":
        torch.save(state, path)
        if fsync:
            fsync_path(path)
    elif method == "np":
        with open(path, "wb") as f:
            for a in arrays:
                a.tofile(f)
        if fsync:
            fsync_path(path)
    else:
        raise ValueError(method)
    t = time.perf_counter() - t0
    m1 = memory()
    os.unlink(path)
    return {"seconds": t, "bytes": nbytes, "peak_delta": m1["hwm"] - m0["rss"], "rss_before": m0["rss"]}


OPS: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
    "identify": op_identify,
    "make": op_make,
    "open": op_open,
    "get_tensor": op_get_tensor,
    "load": op_load,
    "prealloc": op_prealloc,
    "slice": op_slice,
    "save": op_save,
}
