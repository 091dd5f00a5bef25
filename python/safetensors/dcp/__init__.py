"""torch.distributed.checkpoint (DCP) over safetensors checkpoints: drop-ins for torch's Hugging Face storage
classes that read and write through the native library. ``dcp.load(sd, storage_reader=...)`` changes by one
import::

    from safetensors.dcp import HuggingFaceStorageReader   # was: from torch.distributed.checkpoint import ...

``_reader`` holds ``HuggingFaceStorageReader``, ``_writer`` ``HuggingFaceStorageWriter`` (the consolidated files
written directly, each rank its own bytes) and ``_consolidate`` ``consolidate`` (torch's per-rank shard files
into full files); each module's docstring states its contract.
"""

from __future__ import annotations

from typing import List

from ._consolidate import consolidate
from ._reader import HuggingFaceStorageReader
from ._writer import HuggingFaceStorageWriter

__all__: List[str] = ["HuggingFaceStorageReader", "HuggingFaceStorageWriter", "consolidate"]
