"""TensorFlow: save and load ``Dict[str, tf.Tensor]``.

Bytes are read and sliced as numpy arrays (bfloat16, float8 and float4 through ``ml_dtypes``, which is what
TensorFlow's own dtypes are) and handed to ``tf.convert_to_tensor``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from . import _framework
from ._core import PathLike, StorageOptions
from ._numpy_bridge import NumpyBridged, codes_where, flatten_specs
# Names the reference's module also offers (other projects import them from here).
from . import numpy  # noqa: F401
from ._safe_open import safe_open  # noqa: F401

__all__ = ["save", "save_file", "load", "load_file"]


def _has_dtype(code: str, dtype: np.dtype) -> bool:
    """True when TensorFlow has a dtype for the numpy (ml_dtypes) type ``dtype``."""
    try:
        tf.as_dtype(dtype)
    except TypeError:
        return False
    return True


class _TensorFlow(NumpyBridged):
    name = "tensorflow"
    label = "tensorflow"
    codes = codes_where(_has_dtype)

    def to_device(self, tensor: np.ndarray, device: Any) -> tf.Tensor:
        return tf.convert_to_tensor(tensor)


#: How ``safe_open(framework="tf")`` builds tensors.
FRAMEWORK = _TensorFlow()


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
    return flatten_specs(_to_numpy(tensors))


def _tf2np(tf_dict: Dict[str, tf.Tensor]) -> Dict[str, np.ndarray]:
    """Replaces each tensor of ``tf_dict`` by its ``.numpy()`` value, in place (as the reference does; a 0-d
    tensor gives a numpy scalar); returns the dict."""
    for name, value in tf_dict.items():
        tf_dict[name] = value.numpy()
    return tf_dict


def _np2tf(numpy_dict: Dict[str, np.ndarray]) -> Dict[str, tf.Tensor]:
    """Replaces each array of ``numpy_dict`` by its TensorFlow tensor, in place (as the reference does); returns
    the dict."""
    return _framework.from_numpy_in_place(FRAMEWORK, numpy_dict)


def save(tensors: Dict[str, tf.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` (a dict of ``tf.Tensor`` by name)."""
    return _framework.save(_save_specs, tensors, metadata)


def save_file(tensors: Dict[str, tf.Tensor], filename: PathLike, metadata: Optional[Dict[str, str]] = None, *,
              fsync: bool = False) -> None:
    """Writes ``tensors`` (a dict of ``tf.Tensor`` by name) to ``filename`` atomically: a temporary file in
    the same directory, renamed over it. ``fsync=True`` also makes the new file durable before returning."""
    _framework.save_file(_save_specs, tensors, filename, metadata, fsync)


def load(data: bytes) -> Dict[str, tf.Tensor]:
    """Every tensor of the file in ``data``, in memory of its own."""
    return _framework.load(FRAMEWORK, data, "cpu")


def load_file(filename: PathLike, *, backend: str = "mmap",
              storage_options: Optional[StorageOptions] = None) -> Dict[str, tf.Tensor]:
    """Every tensor of ``filename``, in file order. ``backend``: ``"mmap"``, ``"pread"``, ``"direct"`` or ``"auto"`` (as for ``safe_open``)."""
    return _framework.load_file("tf", filename, "cpu", backend, storage_options)
