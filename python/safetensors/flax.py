"""JAX / Flax: save and load ``Dict[str, jax.Array]``.

Bytes are read and sliced as numpy arrays (bfloat16, float8 and float4 through ``ml_dtypes``, which is what
jax's own dtypes are) and handed to ``jnp.asarray``, so a loaded array lands on jax's default device and
follows jax's dtype rules: with ``jax_enable_x64`` off (jax's default) 64-bit tensors load as their 32-bit
counterparts, exactly as ``jnp.asarray`` would convert them.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ._core import load_file_as, open_bytes, PathLike, SafetensorError, serialize_flat, serialize_flat_file
# Names the reference's module also offers (other projects import them from here).
from ._core import safe_open  # noqa: F401
from . import numpy  # noqa: F401
from .numpy import _Numpy, _flatten_specs

__all__ = ["save", "save_file", "load", "load_file"]

#: Format codes jax has a dtype for (F6_* have no XLA type).
_CODES = frozenset(
    ["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64", "C64",
     "F4", "F8_E5M2", "F8_E4M3", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0"]
)


def _check(code: str) -> None:
    if code not in _CODES:
        raise SafetensorError(f"dtype {code} has no jax equivalent")


class _Flax(_Numpy):
    """Reads as numpy (the shared strategies), then hands each array to jax once it is complete."""

    name = "flax"

    def view(self, buffer: memoryview, code: str, shape: Tuple[int, ...]) -> np.ndarray:
        _check(code)
        return super().view(buffer, code, shape)

    def empty(self, code: str, shape: Tuple[int, ...]) -> Tuple[np.ndarray, int]:
        _check(code)
        return super().empty(code, shape)

    def to_device(self, tensor: np.ndarray, device: Any) -> jax.Array:
        return jnp.asarray(tensor)


_ADAPTER = _Flax()


def _to_numpy(tensors: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """A new dict of host arrays; the caller's dict is left as it is. Anything ``np.asarray`` takes is
    accepted, as with the reference."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, jax.Array] but received {type(tensors)}")
    return {name: np.asarray(value) for name, value in tensors.items()}


def _np2jnp(numpy_dict: Dict[str, np.ndarray]) -> Dict[str, jax.Array]:
    """Replaces each array of ``numpy_dict`` by its jax array, in place (as the reference does); returns the
    dict."""
    for name, value in numpy_dict.items():
        numpy_dict[name] = _ADAPTER.to_device(value, None)
    return numpy_dict


def _jnp2np(jnp_dict: Dict[str, jax.Array]) -> Dict[str, np.ndarray]:
    """Replaces each array of ``jnp_dict`` by ``np.asarray`` of it, in place (as the reference does); returns
    the dict."""
    for name, value in jnp_dict.items():
        jnp_dict[name] = np.asarray(value)
    return jnp_dict


def save(tensors: Dict[str, jax.Array], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors``."""
    return serialize_flat(_flatten_specs(_to_numpy(tensors)), metadata)


def save_file(
    tensors: Dict[str, jax.Array],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    fsync: bool = False,
) -> None:
    """Writes ``tensors`` to ``filename`` atomically."""
    serialize_flat_file(_flatten_specs(_to_numpy(tensors)), filename, metadata, fsync)


def load(data: bytes) -> Dict[str, jax.Array]:
    """Every tensor of the file in ``data``."""
    return _ADAPTER.load_copies(open_bytes(data))


def load_file(filename: PathLike, *, backend: str = "mmap") -> Dict[str, jax.Array]:
    """Every tensor of ``filename``."""
    return load_file_as("flax", filename, "cpu", backend)
