"""Runs every read path of the package over one file, in a child process, and reports each outcome as JSON.

    python read_paths.py FILE BACKEND [--truncate PATH N]

FILE holds the tensors of ``tensors()``. Every handle is opened first; then, with --truncate, PATH (FILE
itself, or the file behind it on a FUSE mount) is cut to N bytes: a file that shrank after it was opened;
then each path reads. The last line of stdout is
a JSON list of ``{"path", "ok", "correct"}`` or ``{"path", "ok": false, "type", "message", "oserror",
"errno", "filename"}``. Before each
path its name goes to stderr, so a parent that sees this process die (SIGBUS) or hang knows where.

The zero-copy paths of the mmap backend (CPU tensors that are views of the mapping, and pt slices a view can
show) are left out: they cannot be protected (README, "Backends"); test_fuse_faults shows that limit once, in
a child of its own. Slices that read a copy on mmap too (a negative step, an integer list) are kept.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import sys
from typing import Any, Callable, Dict, List

import numpy as np
import torch

from safetensors import _safetensors_cpp as _cpp
from safetensors import safe_open
from safetensors._cli import main as cli_main
from safetensors.torch import load_file, save

ROWS, COLS = 256, 1024


def tensors() -> Dict[str, torch.Tensor]:
    """``a`` (4000 bytes, first in the file) and ``b`` (1 MiB, after it)."""
    return {
        "a": torch.arange(1000, dtype=torch.float32),
        "b": torch.arange(ROWS * COLS, dtype=torch.int32).reshape(ROWS, COLS),
    }


def save_bytes() -> bytes:
    """The bytes of a file of ``tensors()``."""
    return save(tensors())


def _buffer(nbytes: int) -> "tuple[Any, int]":
    buf = bytearray(nbytes)
    return buf, ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _cpp_paths(file: Any, want: Dict[str, torch.Tensor]) -> Dict[str, Callable[[], bool]]:
    """The binding's reads, the ones the framework modules call."""
    b = want["b"].numpy().tobytes()

    def read_into() -> bool:
        buf, ptr = _buffer(len(b))
        file.read_into("b", ptr, len(b), fresh=True)
        return bytes(buf) == b

    def read_many() -> bool:
        buf, ptr = _buffer(len(b))
        a_buf, a_ptr = _buffer(4000)
        file.read_many([("a", a_ptr, 4000), ("b", ptr, len(b))], threads=2, fresh=True)
        return bytes(buf) == b and bytes(a_buf) == want["a"].numpy().tobytes()

    def read_range() -> bool:
        n = file.size - file.data_offset
        buf, ptr = _buffer(n)
        file.read_range(0, ptr, n, threads=2)
        return bytes(buf)[4000:] == b

    def read() -> bool:
        return torch.equal(torch.from_dlpack(file.read("b")), want["b"])

    def read_all() -> bool:
        got = {name: torch.from_dlpack(c) for name, c in file.read_all(threads=2)}
        return all(torch.equal(got[k], want[k]) for k in want)

    def read_buffer() -> bool:
        return bytes(file.read("b", dlpack=False)) == b

    def read_slice_columns() -> bool:
        plan = file.plan_slice("b", [slice(None, None, 1), slice(3, 5, 1)])
        buf, ptr = _buffer(plan.nbytes)
        file.read_slice("b", plan, ptr)
        return bytes(buf) == want["b"][:, 3:5].numpy().tobytes()

    return {
        "File.read_into": read_into,
        "File.read_many": read_many,
        "File.read_range": read_range,
        "File.read": read,
        "File.read_all": read_all,
        "File.read(dlpack=False)": read_buffer,
        "File.read_slice": read_slice_columns,
    }


def paths(filename: str, backend: str) -> Dict[str, Callable[[], bool]]:
    """Every read path, each with its handle already open. Each returns whether the data read is right."""
    want = tensors()
    pt = safe_open(filename, "pt", backend=backend)
    np_handle = safe_open(filename, "np", backend=backend)
    b = want["b"].numpy()
    out: Dict[str, Callable[[], bool]] = {
        # Copies on both backends: a negative step and integer lists.
        "pt get_slice reversed rows": lambda: np.array_equal(pt.get_slice("b")[200:10:-1].numpy(), b[200:10:-1]),
        "pt get_slice listed rows": lambda: np.array_equal(pt.get_slice("b")[[20, 200], 3:5].numpy(), b[[20, 200], 3:5]),
        "pt get_slice element": lambda: pt.get_slice("b")[[250], 7].item() == b[250, 7],
        "np get_slice rows": lambda: np.array_equal(np_handle.get_slice("b")[10:200], b[10:200]),
    }
    out.update(_cpp_paths(_cpp.File(filename, backend), want))

    def prefetch() -> bool:
        # The engine's direct reads into each tensor (safe_open.prefetch to the CPU), iterated to the end.
        with pt.prefetch() as loader:
            got = dict(loader)
        return sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)

    def prefetch_take() -> bool:
        # One tensor asked for by name: take() waits for its reads and raises what they raised.
        with pt.prefetch() as loader:
            return torch.equal(loader.take("b"), want["b"])

    out["pt prefetch"] = prefetch
    out["pt prefetch take"] = prefetch_take
    if backend != "mmap":
        # On mmap these are zero-copy views (see the module docstring).
        out.update({
            "pt get_slice rows": lambda: torch.equal(pt.get_slice("b")[10:200], want["b"][10:200]),
            "pt get_slice columns": lambda: torch.equal(pt.get_slice("b")[:, 3:5], want["b"][:, 3:5]),
            "pt get_tensor": lambda: torch.equal(pt.get_tensor("b"), want["b"]),
            "pt get_tensors": lambda: all(torch.equal(v, want[k]) for k, v in pt.get_tensors().items()),
            "np get_tensor": lambda: np.array_equal(np_handle.get_tensor("b"), want["b"].numpy()),
            "load_file": lambda: all(torch.equal(v, want[k]) for k, v in load_file(filename, backend=backend).items()),
        })
    return out


def cli_verify(filename: str) -> Dict[str, Any]:
    """``safetensors verify``: exit code 0 and an OK line, or 1 and a FAIL line naming the file."""
    out = io.StringIO()
    rc = _run_cli(["verify", filename], out)
    text = out.getvalue()
    if rc == 0:
        return {"path": "cli verify", "ok": True, "correct": "verify OK" in text}
    return {"path": "cli verify", "ok": False, "type": f"exit {rc}", "message": " ".join(text.split())}


def _run_cli(argv: List[str], out: io.StringIO) -> int:
    old = sys.stdout
    sys.stdout = out
    try:
        return cli_main(argv)
    finally:
        sys.stdout = old


def run(filename: str, backend: str, *extra: str, timeout: float = 120) -> List[Dict[str, Any]]:
    """This script over `filename` in a child process; AssertionError (naming the path it was on) if the
    child dies (a signal: SIGBUS) or hangs past `timeout`."""
    import subprocess

    try:
        proc = subprocess.run([sys.executable, __file__, filename, backend, *extra], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(f"the reads hung ({backend}), at: {stderr.strip().splitlines()[-1:]}") from None
    if proc.returncode != 0:
        raise AssertionError(f"the reads died with {proc.returncode} ({backend}), at: "
                             f"{proc.stderr.strip().splitlines()[-1:]}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    filename, backend = sys.argv[1], sys.argv[2]
    todo = paths(filename, backend)
    if sys.argv[3:4] == ["--truncate"]:
        os.truncate(sys.argv[4], int(sys.argv[5]))
    results: List[Dict[str, Any]] = []
    for name, read in todo.items():
        print(f"start {name}", file=sys.stderr, flush=True)
        try:
            results.append({"path": name, "ok": True, "correct": bool(read())})
        except Exception as e:  # noqa: BLE001 -- every outcome is reported
            results.append({"path": name, "ok": False, "type": type(e).__name__, "message": str(e),
                            "oserror": isinstance(e, OSError), "errno": getattr(e, "errno", None),
                            "filename": getattr(e, "filename", None)})
    print("start cli verify", file=sys.stderr, flush=True)
    results.append(cli_verify(filename))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
