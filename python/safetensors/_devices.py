"""The one device resolver.

``parse_reference_device`` accepts exactly what the reference accepts (``cpu``, ``cuda``, ``npu``, ``xpu``,
``xla``, ``mlu``, ``musa``, ``hpu`` with an optional ``:N``, ``mps``/``mps:0``, an int >= 0) with its errors: the
rule for frameworks that only load to the CPU.

``resolve_device`` goes further for the frameworks that load to accelerators, each through a small
``Runtime`` that says what the framework itself knows (its device objects, its current accelerator, which types
and how many devices it has): the forms of a device (a framework object, an int, a ``"type[:N]"`` string), the
order of the checks and every message live here once.

- torch (``TORCH``): ``torch.device`` objects, ``"meta"``, and any string torch itself parses -- so an
  out-of-tree backend registered through PrivateUse1 (``torch_npu`` registers ``npu``) works without a code
  change here -- saying clearly when a device's runtime is missing.
- paddle (``PADDLE``): Places; ``"cpu"``; ``"gpu"``/``"cuda"``/``"dcu"`` and ``"xpu"`` with an optional ``:N``
  (a bare type means paddle's current device of that type); any custom device type paddle has a plugin for
  (``"npu:0"``, ``"mlu:1"``); an int N, device N of the accelerator paddle has.
"""

from __future__ import annotations

from typing import Any, List, Optional, Protocol, Tuple

from ._safetensors_cpp import SafetensorError

_REFERENCE_TYPES = ("cpu", "cuda", "npu", "xpu", "xla", "mlu", "musa", "hpu", "mps")

# Packages that register a device type with torch, for the message when the type is unknown to torch.
_RUNTIME_PACKAGES = {"npu": "torch_npu", "mlu": "torch_mlu", "musa": "torch_musa", "hpu": "habana_frameworks.torch",
                     "xla": "torch_xla"}


def _invalid(device: Any) -> SafetensorError:
    return SafetensorError(f"device {device} is invalid")


def _split_index(device: str) -> Tuple[str, Optional[int]]:
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


class Runtime(Protocol):
    """What one framework knows about its devices (see resolve_device)."""

    #: The framework, as messages name it ("torch reports ...").
    name: str

    def native(self, device: Any) -> Optional[Any]:
        """``device`` resolved when it is one of the framework's own device objects, else None."""

    def accelerator(self) -> Optional[str]:
        """The device type an int names (the current accelerator), or None when there is none."""

    def device(self, spelling: Optional[str], kind: str, index: Optional[int]) -> Any:
        """The device of type ``kind`` and ``index`` (None: the framework's choice), checked to exist;
        ``spelling`` is the string the caller gave (None for an int). SafetensorError for an unknown or
        unavailable device."""


def resolve_device(device: Any, runtime: Runtime) -> Any:
    """The ``runtime`` framework's device for ``device``. Errors: SafetensorError for an unknown or unavailable
    device, ValueError for a malformed index."""
    native = runtime.native(device)
    if native is not None:
        return native
    if isinstance(device, bool):
        raise _invalid(device)
    if isinstance(device, int):
        if device < 0:
            raise _invalid(device)
        kind = runtime.accelerator()
        if kind is None:
            raise SafetensorError(
                f"device {device} is invalid: an integer names a device of the current accelerator, "
                f"and {runtime.name} reports no accelerator on this machine"
            )
        return runtime.device(None, kind, device)
    if isinstance(device, str):
        kind, index = _split_index(device)
        return runtime.device(device, kind, index)
    raise _invalid(device)


def not_available(device: Any, runtime: str, count: int, kind: str, detail: str = "") -> SafetensorError:
    return SafetensorError(f"device {device} is not available: {runtime} reports {count} '{kind}' device(s){detail}")


class _Torch:
    name = "torch"

    def native(self, device: Any) -> Optional[Any]:
        import torch

        if isinstance(device, torch.device):
            _check_available(device)
            return device
        return None

    def accelerator(self) -> Optional[str]:
        import torch

        accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
        return None if accelerator is None else accelerator.type

    def device(self, spelling: Optional[str], kind: str, index: Optional[int]) -> Any:
        import torch

        if spelling is None:
            resolved = torch.device(kind, index)
        else:
            try:
                resolved = torch.device(spelling)
            except (RuntimeError, ValueError):
                package = _RUNTIME_PACKAGES.get(kind)
                if package is not None:
                    raise SafetensorError(
                        f"device {spelling} is not available: torch does not know the '{kind}' device type. "
                        f"Install and import {package} (it registers '{kind}' with torch) before loading."
                    ) from None
                raise _invalid(spelling) from None
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
        raise not_available(device, "torch", count, device.type)


# Device types the reference accepts that paddle reaches only through a custom device plugin, or not at all.
_PADDLE_PLUGIN_TYPES = ("npu", "mlu", "musa", "hpu")
_PADDLE_FOREIGN_TYPES = ("mps", "xla")
_PADDLE_ALIASES = {"cuda": "gpu", "dcu": "gpu"}


class _Paddle:
    name = "paddle"

    def native(self, device: Any) -> Optional[Any]:
        import paddle

        core = paddle.base.core
        names = ("Place", "CPUPlace", "CUDAPlace", "CUDAPinnedPlace", "XPUPlace", "CustomPlace", "IPUPlace")
        return device if isinstance(device, tuple(getattr(core, n) for n in names if hasattr(core, n))) else None

    def _custom_types(self) -> List[str]:
        import paddle

        return list(paddle.device.get_all_custom_device_type() or [])

    def _count(self, kind: str) -> int:
        import paddle

        if kind == "gpu":
            return paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
        if kind == "xpu":
            return paddle.device.xpu.device_count() if paddle.is_compiled_with_xpu() else 0
        return sum(1 for d in (paddle.device.get_available_custom_device() or []) if d.split(":")[0] == kind)

    def accelerator(self) -> Optional[str]:
        kinds = [k for k in ["gpu", "xpu"] + self._custom_types() if self._count(k)]
        return kinds[0] if kinds else None

    def device(self, spelling: Optional[str], kind: str, index: Optional[int]) -> Any:
        import paddle

        shown = spelling if spelling is not None else index
        if kind == "cpu":
            if index is not None:
                raise _invalid(shown)
            return paddle.CPUPlace()
        kind = _PADDLE_ALIASES.get(kind, kind)
        if kind not in ("gpu", "xpu") and kind not in self._custom_types():
            if kind in _PADDLE_PLUGIN_TYPES:
                raise SafetensorError(
                    f"device {shown} is not available: paddle has no '{kind}' device here "
                    f"(install and load the PaddleCustomDevice plugin for {kind})"
                )
            if kind in _PADDLE_FOREIGN_TYPES:
                raise SafetensorError(f"Device {shown} is not supported for framework paddle")
            raise _invalid(shown)
        if index is None:  # paddle's current device when it is of this type, else the first
            current, _, current_index = paddle.device.get_device().partition(":")
            index = int(current_index) if current == kind and current_index.isdigit() else 0
        count = self._count(kind)
        if index >= count:
            unbuilt = not count and kind in ("gpu", "xpu")
            raise not_available(shown, "paddle", count, kind,
                                f" (this paddle is not built with {kind} support)" if unbuilt else "")
        if kind == "gpu":
            return paddle.CUDAPlace(index)
        if kind == "xpu":
            return paddle.XPUPlace(index)
        return paddle.CustomPlace(kind, index)


TORCH: Runtime = _Torch()
PADDLE: Runtime = _Paddle()


def resolve_torch_device(device: Any) -> Any:
    """The ``torch.device`` to deliver tensors to (see resolve_device)."""
    return resolve_device(device, TORCH)
