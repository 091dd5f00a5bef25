"""safetensors: a strict, fast C++ implementation of the safetensors format, drop-in for the reference package.

``from safetensors import safe_open`` and ``from safetensors.torch import load_file`` work as with the
reference; see README.md for where this package deliberately does better, and for a map of its modules.
"""

from ._core import (
    SafetensorError,
    SafetensorIOError,
    SafetensorSliceError,
    TensorMeta,
    TensorSpec,
    deserialize,
    serialize,
    serialize_file,
)
from ._prefetch import PrefetchLoader, TensorStream
from ._safe_open import PySafeSlice, safe_open

from ._core import IO_ERRORS as _IO_ERRORS

# SafetensorPermissionError, SafetensorFileNotFoundError, ...: their __module__ is this package, where pickled
# errors look them up.
globals().update(_IO_ERRORS)

__version__ = "0.8.0+cpp.2"


class _safe_open_handle(safe_open):
    """``safe_open`` over an open file object (opened by its ``name``), as the reference's class of this name."""

    def __init__(self, f, framework, device="cpu", *, backend="mmap") -> None:
        super().__init__(f.name, framework, device, backend=backend)


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
