"""TensorFlow: save and load ``Dict[str, tf.Tensor]``.

Bytes are read and sliced as numpy arrays (bfloat16, float8 and float4 through ``ml_dtypes``, which is what
TensorFlow's own dtypes are) and handed to ``tf.convert_to_tensor``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from ._core import load_file_as, open_bytes, PathLike, SafetensorError, serialize_flat, serialize_flat_file
# Names the reference's module also offers (other projects import them from here).
from ._core import safe_open  # noqa: F401
from . import numpy  # noqa: F401
from .numpy import _Numpy, _flatten_specs

__all__ = ["save", "save_file", "load", "load_file"]

#: Format codes TensorFlow has a dtype for (no float8_e8m0fnu, no float6).
_CODES = frozenset(
    ["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64", "C64",
     "F4", "F8_E5M2", "F8_E4M3", "F8_E4M3FNUZ", "F8_E5M2FNUZ"]
)


def _check(code: str) -> None:
    if code not in _CODES:
        raise SafetensorError(f"dtype {code} has no tensorflow equivalent")


class _TensorFlow(_Numpy):
    """Reads as numpy (the shared strategies), then hands each array to TensorFlow once it is complete."""

    name = "tensorflow"

    def view(self, buffer: memoryview, code: str, shape: Tuple[int, ...]) -> np.ndarray:
        _check(code)
        return super().view(buffer, code, shape)

    def empty(self, code: str, shape: Tuple[int, ...]) -> Tuple[np.ndarray, int]:
        _check(code)
        return super().empty(code, shape)

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


def _np2tf(numpy_dict: Dict[str, np.ndarray]) -> Dict[str, tf.Tensor]:
    """Replaces each array of ``numpy_dict`` by its TensorFlow tensor, in place (as the reference does);
    returns the dict."""
    for name, value in numpy_dict.items():
        numpy_dict[name] = _ADAPTER.to_device(value, None)
    return numpy_dict


def _tf2np(tf_dict: Dict[str, tf.Tensor]) -> Dict[str, np.ndarray]:
    """Replaces each tensor of ``tf_dict`` by its ``.numpy()`` value, in place (as the reference does; a 0-d
    tensor gives a numpy scalar); returns the dict."""
    for name, value in tf_dict.items():
        tf_dict[name] = value.numpy()
    return tf_dict


def save(tensors: Dict[str, tf.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors``."""
    return serialize_flat(_flatten_specs(_to_numpy(tensors)), metadata)


def save_file(
    tensors: Dict[str, tf.Tensor],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    fsync: bool = False,
) -> None:
    """Writes ``tensors`` to ``filename`` atomically."""
    serialize_flat_file(_flatten_specs(_to_numpy(tensors)), filename, metadata, fsync)


def load(data: bytes) -> Dict[str, tf.Tensor]:
    """Every tensor of the file in ``data``."""
    return _ADAPTER.load_copies(open_bytes(data))


def load_file(filename: PathLike, *, backend: str = "mmap") -> Dict[str, tf.Tensor]:
    """Every tensor of ``filename``."""
    return load_file_as("tf", filename, "cpu", backend)
