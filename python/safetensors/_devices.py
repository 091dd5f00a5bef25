"""The one device resolver.

``parse_reference_device`` accepts exactly what the reference accepts (``cpu``, ``cuda``, ``npu``, ``xpu``,
``xla``, ``mlu``, ``musa``, ``hpu`` with an optional ``:N``, ``mps``/``mps:0``, an int >= 0) with its errors.
``resolve_torch_device`` goes further for PyTorch: ``torch.device`` objects, ``"meta"``, and any device string
torch itself parses -- so an out-of-tree backend registered through PrivateUse1 (``torch_npu`` registers
``npu``) works without a code change here -- and it says clearly when a device's runtime is missing.
"""

from __future__ import annotations

from typing import Any

from ._safetensors_cpp import SafetensorError

_REFERENCE_TYPES = ("cpu", "cuda", "npu", "xpu", "xla", "mlu", "musa", "hpu", "mps")

# Packages that register a device type with torch, for the message when the type is unknown to torch.
_RUNTIME_PACKAGES = {"npu": "torch_npu", "mlu": "torch_mlu", "musa": "torch_musa", "hpu": "habana_frameworks.torch",
                     "xla": "torch_xla"}


def _invalid(device: Any) -> SafetensorError:
    return SafetensorError(f"device {device} is invalid")


def _split_index(device: str) -> tuple:
    kind, sep, index = device.partition(":")
    if sep and not (index.isascii() and index.isdigit()):
        raise ValueError(f"invalid device index {index!r} in device {device!r}: expected a non-negative integer")
    return kind, (int(index) if sep else None)


def parse_reference_device(device: Any) -> str:
    """Validates ``device`` with the reference's rules; returns ``"cpu"``, ``"kind"``, ``"kind:N"`` or ``"N"``."""
    if hasattr(device, "type") and hasattr(device, "index") and not isinstance(device, (str, int)):
        device = str(device)  # a torch.device; only its spelling matters here
    if isinstance(device, bool):
        raise _invalid(device)
    if isinstance(device, int):
        if device < 0:
            raise _invalid(device)
        return str(device)
    if not isinstance(device, str):
        raise _invalid(device)
    kind, index = _split_index(device)
    if kind not in _REFERENCE_TYPES or (kind == "mps" and index not in (None, 0)):
        raise _invalid(device)
    return kind if index is None else f"{kind}:{index}"


def resolve_torch_device(device: Any) -> Any:
    """The ``torch.device`` to deliver tensors to. Errors: SafetensorError for an unknown or unavailable
    device, ValueError for a malformed index."""
    import torch

    if isinstance(device, torch.device):
        resolved = device
    elif isinstance(device, bool):
        raise _invalid(device)
    elif isinstance(device, int):
        if device < 0:
            raise _invalid(device)
        accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
        if accelerator is None:
            raise SafetensorError(
                f"device {device} is invalid: an integer names a device of the current accelerator, "
                "and torch reports no accelerator on this machine"
            )
        resolved = torch.device(accelerator.type, device)
    elif isinstance(device, str):
        kind, _ = _split_index(device)
        try:
            resolved = torch.device(device)
        except (RuntimeError, ValueError):
            package = _RUNTIME_PACKAGES.get(kind)
            if package is not None:
                raise SafetensorError(
                    f"device {device} is not available: torch does not know the '{kind}' device type. "
                    f"Install and import {package} (it registers '{kind}' with torch) before loading."
                ) from None
            raise _invalid(device) from None
    else:
        raise _invalid(device)
    _check_available(resolved)
    return resolved


def _check_available(device: Any) -> None:
    import torch

    if device.type in ("cpu", "meta"):
        return
    if device.type == "mps":
        available = torch.backends.mps.is_available()
        count = 1
    else:
        module = getattr(torch, device.type, None)
        is_available = getattr(module, "is_available", None)
        if not callable(is_available):
            return  # a backend without the usual module (xla, lazy, ...): torch reports problems itself
        available = bool(is_available())
        device_count = getattr(module, "device_count", None)
        count = int(device_count()) if available and callable(device_count) else 0
    if not available:
        raise SafetensorError(
            f"device {device} is not available: torch reports no '{device.type}' devices "
            f"(is its runtime installed and is this torch built with {device.type} support?)"
        )
    if device.index is not None and count and device.index >= count:
        raise SafetensorError(
            f"device {device} is not available: torch reports {count} '{device.type}' device(s)"
        )
