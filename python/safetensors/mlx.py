"""MLX: save and load ``Dict[str, mx.array]``.

Bytes are read and sliced as numpy arrays and handed to ``mx.array``. MLX has no float8, float6 or float4
dtypes, so those codes raise SafetensorError. F64 loads as ``mx.float64`` (which MLX computes on the CPU
only) so that a round trip is exact; ``mx.array`` on its own would make it float32.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import ml_dtypes
import mlx.core as mx
import numpy as np

from ._adapter import from_numpy_in_place, save_load_functions
# Names the reference's module also offers (other projects import them from here).
from ._core import safe_open  # noqa: F401
from . import numpy  # noqa: F401
from .numpy import _Converted, _flatten_specs, codes_where

__all__ = ["save", "save_file", "load", "load_file"]

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _has_dtype(code: str, dtype: np.dtype) -> bool:
    """True when MLX has a dtype of the numpy type's name (``bool_`` for numpy's ``bool``)."""
    return isinstance(getattr(mx, dtype.name, None) or getattr(mx, f"{dtype.name}_", None), mx.Dtype)


class _Mlx(_Converted):
    name = "mlx"
    label = "mlx"
    codes = codes_where(_has_dtype)

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


def _save_specs(tensors: Dict[str, Any]) -> Tuple[List[tuple], List[np.ndarray]]:
    """Host arrays of ``tensors`` (the caller's dict is left as it is), described for the writer. Anything
    ``np.asarray`` takes is accepted, as with the reference."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, mx.array] but received {type(tensors)}")
    return _flatten_specs(_mx2np(tensors))


_np2mx = from_numpy_in_place(__name__, "_np2mx", _ADAPTER)
save, save_file, load, load_file = save_load_functions(__name__, "mlx", _ADAPTER, _save_specs, mx.array, "mx.array")
