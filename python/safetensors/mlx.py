"""MLX: save and load ``Dict[str, mx.array]``.

Bytes are read and sliced as numpy arrays and handed to ``mx.array``. MLX has no float8, float6 or float4
dtypes, so those codes raise SafetensorError. F64 loads as ``mx.float64`` (which MLX computes on the CPU
only) so that a round trip is exact; ``mx.array`` on its own would make it float32.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import ml_dtypes
import mlx.core as mx
import numpy as np

from . import _framework
from ._core import PathLike, StorageOptions
from ._numpy_bridge import NumpyBridged, codes_where, flatten_specs
# Names the reference's module also offers (other projects import them from here).
from . import numpy  # noqa: F401
from ._safe_open import safe_open  # noqa: F401

__all__ = ["save", "save_file", "load", "load_file"]

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _has_dtype(code: str, dtype: np.dtype) -> bool:
    """True when MLX has a dtype of the numpy type's name (``bool_`` for numpy's ``bool``)."""
    return isinstance(getattr(mx, dtype.name, None) or getattr(mx, f"{dtype.name}_", None), mx.Dtype)


class _Mlx(NumpyBridged):
    name = "mlx"
    label = "mlx"
    codes = codes_where(_has_dtype)

    def to_device(self, tensor: np.ndarray, device: Any) -> mx.array:
        if not tensor.flags.c_contiguous:  # mx.array refuses negative strides (reads never give such arrays)
            tensor = tensor.copy()
        if tensor.dtype == np.float64:
            return mx.array(tensor, dtype=mx.float64)
        return mx.array(tensor)


#: How ``safe_open(framework="mlx")`` builds arrays.
FRAMEWORK = _Mlx()


def _host(value: Any) -> np.ndarray:
    if isinstance(value, mx.array) and value.dtype == mx.bfloat16:
        # numpy's buffer protocol has no bfloat16: take the bits and reinterpret them.
        return np.asarray(value.view(mx.uint16)).view(_BFLOAT16)
    return np.asarray(value)


def _mx2np(mx_dict: Dict[str, mx.array]) -> Dict[str, np.ndarray]:
    """A new dict of host arrays (the reference's helper; it leaves ``mx_dict`` as it is)."""
    return {name: _host(value) for name, value in mx_dict.items()}


def _save_specs(tensors: Dict[str, Any]) -> Tuple[List[tuple], List[np.ndarray]]:
    """Host arrays of ``tensors`` (the caller's dict is left as it is), described for the writer. Anything
    ``np.asarray`` takes is accepted, as with the reference."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, mx.array] but received {type(tensors)}")
    return flatten_specs(_mx2np(tensors))


def _np2mx(numpy_dict: Dict[str, np.ndarray]) -> Dict[str, mx.array]:
    """Replaces each array of ``numpy_dict`` by its MLX array, in place (as the reference does); returns the
    dict."""
    return _framework.from_numpy_in_place(FRAMEWORK, numpy_dict)


def save(tensors: Dict[str, mx.array], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` (a dict of ``mx.array`` by name)."""
    return _framework.save(_save_specs, tensors, metadata)


def save_file(tensors: Dict[str, mx.array], filename: PathLike, metadata: Optional[Dict[str, str]] = None, *,
              fsync: bool = False) -> None:
    """Writes ``tensors`` (a dict of ``mx.array`` by name) to ``filename`` atomically: a temporary file in
    the same directory, renamed over it. ``fsync=True`` also makes the new file durable before returning."""
    _framework.save_file(_save_specs, tensors, filename, metadata, fsync)


def load(data: bytes) -> Dict[str, mx.array]:
    """Every tensor of the file in ``data``, in memory of its own."""
    return _framework.load(FRAMEWORK, data, "cpu")


def load_file(filename: PathLike, *, backend: str = "mmap",
              storage_options: Optional[StorageOptions] = None) -> Dict[str, mx.array]:
    """Every tensor of ``filename``, in file order. ``backend``: ``"mmap"``, ``"pread"``, ``"direct"`` or ``"auto"`` (as for ``safe_open``)."""
    return _framework.load_file("mlx", filename, "cpu", backend, storage_options)
