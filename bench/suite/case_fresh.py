"""Case 8, what a user sees: each load in a new interpreter that loads once (the model-sized files of
--fresh-sizes and the small-tensor file, warm and cold), this package through the page cache, direct
(O_DIRECT) and auto, against the peers (Run:ai model streamer, fastsafetensors), the reference and
torch.load, with the machine's ceiling run as a row of the same rounds."""

from __future__ import annotations

import os
import shutil
from typing import List, Optional, Tuple

from suite import keys
from suite.ceilings import direct_ceiling
from suite.common import GiB, IMPL, METHOD, count_name, size_name
from suite.machine import mem_available
from suite.runner import Runner

# In table order: (row of keys.FRESH_ROWS, implementation, server, method, lazy).
FRESH: List[Tuple[str, str, str, str, bool]] = [
    ("ours", "ours", "fresh_ours", "st_pread", False), ("ours_direct", "ours", "fresh_ours", "st_direct", False),
    ("ours_auto", "ours", "fresh_ours", "st_auto", False), ("ref", "ref", "fresh_ref", "st_mmap_clone", False),
    ("runai", "runai", "fresh_peers", "runai", False),
    ("runai_io_uring", "runai", "fresh_peers", "runai_io_uring", False),
    ("fst", "fst", "fresh_peers", "fst", False), ("fst_odirect", "fst", "fresh_peers", "fst_odirect", False),
    ("torch", "torch", "fresh_ours", "torch_load", False),
    ("ours_lazy", "ours", "fresh_ours", "st_mmap", True), ("ref_lazy", "ref", "fresh_ref", "st_mmap", True)]
assert tuple(row for row, *_ in FRESH) == keys.FRESH_ROWS


def fresh(run: Runner, size: Optional[int]) -> None:
    """Every load in a new interpreter (servers fresh_*), warm and cold; size None: the small-tensor file.
    The ceilings the targets need (first touch, warm pread into fresh memory, cold pread) are measured
    here too unless cases 3 and 4 already did for this size."""
    if size is None:
        n = run.cfg["fresh_count"]
        name, st, pt = f"{count_name(n)} tensors", str(run.tmp / f"fresh-tiny-{n}.safetensors"), ""
        run.servers["ours"]({"op": "make", "path": st, "tiny": n})
    else:
        name = size_name(size)
        free, avail = shutil.disk_usage(run.tmp).free, mem_available()
        if free < 2 * size + GiB or avail < 2 * size + 2 * GiB:
            run.res.notes.append(f"case 8, {name}: skipped, {free / GiB:.1f} GiB free disk and {avail / GiB:.1f} "
                                 f"GiB memory available (needs {(2 * size + GiB) / GiB:.0f} and "
                                 f"{(2 * size + 2 * GiB) / GiB:.0f})")
            print(run.res.notes[-1])
            return
        st = str(run.tmp / f"fresh-{name.replace(' ', '')}.safetensors")
        pt = st[: -len(".safetensors")] + ".pt"
        made = run.servers["ours"]({"op": "make", "path": st, "pt": pt, "bytes": size, "hidden": run.cfg["hidden"]})
        print(f"         wrote {name}: {made['tensors']} bf16 tensors, header {made['data_offset']} bytes")
    try:
        if size is not None:
            if run.res.get(keys.ceiling("touch", size)) is None:
                run.ceil.memory(size)
            if run.res.get(keys.ceiling("pread_fresh", size)) is None:
                run.ceil.warm_pread(st, size)
            if run.can_evict and run.res.get(keys.ceiling("pread_cold", size)) is None:
                run.ceil.cold_pread(st, size)
            if direct_ceiling(run.res, size) is None:
                run.ceil.direct(st, size)
        for temp in keys.TEMPS:
            if temp == "cold" and not run.can_evict:
                run.res.fail(keys.fresh_all("cold", size), "8", f"fresh, cold, {name}", "every implementation",
                             "page-cache eviction is not possible here")
                continue
            group = f"fresh, {temp}, {name}"
            with run.interleaved():
                for row, impl, server, method, lazy in FRESH:
                    if method == "torch_load" and not pt:
                        continue
                    if server not in run.servers:
                        continue
                    what = "lazy " + METHOD[method] if lazy else METHOD[method]
                    run.repeat(keys.fresh(temp, size, row), "8", group, f"{IMPL[impl]}: {what}", server,
                               {"op": "load", "method": method, "path": st, "pt": pt, "evict": temp == "cold",
                                "idle": run.cfg["fresh_idle"], "settle": os.path.getsize(st)})
                if size is not None and "fresh_ceiling" in run.servers:
                    # The machine's best buffered read into fresh memory in the loads' own conditions:
                    # each 512 KiB step faulted in first (the faster way in the in-process ceilings), on
                    # all CPUs warm and 8 threads cold (the best of the cold ceilings above).
                    threads = 8 if temp == "cold" else os.cpu_count() or 1
                    run.repeat(keys.fresh_ceiling(temp, size), "C", name,
                               f"{temp} pread into fresh memory in a new process after "
                               f"{run.cfg['fresh_idle']:g} s idle, holding this package's load process's RSS, "
                               f"each 512 KiB step faulted in first ({threads} threads)", "fresh_ceiling",
                               {"path": st, "evict": temp == "cold", "idle": run.cfg["fresh_idle"],
                                "others": [pt], "threads": threads, "memory": 3, "hold_like": "fresh_ours",
                                "settle": os.path.getsize(st)})
    finally:
        for p in (st, pt):
            if p and os.path.exists(p):
                os.unlink(p)
