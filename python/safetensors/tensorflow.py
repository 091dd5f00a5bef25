"""TensorFlow: save and load ``Dict[str, tf.Tensor]``.

Bytes are read and sliced as numpy arrays (bfloat16, float8 and float4 through ``ml_dtypes``, which is what
TensorFlow's own dtypes are) and handed to ``tf.convert_to_tensor``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import tensorflow as tf

from ._adapter import from_numpy_in_place, save_load_functions
# Names the reference's module also offers (other projects import them from here).
from ._core import safe_open  # noqa: F401
from . import numpy  # noqa: F401
from .numpy import _Converted, _flatten_specs, codes_where

__all__ = ["save", "save_file", "load", "load_file"]


def _has_dtype(code: str, dtype: np.dtype) -> bool:
    """True when TensorFlow has a dtype for the numpy (ml_dtypes) type ``dtype``."""
    try:
        tf.as_dtype(dtype)
    except TypeError:
        return False
    return True


class _TensorFlow(_Converted):
    name = "tensorflow"
    label = "tensorflow"
    codes = codes_where(_has_dtype)

    def to_device(self, tensor: np.ndarray, device: Any) -> tf.Tensor:
        return tf.convert_to_tensor(tensor)


_ADAPTER = _TensorFlow()


def _to_numpy(tensors: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """A new dict of host arrays; the caller's dict is left as it is."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, tf.Tensor] but received {type(tensors)}")
    out = {}
    for name, value in tensors.items():
        if isinstance(value, np.ndarray):
            out[name] = value
        elif isinstance(value, (tf.Tensor, tf.Variable)):
            if not hasattr(value, "numpy"):
                raise ValueError(
                    f"Key `{name}` is a symbolic tensor, which has no value to save (save outside tf.function)"
                )
            out[name] = np.asarray(value.numpy())  # a 0-d tensor gives a numpy scalar
        else:
            raise ValueError(f"Key `{name}` is invalid, expected tf.Tensor but received {type(value)}")
    return out


def _save_specs(tensors: Dict[str, Any]) -> Tuple[List[tuple], List[np.ndarray]]:
    return _flatten_specs(_to_numpy(tensors))


def _tf2np(tf_dict: Dict[str, tf.Tensor]) -> Dict[str, np.ndarray]:
    """Replaces each tensor of ``tf_dict`` by its ``.numpy()`` value, in place (as the reference does; a 0-d
    tensor gives a numpy scalar); returns the dict."""
    for name, value in tf_dict.items():
        tf_dict[name] = value.numpy()
    return tf_dict


_np2tf = from_numpy_in_place(__name__, "_np2tf", _ADAPTER)
save, save_file, load, load_file = save_load_functions(__name__, "tf", _ADAPTER, _save_specs, tf.Tensor, "tf.Tensor")
