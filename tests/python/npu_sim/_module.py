"""The ``torch.npu`` module of the simulated NPU: the subset of torch_npu's ``torch.npu`` that loaders use.

Each simulated device has one stream: its copy queue (see npu_sim/__init__.py). ``synchronize`` drains a
device's queue; ``Stream`` and ``Event`` are torch.Stream / torch.Event, whose query, synchronize, record and
wait go to the backend's device guard, i.e. to that queue. Every stream of a device is the same queue.
"""

from __future__ import annotations

import time
from typing import Any

import torch

_NAME = "npu"


def _ops() -> Any:
    return torch.ops.npu_sim


def _index(device: Any = None) -> int:
    """The device index named by an int, "npu", "npu:N", a torch.device, or None (the current device)."""
    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != _NAME:
            raise ValueError(f"expected an {_NAME} device, got {device}")
        return current_device() if device.index is None else device.index
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"expected an int, str or torch.device, got {type(device).__name__}")
    return device


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return int(_ops().device_count())


def is_initialized() -> bool:
    return True


def init() -> None:
    pass


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def current_device() -> int:
    return int(_ops().current_device())


def set_device(device: Any) -> None:
    _ops().set_device(_index(device))


def synchronize(device: Any = None) -> None:
    """Waits until every copy queued on ``device`` (the current device when None) has run, as
    torch.npu.synchronize waits for the device's streams."""
    _ops().synchronize(_index(device))


def get_device_name(device: Any = None) -> str:
    return f"npu_sim ({_index(device)})"


def get_amp_supported_dtype() -> list:
    return [torch.float16, torch.bfloat16]


def manual_seed(seed: int) -> None:  # random ops run through the CPU fallback, on the CPU generator
    pass


def manual_seed_all(seed: int) -> None:
    pass


def seed() -> None:
    pass


def seed_all() -> None:
    pass


def memory_allocated(device: Any = None) -> int:
    """Bytes of live simulated device memory on ``device``."""
    return int(_ops().memory_stats(_index(device))[0])


class device:
    """Context manager that makes ``device`` current, like ``torch.npu.device``."""

    def __init__(self, device: Any) -> None:
        self.index = -1 if device is None else _index(device)
        self.previous = -1

    def __enter__(self) -> None:
        self.previous = current_device()
        if self.index >= 0:
            set_device(self.index)

    def __exit__(self, *exc: Any) -> None:
        if self.index >= 0:
            set_device(self.previous)


class Stream(torch.Stream):
    """A torch.Stream on a simulated device: its device's copy queue (query, synchronize, wait_event)."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        return super().__new__(cls, device=torch.device(_NAME, _index(device)), priority=priority)


class Event(torch.Event):
    """A torch.Event for the simulated devices: record() marks the recording stream's device queue at its last
    queued copy; query() is True once the queue has run that far, synchronize() waits for it, and
    Stream.wait_event() of another device waits for it. elapsed_time measures host time between the records."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> "Event":
        event = super().__new__(cls, device=torch.device(_NAME, current_device()), enable_timing=enable_timing,
                                blocking=blocking, interprocess=interprocess)
        event._recorded_at = None
        return event

    def record(self, stream: Any = None) -> None:
        super().record(stream if stream is not None else current_stream())
        self._recorded_at = time.perf_counter()

    def elapsed_time(self, end_event: "Event") -> float:
        if self._recorded_at is None or end_event._recorded_at is None:
            raise RuntimeError("both events must be recorded before elapsed_time()")
        return (end_event._recorded_at - self._recorded_at) * 1000.0


def current_stream(device: Any = None) -> torch.Stream:
    return _default(device)


def default_stream(device: Any = None) -> torch.Stream:
    return _default(device)


def _default(device: Any) -> torch.Stream:
    index = _index(device)
    # stream_id 0 is the default stream; device_type 20 is PrivateUse1 (c10::DeviceType)
    return torch.Stream(stream_id=0, device_index=index, device_type=int(torch._C._autograd.DeviceType.PrivateUse1))


class stream:
    """Context manager selecting a stream: only its device matters here."""

    def __init__(self, s: Any) -> None:
        self.stream = s
        self.ctx = device(s.device if s is not None else None)

    def __enter__(self) -> None:
        self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.ctx.__exit__(*exc)
