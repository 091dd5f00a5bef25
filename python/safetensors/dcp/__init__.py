"""torch.distributed.checkpoint (DCP) over safetensors checkpoints: drop-ins for torch's Hugging Face storage
classes that read and write through the native library. ``dcp.load(sd, storage_reader=...)`` changes by one
import::

    from safetensors.dcp import HuggingFaceStorageReader   # was: from torch.distributed.checkpoint import ...

``_reader`` holds ``HuggingFaceStorageReader`` (its module docstring states the contract).
"""

from __future__ import annotations

import importlib.util
from typing import List

from ._reader import HuggingFaceStorageReader

__all__: List[str] = ["HuggingFaceStorageReader"]

# MERGE POINT: the writer (_writer.py: HuggingFaceStorageWriter) and consolidation (_consolidate.py:
# consolidate) are written separately; each is exported here once its module exists. When both have landed,
# replace this block with plain imports.
if importlib.util.find_spec(f"{__name__}._writer") is not None:
    from ._writer import HuggingFaceStorageWriter  # noqa: F401

    __all__.append("HuggingFaceStorageWriter")
if importlib.util.find_spec(f"{__name__}._consolidate") is not None:
    from ._consolidate import consolidate  # noqa: F401

    __all__.append("consolidate")
