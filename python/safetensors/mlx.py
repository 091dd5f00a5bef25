"""MLX: save and load ``Dict[str, mx.array]``.

Bytes are read and sliced as numpy arrays and handed to ``mx.array``. MLX has no float8, float6 or float4
dtypes, so those codes raise SafetensorError. F64 loads as ``mx.float64`` (which MLX computes on the CPU
only) so that a round trip is exact; ``mx.array`` on its own would make it float32.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import ml_dtypes
import mlx.core as mx
import numpy as np

from ._core import load_file_as, open_bytes, PathLike, SafetensorError, serialize_flat, serialize_flat_file
# Names the reference's module also offers (other projects import them from here).
from ._core import safe_open  # noqa: F401
from . import numpy  # noqa: F401
from .numpy import _Numpy, _flatten_specs

__all__ = ["save", "save_file", "load", "load_file"]

#: Format codes MLX has a dtype for.
_CODES = frozenset(["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64", "C64"])

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _check(code: str) -> None:
    if code not in _CODES:
        raise SafetensorError(f"dtype {code} has no mlx equivalent")


class _Mlx(_Numpy):
    """Reads as numpy (the shared strategies), then hands each array to MLX once it is complete."""

    name = "mlx"

    def view(self, buffer: memoryview, code: str, shape: Tuple[int, ...]) -> np.ndarray:
        _check(code)
        return super().view(buffer, code, shape)

    def empty(self, code: str, shape: Tuple[int, ...]) -> Tuple[np.ndarray, int]:
        _check(code)
        return super().empty(code, shape)

    def to_device(self, tensor: np.ndarray, device: Any) -> mx.array:
        if not tensor.flags.c_contiguous:  # mx.array refuses negative strides (reads never give such arrays)
            tensor = tensor.copy()
        if tensor.dtype == np.float64:
            return mx.array(tensor, dtype=mx.float64)
        return mx.array(tensor)


_ADAPTER = _Mlx()


def _host(value: Any) -> np.ndarray:
    if isinstance(value, mx.array) and value.dtype == mx.bfloat16:
        # numpy's buffer protocol has no bfloat16: take the bits and reinterpret them.
        return np.asarray(value.view(mx.uint16)).view(_BFLOAT16)
    return np.asarray(value)


def _mx2np(mx_dict: Dict[str, mx.array]) -> Dict[str, np.ndarray]:
    """A new dict of host arrays (the reference's helper; it leaves ``mx_dict`` as it is)."""
    return {name: _host(value) for name, value in mx_dict.items()}


def _np2mx(numpy_dict: Dict[str, np.ndarray]) -> Dict[str, mx.array]:
    """Replaces each array of ``numpy_dict`` by its MLX array, in place (as the reference does); returns the
    dict."""
    for name, value in numpy_dict.items():
        numpy_dict[name] = _ADAPTER.to_device(value, None)
    return numpy_dict


def _to_numpy(tensors: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """A new dict of host arrays; the caller's dict is left as it is. Anything ``np.asarray`` takes is
    accepted, as with the reference."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, mx.array] but received {type(tensors)}")
    return _mx2np(tensors)


def save(tensors: Dict[str, mx.array], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors``."""
    return serialize_flat(_flatten_specs(_to_numpy(tensors)), metadata)


def save_file(
    tensors: Dict[str, mx.array],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    fsync: bool = False,
) -> None:
    """Writes ``tensors`` to ``filename`` atomically."""
    serialize_flat_file(_flatten_specs(_to_numpy(tensors)), filename, metadata, fsync)


def load(data: bytes) -> Dict[str, mx.array]:
    """Every tensor of the file in ``data``."""
    return _ADAPTER.load_copies(open_bytes(data))


def load_file(filename: PathLike, *, backend: str = "mmap") -> Dict[str, mx.array]:
    """Every tensor of ``filename``."""
    return load_file_as("mlx", filename, "cpu", backend)
