"""Cases 1 and 7, which share their files of many small tensors: 1, open + keys (+ every shape) of files with
1k, 20k and 100k tensors; 7, get_tensor's per-tensor overhead on the 20k-tensor file."""

from __future__ import annotations

import os

from suite import keys
from suite.common import IMPL, count_name
from suite.runner import Runner


def small_files(run: Runner) -> None:
    """Writes each small-tensor file the selected cases need, measures cases 1 and 7 on it, removes it."""
    counts = list(run.cfg["counts"]) if run.want("1") else []
    if run.want("7") and run.cfg["get_tensor_count"] not in counts:
        counts.append(run.cfg["get_tensor_count"])
    for n in sorted(counts):
        path = str(run.tmp / f"tiny-{n}.safetensors")
        run.servers["ours"]({"op": "make", "path": path, "tiny": n})
        group = f"{count_name(n)} tensors"
        if run.want("1") and n in run.cfg["counts"]:
            for shapes in (False, True):
                what = "open+keys+shapes" if shapes else "open+keys"
                for impl in keys.IMPLS:
                    run.inner(keys.open_keys(what, n, impl), "1", group, f"{IMPL[impl]}: {what}", impl,
                              {"op": "open", "path": path, "shapes": shapes})
        if run.want("7") and n == run.cfg["get_tensor_count"]:
            for framework in keys.FRAMEWORKS:
                for backend in keys.BACKENDS:
                    for impl in keys.IMPLS:
                        run.inner(keys.get_tensor(framework, backend, impl), "7", group,
                                  f'{IMPL[impl]}: get_tensor, "{framework}", {backend}', impl,
                                  {"op": "get_tensor", "path": path, "framework": framework, "backend": backend})
        os.unlink(path)
