"""A simulated Ascend NPU for tests, in-process, on a CPU-only torch.

``install(num_devices)`` compiles (once; cached under build/npu_sim) and loads a small C++ extension that
registers a PrivateUse1 backend -- allocator, device guard, hooks, empty/copy/view kernels and a CPU fallback
for every other op -- then renames PrivateUse1 to ``npu`` and registers ``torch.npu``, as torch_npu does.
Afterwards ``torch.empty(..., device="npu:1")``, ``x.to("npu:0")``, ``x.cpu()``, ``x.npu()``,
``torch.npu.is_available()`` and the rest work, with each simulated device's memory allocated and counted
separately from CPU memory (``device_of``, ``bytes_allocated``) and every copy counted (``copy_stats``).
Device memory is filled with POISON_BYTE when allocated, and (by default) the host cannot touch it outside the
backend's own kernels: reading an npu tensor through its data_ptr() crashes, as on a real NPU.

Copies are asynchronous where a real device's are: ``x.to("npu:N", non_blocking=True)`` (or ``copy_``) from
pinned host memory is queued on device N's one stream and runs later, on a worker thread, after a delay
(``set_copy_delay_us``, env NPU_SIM_COPY_DELAY_US, default 2000 us per copy), reading the pinned bytes only
then -- so overwriting a pinned buffer before the device copied out of it puts the new bytes on the device.
``record_copy_timeline``/``copy_timeline`` time each queued copy (for benchmarks of overlap).
Everything else that touches a device's memory waits for its queue first (single-stream order), and
``torch.npu.synchronize``, streams and events wait on and report the queue. ``pause_queue``/``resume_queue``
hold a device's queue so tests can decide deterministically what has run; waiting on a paused queue raises
RuntimeError instead of hanging. NPU_SIM_ASYNC=0 (or ``set_async_copies(False)``) makes every copy synchronous.

Process-wide and irreversible, like importing torch_npu: once installed, ``torch.accelerator`` reports ``npu``
and an integer device (``device=0``) means ``npu:0`` for the rest of the process. A test module that must not
change the process it is collected in can run itself in a child pytest: see ``may_install_here`` and
``run_pytest_child`` (tests/python/devices/test_npu_sim.py does).

    @pytest.fixture(scope="module")
    def npu():
        if not npu_sim.may_install_here():
            pytest.skip("run with NPU_SIM_IN_PROCESS=1, or through npu_sim.run_pytest_child")
        npu_sim.install(2)
        return npu_sim
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

__all__ = [
    "install", "installed", "num_devices", "protects_device_memory", "supports_pinned_memory",
    "device_of", "bytes_allocated", "memory_stats", "pinned_bytes_allocated",
    "copy_stats", "fallback_ops", "reset_copy_stats",
    "synchronize", "set_copy_delay_us", "copy_delay_us", "copy_delay", "set_async_copies", "async_copies",
    "pause_queue", "resume_queue", "queue_paused", "queue_depth", "record_copy_timeline", "copy_timeline",
    "may_install_here", "run_pytest_child", "IN_PROCESS_ENV", "POISON_BYTE", "BUILD_DIR", "build_seconds",
]

_HERE = Path(__file__).resolve().parent
BUILD_DIR = Path(os.environ.get("NPU_SIM_BUILD_DIR", str(_HERE.parents[2] / "build" / "npu_sim")))
POISON_BYTE = 0xCB  # fresh device memory is filled with this byte: a load must write every byte it returns
_PINNED = -1  # memory_stats index of pinned host memory

IN_PROCESS_ENV = "NPU_SIM_IN_PROCESS"  # "1": install in this process (set in the children run_pytest_child starts)
_lock = threading.Lock()
_num_devices: Optional[int] = None
_pinned_supported: Optional[bool] = None
_protect: Optional[bool] = None
build_seconds: Optional[float] = None  # seconds install() spent compiling or loading the extension


def _load_extension() -> None:
    global build_seconds
    from torch.utils.cpp_extension import load

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    load(name="npu_sim_ext", sources=[str(_HERE / "npu_sim.cpp")], build_directory=str(BUILD_DIR),
         extra_cflags=["-O1"], is_python_module=False, verbose=bool(os.environ.get("NPU_SIM_VERBOSE")))
    build_seconds = time.perf_counter() - start


def install(num_devices: int = 2, *, protect_device_memory: Optional[bool] = None) -> None:
    """Registers the simulated ``npu`` backend with ``num_devices`` devices. Idempotent; calling it again with
    another count or protection raises RuntimeError (both are fixed for the process).

    ``protect_device_memory`` (default: True unless the environment sets NPU_SIM_HOST_ACCESS=1) maps device
    memory PROT_NONE outside the backend's own copy/fill kernels, so host code that reads or writes an npu
    tensor through its ``data_ptr()`` crashes with SIGSEGV, as it would on a real NPU."""
    global _num_devices, _pinned_supported, _protect
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or not 1 <= num_devices <= 16:
        raise ValueError(f"num_devices must be an int in [1, 16], got {num_devices!r}")
    with _lock:
        if _num_devices is not None:
            if num_devices != _num_devices:
                raise RuntimeError(f"npu_sim is already installed with {_num_devices} device(s); "
                                   f"it cannot be reinstalled with {num_devices} in the same process")
            if protect_device_memory is not None and protect_device_memory != _protect:
                raise RuntimeError(f"npu_sim is already installed with protect_device_memory={_protect}")
            return
        if protect_device_memory is None:
            protect_device_memory = os.environ.get("NPU_SIM_HOST_ACCESS") != "1"
        name = torch._C._get_privateuse1_backend_name()
        if name not in ("privateuseone", "npu"):
            raise RuntimeError(f"PrivateUse1 is already renamed to {name!r}; npu_sim cannot register 'npu'")
        existing = getattr(torch, "npu", None)
        if existing is not None and getattr(existing, "__name__", "") != f"{__name__}._module":
            raise RuntimeError("torch.npu already exists (is torch_npu imported?); npu_sim would conflict with it")

        _load_extension()
        torch.ops.npu_sim.configure(num_devices, bool(protect_device_memory))
        if name == "privateuseone":
            torch.utils.rename_privateuse1_backend("npu")
        from . import _module

        if existing is None:
            torch._register_device_module("npu", _module)
        if not hasattr(torch.Tensor, "npu"):
            torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                                 for_packed_sequence=True, for_storage=True)
        _num_devices = num_devices
        _protect = bool(protect_device_memory)
        _pinned_supported = _probe_pinned_memory()


def _probe_pinned_memory() -> bool:
    try:
        empty = torch.empty(16, dtype=torch.uint8, pin_memory=True)
        pinned = torch.zeros(16, dtype=torch.uint8).pin_memory()
    except RuntimeError:
        return False
    return bool(empty.is_pinned() and pinned.is_pinned() and device_of(empty) is None)


def protects_device_memory() -> bool:
    """Whether host access to device memory outside the backend's kernels faults (see install)."""
    _require()
    return bool(_protect)


def installed() -> bool:
    return _num_devices is not None


def num_devices() -> int:
    _require()
    assert _num_devices is not None
    return _num_devices


def _require() -> None:
    if _num_devices is None:
        raise RuntimeError("npu_sim is not installed: call npu_sim.install() first")


def device_of(tensor: torch.Tensor) -> Optional[int]:
    """The index of the simulated device whose memory holds ``tensor``'s first byte, judged by where the bytes
    were allocated (not by ``tensor.device``); None for host memory (CPU, pinned) and for tensors without bytes."""
    _require()
    index = int(torch.ops.npu_sim.device_of(tensor))
    return index if index >= 0 else None


def memory_stats(index: int) -> dict:
    """Allocator bookkeeping of simulated device ``index`` (or -1 for pinned host memory):
    live_bytes, live_blocks (allocations alive now), total_blocks, total_bytes (ever allocated)."""
    _require()
    live_bytes, live_blocks, total_blocks, total_bytes = (int(v) for v in torch.ops.npu_sim.memory_stats(index))
    return {"live_bytes": live_bytes, "live_blocks": live_blocks, "total_blocks": total_blocks,
            "total_bytes": total_bytes}


def bytes_allocated(index: int) -> int:
    """Bytes of simulated device memory alive on device ``index`` now."""
    if not 0 <= index < num_devices():
        raise ValueError(f"no simulated npu device {index}: there are {num_devices()}")
    return memory_stats(index)["live_bytes"]


def pinned_bytes_allocated() -> int:
    """Bytes of host-pinned memory (pin_memory()) alive now."""
    return memory_stats(_PINNED)["live_bytes"]


def copy_stats() -> dict:
    """Copies between host and simulated devices since the last reset: ``h2d``, ``d2h``, ``d2d`` -- the copies
    the code asked for (``.to``, ``.cpu``, ``copy_``) -- and ``fallback`` -- those the CPU fallback made to run
    an op that has no simulated kernel -- each ``{"count", "bytes"}`` (bytes written to the destination), plus
    ``non_blocking``: how many of the asked-for copies were requested non-blocking, and ``async``: the copies
    that went through a device queue (pinned host to device, non-blocking) -- ``count`` and ``bytes`` of those
    that have run so far, and ``max_depth``, the most copies pending on one queue at once (the running one
    included). The h2d/d2h/d2d counts include queued copies from the moment they are issued."""
    _require()
    values = [int(v) for v in torch.ops.npu_sim.copy_stats()]
    stats: dict = {}
    for i, direction in enumerate(("h2d", "d2h", "d2d", "fallback")):
        stats[direction] = {"count": values[2 * i], "bytes": values[2 * i + 1]}
    stats["non_blocking"] = values[8]
    stats["async"] = {"count": values[9], "bytes": values[10], "max_depth": values[11]}
    return stats


def fallback_ops() -> dict:
    """``{"aten::op.overload": calls}`` for the ops on npu tensors that ran through the CPU fallback since the
    last reset (everything but allocation, copies, fill_/zero_, resize_, set_ and views)."""
    _require()
    text = str(torch.ops.npu_sim.fallback_ops())
    return {name: int(count) for name, _, count in (item.rpartition("=") for item in text.split(";") if item)}


def reset_copy_stats() -> None:
    """Zeroes copy_stats() (the async counters included) and fallback_ops()."""
    _require()
    torch.ops.npu_sim.reset_copy_stats()


def _queue_index(index: int) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < num_devices():
        raise ValueError(f"no simulated npu device {index!r}: there are {num_devices()}")
    return index


def synchronize(index: Optional[int] = None) -> None:
    """Waits until every copy queued on device ``index`` (every device when None) has run. RuntimeError if a
    queue with copies pending is paused, or if a queued copy failed."""
    _require()
    torch.ops.npu_sim.synchronize(-1 if index is None else _queue_index(index))


def set_copy_delay_us(delay: int) -> None:
    """Sets how long (microseconds) each queued copy waits before it runs, from the next copy the queue starts."""
    _require()
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise ValueError(f"the copy delay must be an int >= 0 (microseconds), got {delay!r}")
    torch.ops.npu_sim.set_copy_delay_us(delay)


def copy_delay_us() -> int:
    """The delay of each queued copy, in microseconds."""
    _require()
    return int(torch.ops.npu_sim.copy_delay_us())


class copy_delay:
    """Context manager: ``with npu_sim.copy_delay(200_000): ...`` sets the delay, restores it on exit."""

    def __init__(self, delay_us: int) -> None:
        self.delay_us = delay_us
        self.previous: Optional[int] = None

    def __enter__(self) -> None:
        self.previous = copy_delay_us()
        set_copy_delay_us(self.delay_us)

    def __exit__(self, *exc: object) -> None:
        assert self.previous is not None
        set_copy_delay_us(self.previous)


def set_async_copies(enabled: bool) -> None:
    """False: every copy, non-blocking ones from pinned memory included, runs synchronously (copies queued
    before still run in order). True (the default unless NPU_SIM_ASYNC=0): queued as on a device."""
    _require()
    torch.ops.npu_sim.set_async_copies(bool(enabled))


def async_copies() -> bool:
    _require()
    return bool(torch.ops.npu_sim.async_copies())


def pause_queue(index: int) -> None:
    """Holds device ``index``'s copy queue: copies queued from now on (and any not started yet) wait until
    ``resume_queue``. Anything that must wait for them meanwhile (a blocking copy to or from the device,
    ``synchronize``, an event's synchronize) raises RuntimeError rather than hang; freeing memory does not wait."""
    _require()
    torch.ops.npu_sim.pause_queue(_queue_index(index))


def resume_queue(index: int) -> None:
    """Lets device ``index``'s copy queue run again."""
    _require()
    torch.ops.npu_sim.resume_queue(_queue_index(index))


class queue_paused:
    """Context manager: ``with npu_sim.queue_paused(0): ...`` pauses device 0's queue, resumes it on exit."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __enter__(self) -> None:
        pause_queue(self.index)

    def __exit__(self, *exc: object) -> None:
        resume_queue(self.index)


def queue_depth(index: int) -> int:
    """Copies queued on device ``index`` that have not finished (the running one included)."""
    _require()
    return int(torch.ops.npu_sim.queue_depth(_queue_index(index)))


def record_copy_timeline(enabled: bool = True) -> None:
    """Starts (forgetting what was recorded before) or stops recording when each asynchronous copy ran: see
    ``copy_timeline``. Off by default."""
    _require()
    torch.ops.npu_sim.set_copy_timeline(bool(enabled))


def copy_timeline() -> list:
    """The asynchronous copies that ran while recording was on, in the order they finished: dicts with
    ``device``, ``bytes``, and ``issued``, ``started`` and ``finished`` in nanoseconds of ``time.monotonic_ns()``'s
    clock -- issued when the code queued the copy, started when the device's queue took it up (the simulated
    transfer, its delay included, runs from there), finished when its bytes were on the device."""
    _require()
    flat = [int(v) for v in torch.ops.npu_sim.copy_timeline()]
    keys = ("device", "bytes", "issued", "started", "finished")
    return [dict(zip(keys, flat[i : i + 5])) for i in range(0, len(flat), 5)]


def supports_pinned_memory() -> bool:
    """Whether ``tensor.pin_memory()`` and ``torch.empty(..., pin_memory=True)`` give pinned host memory from
    the simulated backend's pinned allocator (probed at install)."""
    _require()
    return bool(_pinned_supported)


def may_install_here() -> bool:
    """True when installing the simulator cannot change what other tests of this process see: it is installed
    already, or this process was started to run simulator tests (``NPU_SIM_IN_PROCESS=1``)."""
    return installed() or os.environ.get(IN_PROCESS_ENV) == "1"


def run_pytest_child(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """Runs ``python -m pytest -q -p no:cacheprovider *args`` in a child process with ``NPU_SIM_IN_PROCESS=1``;
    returns the completed process with stdout and stderr as text. The timeout leaves room for a first build."""
    env = dict(os.environ, **{IN_PROCESS_ENV: "1"})
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def enter_test(request: Any, child_test: str) -> bool:
    """The start of an autouse fixture of a file whose tests run on the simulator: False for the file's
    ``child_test`` (which runs the file in a child process, see run_file_in_child); else skips unless the
    simulator may be installed in this process, installs it with two devices, selects device 0, resets the
    copy statistics and returns True (the fixture then does its own set-up)."""
    if request.node.originalname == child_test:
        return False
    if not may_install_here():
        pytest.skip(f"ran in a child process: see {child_test}")
    install(2)
    torch.npu.set_device(0)
    reset_copy_stats()
    return True


def run_file_in_child(path: str, min_passed: int) -> None:
    """The body of a file's ``child_test``: runs the file's tests in a child process that installs the
    simulator (skips where this process runs them itself) and asserts they passed, at least ``min_passed``."""
    if may_install_here():
        pytest.skip("this process runs the simulator tests itself")
    proc = run_pytest_child(path, "-rfEs")
    output = f"{proc.stdout[-20000:]}\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0, f"simulator tests of {path} failed in the child process:\n{output}"
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= min_passed, output

