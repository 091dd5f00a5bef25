"""JAX / Flax: save and load ``Dict[str, jax.Array]``.

Bytes are read and sliced as numpy arrays (bfloat16, float8 and float4 through ``ml_dtypes``, which is what
jax's own dtypes are) and handed to ``jnp.asarray``, so a loaded array lands on jax's default device and
follows jax's dtype rules: with ``jax_enable_x64`` off (jax's default) 64-bit tensors load as their 32-bit
counterparts, exactly as ``jnp.asarray`` would convert them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ._adapter import from_numpy_in_place, save_load_functions
from ._core import DTYPES
# Names the reference's module also offers (other projects import them from here).
from ._core import safe_open  # noqa: F401
from . import numpy  # noqa: F401
from .numpy import _Converted, _flatten_specs, codes_where

__all__ = ["save", "save_file", "load", "load_file"]


class _Flax(_Converted):
    name = "flax"
    label = "jax"
    # The numpy types jax names, less the 6-bit floats: jax names them, but XLA has no primitive type to place
    # them ("Invalid XLA PrimitiveType").
    codes = codes_where(lambda code, dtype: hasattr(jnp, dtype.name) and DTYPES[code].bits != 6)

    def to_device(self, tensor: np.ndarray, device: Any) -> jax.Array:
        return jnp.asarray(tensor)


_ADAPTER = _Flax()


def _to_numpy(tensors: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """A new dict of host arrays; the caller's dict is left as it is. Anything ``np.asarray`` takes is
    accepted, as with the reference."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, jax.Array] but received {type(tensors)}")
    return {name: np.asarray(value) for name, value in tensors.items()}


def _save_specs(tensors: Dict[str, Any]) -> Tuple[List[tuple], List[np.ndarray]]:
    return _flatten_specs(_to_numpy(tensors))


def _jnp2np(jnp_dict: Dict[str, jax.Array]) -> Dict[str, np.ndarray]:
    """Replaces each array of ``jnp_dict`` by ``np.asarray`` of it, in place (as the reference does); returns
    the dict."""
    for name, value in jnp_dict.items():
        jnp_dict[name] = np.asarray(value)
    return jnp_dict


_np2jnp = from_numpy_in_place(__name__, "_np2jnp", _ADAPTER)
save, save_file, load, load_file = save_load_functions(__name__, "flax", _ADAPTER, _save_specs, jax.Array, "jax.Array")
