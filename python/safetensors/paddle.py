"""PaddlePaddle: save and load ``Dict[str, paddle.Tensor]`` on the CPU, a GPU, an XPU or a custom device.

Bytes are read and sliced as numpy arrays and become paddle tensors through DLPack, without a copy (CPU
tensors loaded with ``backend="mmap"`` are views of the file's copy-on-write mapping, as for numpy and
torch); tensors for another device are then copied there. Saving writes each CPU tensor from its own memory.

Devices: ``"cpu"``; ``"gpu"``/``"cuda"``/``"dcu"`` and ``"xpu"`` with an optional ``:N``; any custom device type
paddle has a plugin for (``"npu:0"``, ``"mlu:1"``, ...); an int N (device N of the accelerator paddle is built
for); or a paddle Place. A type paddle cannot reach here raises SafetensorError.

``paddle.uint16`` is paddle's old spelling of bfloat16, so paddle has no real 16-bit unsigned dtype: U16
tensors raise SafetensorError rather than load as bfloat16.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import paddle
from paddle.utils.dlpack import from_dlpack

from . import _engine, _framework
from ._core import DTYPES, PathLike, Piece, SafetensorError, StorageOptions
# Names the reference's module also offers (other projects import them from here).
from ._core import TensorSpec, deserialize, serialize, serialize_file  # noqa: F401
from . import numpy  # noqa: F401
from ._devices import PADDLE, resolve_device
from ._numpy_bridge import CODES as NUMPY_CODES
from ._numpy_bridge import NumpyBridged, little_endian_bytes
from ._safe_open import safe_open  # noqa: F401

__all__ = ["save", "save_file", "load", "load_file"]

#: Format code -> paddle dtype. Names are torch's (and paddle's) dtype names; U16 is left out (see above).
_TYPES: Dict[str, Any] = {
    row.code: getattr(paddle, row.torch_name)
    for row in DTYPES.values()
    if row.code != "U16" and row.torch_name and isinstance(getattr(paddle, row.torch_name, None), paddle.dtype)
}
_CODES: Dict[Any, str] = {dtype: code for code, dtype in _TYPES.items()}
#: paddle dtype -> bytes per element.
_SIZE: Dict[Any, int] = {dtype: DTYPES[code].bits // 8 for code, dtype in _TYPES.items()}
#: paddle dtype -> the numpy type of its width that byte-swaps it: numpy's own where it has one, else float16
#: for 16 bits and uint8 for 8 bits (the reference's stand-ins; byte order only depends on the width).
NPDTYPES: Dict[Any, Any] = {
    dtype: bool if code == "BOOL" else getattr(np, DTYPES[code].numpy_name, None) or {2: np.float16, 1: np.uint8}[_SIZE[dtype]]
    for code, dtype in _TYPES.items()
}

# DLPack has no bfloat16 or float8: those cross as integers of their width and are reinterpreted. bfloat16
# goes as int16 because paddle turns a DLPack uint16 into its legacy uint16 type, which has no kernels.
_CARRIERS = {"BF16": np.int16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}


def _getdtype(dtype_str: str) -> Any:
    return _TYPES[dtype_str]


def _from_numpy(array: np.ndarray) -> paddle.Tensor:
    """The paddle CPU tensor over ``array``'s memory (DLPack keeps ``array`` alive)."""
    code = NUMPY_CODES[array.dtype]
    target = _TYPES[code]
    carrier = _CARRIERS.get(code)
    tensor = from_dlpack(array.view(carrier) if carrier is not None else array)
    if tensor.dtype != target:
        tensor = tensor.view(target)
    return tensor


# -- devices -----------------------------------------------------------------------------------------------

def _resolve(device: Any) -> Any:
    """The paddle Place for ``device`` (the one resolver, _devices.py, with paddle's runtime)."""
    return resolve_device(device, PADDLE)


def _is_cpu(place: Any) -> bool:
    return isinstance(place, paddle.CPUPlace) or (hasattr(place, "is_cpu_place") and place.is_cpu_place())


# -- accelerators: the loading engine -----------------------------------------------------------------------

#: Test hook: CPU loads take the engine's staged path too (slabs, copies, their release), so it runs end to end
#: on a machine without an accelerator.
_STAGE_CPU = False


def _stages(place: Any) -> bool:
    """True for places whose loads stream through the engine: every device but the CPU."""
    return _STAGE_CPU or not _is_cpu(place)


class _PaddleCopier:
    """The engine's copies through paddle (see _engine.DeviceCopier): each slab range becomes a paddle host
    tensor copied into a byte range of the destination with ``copy_``. From page-locked slabs
    (``CUDAPinnedPlace``, where paddle has CUDA) the copy is non-blocking and an event on the place's current
    stream says when it is done; from other host memory, or where paddle has no event for the place, copies
    are blocking, so a slab goes back to the pool as soon as its copy returns."""

    framework = "paddle"

    def __init__(self, place: Any) -> None:
        self._place = place
        self._events = not _is_cpu(place) and hasattr(paddle.device, "Event")

    @staticmethod
    def allocate(size: int) -> Tuple[int, Any]:
        if paddle.is_compiled_with_cuda():
            try:
                pinned = paddle.empty([size], dtype=paddle.uint8, pin_memory=True)
                return pinned.data_ptr(), pinned
            except (RuntimeError, ValueError, MemoryError):  # no page-locked memory: pageable, blocking copies
                pass
        array = np.empty(size, dtype=np.uint8)
        return array.ctypes.data, array

    def context(self) -> Any:
        return paddle.device.device_guard(self._place) if self._events else contextlib.nullcontext()

    def copy(self, dst: paddle.Tensor, offset: int, size: int, address: int, slab: Optional[Tuple[Any, int]]) -> None:
        target = dst._slice(offset, offset + size)
        if slab is not None and isinstance(slab[0], paddle.Tensor):  # page-locked: may complete later
            owner, start = slab
            target.copy_(owner._slice(start, start + size), not self._events)
        else:
            target.copy_(from_dlpack(np.frombuffer(_engine.host_view(address, size), dtype=np.uint8)), True)

    def record(self) -> Optional[Any]:
        if not self._events:
            return None
        event = paddle.device.Event()
        event.record(paddle.device.current_stream(self._place))
        return event


def _staged(piece: Piece) -> bool:
    """Whether a tensor's bytes go through the engine: those with a dimension and bytes. Scalars and empty
    tensors are read on the CPU and moved (a few bytes at most): paddle cannot reshape every dtype to 0-d or
    allocate every dtype empty (uint32/uint64 lack the kernels)."""
    return bool(piece.shape) and piece.end > piece.begin


def _staged_load(file: Any, pieces: List[Tuple[str, Piece]], place: Any) -> Dict[str, paddle.Tensor]:
    """Allocates the bytes of every tensor (see _staged) on ``place`` and fills them through the engine
    (reader threads into the slab pool, paddle copies out of the slabs), then views each as its dtype and
    shape: the bytes as rows of the last dimension, viewed as the dtype, which only divides that dimension."""
    buffers = []
    jobs = []
    for _name, piece in pieces:
        if piece.code not in _TYPES:
            raise SafetensorError(FRAMEWORK.refusal(piece.code))
        buffer = paddle.empty([piece.end - piece.begin], dtype=paddle.uint8, device=place)
        buffers.append(buffer)
        jobs.append((buffer, piece.begin, piece.end))
    _engine.fill(file, jobs, place, copier=_PaddleCopier(place), names=[name for name, _ in pieces])
    out = {}
    for (name, piece), buffer in zip(pieces, buffers):
        rows = list(piece.shape[:-1]) + [piece.shape[-1] * DTYPES[piece.code].bits // 8]
        out[name] = buffer.reshape(rows).view(_TYPES[piece.code])
    return out


# -- the framework adapter ----------------------------------------------------------------------------------

class _Paddle(NumpyBridged):
    name = "paddle"
    label = "paddle"
    codes = frozenset(_TYPES)

    def refusal(self, code: str) -> str:
        detail = " (paddle.uint16 is an alias of bfloat16)" if code == "U16" else ""
        return super().refusal(code) + detail

    def resolve_device(self, device: Any) -> Any:
        return _resolve(device)

    def is_cpu(self, device: Any) -> bool:
        return _is_cpu(device)

    def to_device(self, tensor: np.ndarray, device: Any) -> paddle.Tensor:
        out = _from_numpy(tensor)
        return out if _is_cpu(device) else out.to(device=device)

    def stages(self, device: Any) -> bool:
        return _stages(device)

    def stage(self, file: Any, pieces: List[Tuple[str, Piece]], device: Any) -> Dict[str, paddle.Tensor]:
        # Only the tensors _staged takes; the loading strategies read the others on the CPU and move them.
        return _staged_load(file, [(name, piece) for name, piece in pieces if _staged(piece)], device)


#: How ``safe_open(framework="paddle")`` builds tensors.
FRAMEWORK = _Paddle()


# -- saving ------------------------------------------------------------------------------------------------

def _to_ndarray(tensor: paddle.Tensor, name: str) -> Tuple[np.ndarray, Any]:
    """``(array, tensor)``: a numpy uint8 array over the bytes of the (contiguous) tensor without a copy, and
    the CPU tensor owning them, which the caller keeps alive while the array is used. Tensors elsewhere are
    copied to the CPU first; a tensor without memory gives ``(np.empty(0), 0)``. ValueError when the tensor is
    not contiguous."""
    if not tensor.is_contiguous():
        raise ValueError(_framework.non_contiguous_message(name))
    if not tensor.place.is_cpu_place():
        tensor = tensor.cpu()
    ptr = tensor.data_ptr()
    if ptr == 0:
        return np.empty(0), 0
    nbytes = int(np.prod(tensor.shape, dtype=np.int64)) * _SIZE[tensor.dtype]
    return little_endian_bytes(ptr, nbytes, _CODES[tensor.dtype]), tensor


def _flatten(tensors: Dict[str, paddle.Tensor], keep_alive_buffer: List) -> Dict[str, TensorSpec]:
    """The reference's form of _flatten_specs: ``{name: TensorSpec}`` for serialize/serialize_file, after the
    same checks; what keeps the described memory valid is appended to ``keep_alive_buffer``."""
    specs, keep_alive = _flatten_specs(tensors)
    keep_alive_buffer.extend(keep_alive)
    return {
        name: TensorSpec(dtype=DTYPES[code].torch_name, shape=shape, data_ptr=ptr, data_len=nbytes)
        for name, code, shape, ptr, nbytes in specs
    }


def _flatten_specs(tensors: Dict[str, paddle.Tensor]) -> Tuple[List[tuple], List[paddle.Tensor]]:
    """Checks tensors for saving (in the reference's order) and describes each by address; the second list
    keeps CPU copies of device tensors alive until the write is done."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, paddle.Tensor] but received {type(tensors)}")
    for name, value in tensors.items():
        if not isinstance(value, paddle.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected paddle.Tensor but received {type(value)}")
    specs = []
    keep_alive = []
    for name, value in tensors.items():
        if not value.is_contiguous():
            raise ValueError(_framework.non_contiguous_message(name))
        code = _CODES.get(value.dtype)
        if code is None:
            raise SafetensorError(f"tensor `{name}` has dtype {value.dtype}, which safetensors cannot store")
        if not value.place.is_cpu_place():
            value = value.cpu()
        keep_alive.append(value)
        shape = [int(d) for d in value.shape]
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[code].bits // 8
        specs.append((name, code, shape, value.data_ptr() if nbytes else 0, nbytes))
    return specs, keep_alive


# -- loading -----------------------------------------------------------------------------------------------

def _view2paddle(safeview: List[Tuple[str, Dict[str, Any]]], device: Any) -> Dict[str, paddle.Tensor]:
    """``deserialize`` output to ``{name: tensor}`` on ``device``; CPU tensors share the memory of their
    ``data``."""
    place = _resolve(device)
    return {name: FRAMEWORK.to_device(FRAMEWORK.view(v["data"], v["dtype"], tuple(v["shape"])), place) for name, v in safeview}


def _np2paddle(numpy_dict: Dict[str, np.ndarray], device: Any = "cpu") -> Dict[str, paddle.Tensor]:
    """Replaces each array of ``numpy_dict`` by a paddle tensor on ``device`` holding a copy of it, in place
    (as the reference does); returns the dict."""
    place = _resolve(device)
    for name, value in numpy_dict.items():
        numpy_dict[name] = FRAMEWORK.to_device(np.array(value, order="C", copy=True), place)
    return numpy_dict


def _paddle2np(paddle_dict: Dict[str, paddle.Tensor]) -> Dict[str, np.ndarray]:
    """Replaces each tensor of ``paddle_dict`` by a numpy copy of it (from the CPU), in place (as the reference
    does); returns the dict."""
    for name, value in paddle_dict.items():
        paddle_dict[name] = value.detach().cpu().numpy()
    return paddle_dict



def save(tensors: Dict[str, paddle.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` (a dict of ``paddle.Tensor`` by name)."""
    return _framework.save(_flatten_specs, tensors, metadata)


def save_file(tensors: Dict[str, paddle.Tensor], filename: PathLike, metadata: Optional[Dict[str, str]] = None, *,
              fsync: bool = False) -> None:
    """Writes ``tensors`` (a dict of ``paddle.Tensor`` by name) to ``filename`` atomically: a temporary file in
    the same directory, renamed over it. ``fsync=True`` also makes the new file durable before returning."""
    _framework.save_file(_flatten_specs, tensors, filename, metadata, fsync)


def load(data: bytes, device: Any = "cpu") -> Dict[str, paddle.Tensor]:
    """Every tensor of the file in ``data`` on ``device``, in memory of its own."""
    return _framework.load(FRAMEWORK, data, device)


def load_file(filename: PathLike, device: Any = "cpu", *, backend: str = "mmap",
              storage_options: Optional[StorageOptions] = None) -> Dict[str, paddle.Tensor]:
    """Every tensor of ``filename`` on ``device``, in file order. ``backend``: ``"mmap"``, ``"pread"``, ``"direct"`` or ``"auto"`` (as for ``safe_open``)."""
    return _framework.load_file("paddle", filename, device, backend, storage_options)
