"""Cases 2 to 6, which share one model-sized file per size (model_file writes it, with a torch.save of the
same tensors, and measures the ceilings of that size): 2, lazy load_file (mmap); 3, materialized load,
warm page cache, and reads into pre-faulted buffers; 4, materialized load, cold page cache; 5, save, with
and without fsync; 6, tensor-parallel slicing."""

from __future__ import annotations

import os
import shutil

from suite import keys
from suite.common import GiB, IMPL, METHOD, size_name
from suite.machine import mem_available
from suite.runner import Runner


def model_file(run: Runner, size: int) -> None:
    """Writes the file of `size` (if disk and memory allow), measures the selected cases on it, removes it."""
    name = size_name(size)
    free = shutil.disk_usage(run.tmp).free
    if free < 3 * size + GiB:
        run.res.notes.append(f"{name}: skipped, only {free / GiB:.1f} GiB free in {run.tmp} (needs "
                             f"{(3 * size + GiB) / GiB:.1f} GiB)")
        print(run.res.notes[-1])
        return
    if mem_available() < 3 * size + GiB:
        run.res.notes.append(f"{name}: skipped, only {mem_available() / GiB:.1f} GiB of memory available")
        print(run.res.notes[-1])
        return
    st = str(run.tmp / f"model-{name.replace(' ', '')}.safetensors")
    pt = st[: -len(".safetensors")] + ".pt"
    loads = run.want("2") or run.want("3") or (run.want("4") and size == run.cfg["cold_size"])
    slices = run.want("6") and size == run.cfg["slice_size"]
    if loads or slices:
        made = run.servers["ours"]({"op": "make", "path": st, "pt": pt if loads else "", "bytes": size,
                                    "hidden": run.cfg["hidden"]})
        print(f"         wrote {name}: {made['tensors']} bf16 tensors, header {made['data_offset']} bytes")
    try:
        if run.want("3") or run.want("4"):
            run.ceil.memory(size, idle=size == min(run.cfg["sizes"]))
        if run.want("3"):
            run.ceil.warm_pread(st, size)
        if run.want("2"):
            lazy(run, st, pt, size)
        if run.want("3"):
            warm(run, st, pt, size)
        if run.want("4") and size == run.cfg["cold_size"]:
            cold(run, st, pt, size)
        if slices:
            slicing(run, st, size)
    finally:
        for p in (st, pt):
            if os.path.exists(p):
                os.unlink(p)
    if run.want("5"):
        run.ceil.write(size, run.tmp)
        save(run, size)


def lazy(run: Runner, st: str, pt: str, size: int) -> None:
    """Case 2: load_file() on mmap, both implementations, against torch.load(mmap=True) and np.memmap."""
    group = f"lazy {size_name(size)}"
    with run.interleaved():
        for impl, server, method in (("ours", "ours", "st_mmap"), ("ref", "ref", "st_mmap"),
                                     ("torch", "ours", "torch_load_mmap"), ("numpy", "ours", "np_memmap")):
            run.repeat(keys.lazy(size, impl), "2", group, f"{IMPL[impl]}: {METHOD[method]}", server,
                       {"op": "load", "method": method, "path": st, "pt": pt})


def warm(run: Runner, st: str, pt: str, size: int) -> None:
    """Case 3: materialized loads with the file in the page cache, then reads into a pre-faulted buffer."""
    group = f"warm {size_name(size)}"
    with run.interleaved():
        for impl in keys.IMPLS:
            for method in keys.LOAD_METHODS:
                run.repeat(keys.warm(size, impl, method), "3", group, f"{IMPL[impl]}: {METHOD[method]}", impl,
                           {"op": "load", "method": method, "path": st, "pt": pt})
        if "ours_thp" in run.servers:
            run.repeat(keys.warm(size, "ours_thp", "st_pread"), "3", group, "this package, torch allocating with "
                       f"THP_MEM_ALLOC_ENABLE=1: {METHOD['st_pread']}", "ours_thp",
                       {"op": "load", "method": "st_pread", "path": st, "pt": pt})
        run.repeat(keys.warm(size, "torch"), "3", group, f"torch: {METHOD['torch_load']}", "ours",
                   {"op": "load", "method": "torch_load", "path": st, "pt": pt})
        run.repeat(keys.warm(size, "numpy"), "3", group, f"numpy: {METHOD['np_fromfile']}", "ours",
                   {"op": "load", "method": "np_fromfile", "path": st, "pt": pt})
    for api, backend in keys.PREALLOC:
        run.inner(keys.prealloc(size, api, backend), "3", group,
                  f"this package: File({backend}).{api} into a pre-faulted buffer", "ours",
                  {"op": "prealloc", "path": st, "api": api, "backend": backend})


def cold(run: Runner, st: str, pt: str, size: int) -> None:
    """Case 4: the same loads with the file evicted from the page cache just before each."""
    group = f"cold {size_name(size)}"
    if not run.can_evict:
        run.res.fail(keys.cold_all(size), "4", group, "every implementation",
                     "page-cache eviction is not possible here")
        return
    run.ceil.cold_pread(st, size)
    with run.interleaved():
        for impl in keys.IMPLS:
            for method in keys.LOAD_METHODS:
                run.repeat(keys.cold(size, impl, method), "4", group, f"{IMPL[impl]}: {METHOD[method]}", impl,
                           {"op": "load", "method": method, "path": st, "pt": pt, "evict": True})
        run.repeat(keys.cold(size, "torch"), "4", group, f"torch: {METHOD['torch_load']}", "ours",
                   {"op": "load", "method": "torch_load", "path": st, "pt": pt, "evict": True})
        run.repeat(keys.cold(size, "numpy"), "4", group, f"numpy: {METHOD['np_fromfile']}", "ours",
                   {"op": "load", "method": "np_fromfile", "path": st, "pt": pt, "evict": True})


def slicing(run: Runner, st: str, size: int) -> None:
    """Case 6: rank k of 8 takes 1/8 of the columns of every 2-D tensor, made contiguous, then as returned."""
    group = f"slice {size_name(size)}"
    with run.interleaved():
        for backend in keys.BACKENDS:
            for impl in keys.IMPLS:
                run.repeat(keys.slicing(size, backend, impl), "6", group,
                           f"{IMPL[impl]}: get_slice(name)[:, k*cols//8:(k+1)*cols//8], {backend}", impl,
                           {"op": "slice", "path": st, "backend": backend}, vary="k")
        # The slices as returned: views of the mapping on mmap (both implementations), not made contiguous.
        for impl in keys.IMPLS:
            run.repeat(keys.slicing(size, "mmap", impl, views=True), "6", group,
                       f"{IMPL[impl]}: get_slice(name)[:, k*cols//8:(k+1)*cols//8], mmap, as returned", impl,
                       {"op": "slice", "path": st, "backend": "mmap", "contiguous": False}, vary="k")


def save(run: Runner, size: int) -> None:
    """Case 5: save_file of both implementations, torch.save and numpy's raw bytes, then the same + fsync."""
    group = f"save {size_name(size)}"
    out = str(run.tmp / "saved.out")
    for fsync in (False, True):
        with run.interleaved():
            for impl, server, method, what in (("ours", "ours", "st", "save_file"), ("ref", "ref", "st", "save_file"),
                                               ("torch", "ours", "torch", "torch.save"),
                                               ("numpy", "ours", "np", "ndarray.tofile of every tensor")):
                if fsync and impl == "torch":
                    continue  # the durable-write baseline is numpy's (raw bytes + fsync); this saves minutes
                label = f"{IMPL[impl]}: {what}" + (" + fsync" if fsync else "")
                run.repeat(keys.save(size, impl, "fsync" if fsync else "nofsync"), "5", group, label, server,
                           {"op": "save", "method": method, "path": out, "bytes": size, "hidden": run.cfg["hidden"],
                            "fsync": fsync})
