"""safetensors: a strict, fast C++ implementation of the safetensors format, drop-in for the reference package.

``from safetensors import safe_open`` and ``from safetensors.torch import load_file`` work as with the
reference; see README.md for where this package deliberately does better.
"""

from ._core import (  # noqa: F401
    SafetensorError,
    SafetensorIOError,
    SafetensorSliceError,
    PrefetchLoader,
    PySafeSlice,
    TensorMeta,
    TensorSpec,
    TensorStream,
    _safe_open_handle,
    deserialize,
    safe_open,
    serialize,
    serialize_file,
)

from ._core import IO_ERRORS as _IO_ERRORS

# SafetensorPermissionError, SafetensorFileNotFoundError, ...: their __module__ is this package, where pickled
# errors look them up.
globals().update(_IO_ERRORS)

__version__ = "0.8.0+cpp.2"

__all__ = [
    "SafetensorError",
    "SafetensorIOError",
    "SafetensorSliceError",
    "PrefetchLoader",
    "PySafeSlice",
    "TensorMeta",
    "TensorSpec",
    "TensorStream",
    "__version__",
    "deserialize",
    "safe_open",
    "serialize",
    "serialize_file",
]
