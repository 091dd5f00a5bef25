"""JAX / Flax: save and load ``Dict[str, jax.Array]``.

Bytes are read and sliced as numpy arrays (bfloat16, float8 and float4 through ``ml_dtypes``, which is what
jax's own dtypes are) and handed to ``jnp.asarray``, so a loaded array lands on jax's default device and
follows jax's dtype rules: with ``jax_enable_x64`` off (jax's default) 64-bit tensors load as their 32-bit
counterparts, exactly as ``jnp.asarray`` would convert them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _framework
from ._core import DTYPES, PathLike, StorageOptions
from ._numpy_bridge import NumpyBridged, codes_where, flatten_specs
# Names the reference's module also offers (other projects import them from here).
from . import numpy  # noqa: F401
from ._safe_open import safe_open  # noqa: F401

__all__ = ["save", "save_file", "load", "load_file"]


class _Flax(NumpyBridged):
    name = "flax"
    label = "jax"
    # The numpy types jax names, less the 6-bit floats: jax names them, but XLA has no primitive type to place
    # them ("Invalid XLA PrimitiveType").
    codes = codes_where(lambda code, dtype: hasattr(jnp, dtype.name) and DTYPES[code].bits != 6)

    def to_device(self, tensor: np.ndarray, device: Any) -> jax.Array:
        return jnp.asarray(tensor)


#: How ``safe_open(framework="flax")`` builds arrays.
FRAMEWORK = _Flax()


def _to_numpy(tensors: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """A new dict of host arrays; the caller's dict is left as it is. Anything ``np.asarray`` takes is
    accepted, as with the reference."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, jax.Array] but received {type(tensors)}")
    return {name: np.asarray(value) for name, value in tensors.items()}


def _save_specs(tensors: Dict[str, Any]) -> Tuple[List[tuple], List[np.ndarray]]:
    return flatten_specs(_to_numpy(tensors))


def _jnp2np(jnp_dict: Dict[str, jax.Array]) -> Dict[str, np.ndarray]:
    """Replaces each array of ``jnp_dict`` by ``np.asarray`` of it, in place (as the reference does); returns
    the dict."""
    for name, value in jnp_dict.items():
        jnp_dict[name] = np.asarray(value)
    return jnp_dict


def _np2jnp(numpy_dict: Dict[str, np.ndarray]) -> Dict[str, jax.Array]:
    """Replaces each array of ``numpy_dict`` by its jax array, in place (as the reference does); returns the
    dict."""
    return _framework.from_numpy_in_place(FRAMEWORK, numpy_dict)


def save(tensors: Dict[str, jax.Array], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` (a dict of ``jax.Array`` by name)."""
    return _framework.save(_save_specs, tensors, metadata)


def save_file(tensors: Dict[str, jax.Array], filename: PathLike, metadata: Optional[Dict[str, str]] = None, *,
              fsync: bool = False) -> None:
    """Writes ``tensors`` (a dict of ``jax.Array`` by name) to ``filename`` atomically: a temporary file in
    the same directory, renamed over it. ``fsync=True`` also makes the new file durable before returning."""
    _framework.save_file(_save_specs, tensors, filename, metadata, fsync)


def load(data: bytes) -> Dict[str, jax.Array]:
    """Every tensor of the file in ``data``, in memory of its own."""
    return _framework.load(FRAMEWORK, data, "cpu")


def load_file(filename: PathLike, *, backend: str = "mmap",
              storage_options: Optional[StorageOptions] = None) -> Dict[str, jax.Array]:
    """Every tensor of ``filename``, in file order. ``backend``: ``"mmap"``, ``"pread"``, ``"direct"`` or ``"auto"`` (as for ``safe_open``)."""
    return _framework.load_file("flax", filename, "cpu", backend, storage_options)
