"""The measuring side of bench/run.py: one process per implementation, each measurement in a fresh child.

    python bench/worker.py serve        fork server: imports torch, numpy and `safetensors` (whichever one
                                        PYTHONPATH selects: this package, or the reference from .ref) once,
                                        then for each JSON request on stdin forks a child that runs it and
                                        answers one JSON line on stdout
    python bench/worker.py once JSON    runs one request in this (fresh) interpreter and prints the answer

A forked child starts from the server's clean post-import state with nothing of earlier measurements in it:
its own address space, RSS measured from its start, peak RSS reset through /proc/self/clear_refs. That is
the "fresh process per measurement" of the benchmark without paying torch's import time (seconds on a busy
machine) for each one; `bench/run.py --spawn` uses `once` in new interpreters instead.

Everything a child measures is returned as a dict; times are time.perf_counter() seconds. This file holds the
protocol (serve, once, priming); the operations a request names are in bench/suite/ops.py, the page-cache
helpers in bench/suite/pagecache.py.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Callable, Dict

from suite.ops import OPS, data_offset
# The page-cache helpers, for the scripts and tests that import them from here (bench/sharded_rank.py,
# strided_crossover.py, tests/python/io/test_direct.py); bench/suite/pagecache.py holds them.
from suite.pagecache import evict, resident_fraction, warm  # noqa: F401


def prime() -> None:
    """Runs every kind of operation once on a tiny file, so that lazy imports and one-time initialisation
    (torch.load's unpickler, the native module's first calls, ...) happen before any measurement, in the
    server whose state every child inherits."""
    import tempfile

    import numpy as np
    import torch

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    def attempt(what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as e:  # that path's own measurements will report it
            print(f"worker: priming {what} failed: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)

    with tempfile.TemporaryDirectory() as d:
        st, pt = os.path.join(d, "t.safetensors"), os.path.join(d, "t.pt")
        state = {"a": torch.ones(16, 16, dtype=torch.bfloat16), "b": torch.zeros(3)}
        save_file(state, st)
        torch.save(state, pt)

        def use(framework: str, backend: str) -> None:
            with safe_open(st, framework, backend=backend) as f:
                f.get_tensor("b")  # F32: the reference's numpy side has no bfloat16
                f.get_slice("b")[1:2]

        for backend in ("mmap", "pread"):
            attempt(f"load_file {backend}", lambda backend=backend: load_file(st, backend=backend))
            for framework in ("pt", "np"):
                attempt(f"safe_open {framework} {backend}", lambda fw=framework, be=backend: use(fw, be))
        for mmap_ in (False, True):
            attempt("torch.load", lambda mmap_=mmap_: torch.load(pt, weights_only=True, mmap=mmap_))
        np.fromfile(st, dtype=np.uint8, offset=data_offset(st))
        {k: v.clone().contiguous() for k, v in state.items()}


def run_request(request: Dict[str, Any]) -> Dict[str, Any]:
    try:
        return {"ok": True, "result": OPS[request["op"]](request)}
    except BaseException as e:  # reported to run.py, which says which measurement failed
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


def freeze_imports() -> None:
    """Moves everything the imports created out of the cyclic collector's reach (gc.freeze). With torch
    imported, one full collection walks ~170k objects and takes ~165 ms here; without this it lands at random
    inside whichever measurement allocates enough objects (20k slice handles do), for either implementation."""
    import gc

    gc.collect()
    gc.freeze()


def serve() -> None:
    """Fork server: one child per request line; answers on the original stdout (children's prints, if any,
    go to stderr so they cannot corrupt the protocol)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import numpy  # noqa: F401  (imported once, here, for every child)
    import torch  # noqa: F401

    import safetensors.numpy  # noqa: F401
    import safetensors.torch  # noqa: F401

    prime()
    freeze_imports()
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, answer through the pipe, exit without running any cleanup
            os.close(r)
            try:
                data = json.dumps(run_request(request)).encode()
                with os.fdopen(w, "wb") as pipe:
                    pipe.write(data)
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        if not data:
            answer = {"ok": False, "error": f"measurement process died (wait status {status})"}
        else:
            answer = json.loads(data)
        out.write(json.dumps(answer) + "\n")


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "serve":
        serve()
    elif len(sys.argv) == 3 and sys.argv[1] == "once":
        prime()
        freeze_imports()
        print(json.dumps(run_request(json.loads(sys.argv[2]))))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
