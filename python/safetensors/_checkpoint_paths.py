"""What a command-line path names, and sizes for people; every index rule is the C++ library's.

A checkpoint is one ``.safetensors`` file, a directory, or an index file in the layout transformers writes::

    model.safetensors.index.json   {"metadata": {"total_size": N}, "weight_map": {tensor name: shard file}}
    model-00001-of-00002.safetensors
    model-00002-of-00002.safetensors

Parsing and validating an index, the "a shard holds what the index assigns" check, the split, the shard file
names, the index text and its atomic write are ``_safetensors_cpp.sharded.ShardIndex``, ``ShardedFile``,
``plan_shards``, ``write_index`` and ``save_sharded`` (include/safetensors/sharded.h). What is left here only
Python knows: size strings (``parse_size``/``format_size``) and what a path argument names (``resolve``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from . import _safetensors_cpp as _cpp
from ._safetensors_cpp import SafetensorError

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "IndexFormatError",
    "Shard",
    "checkpoint_files",
    "format_size",
    "parse_size",
    "read_index",
    "resolve",
]

INDEX_SUFFIX = ".safetensors.index.json"
SAFETENSORS_SUFFIX = ".safetensors"


def checkpoint_files(directory: str, stem: str = "model") -> List[str]:
    """The paths of the checkpoint files named ``stem`` in ``directory``, of either layout (``STEM.safetensors``,
    or shards and ``STEM.safetensors.index.json``), sorted; shard names are recognized by the C++ rule that
    names them (``is_shard_file_name``). What a new save of ``stem`` there replaces."""
    if not os.path.isdir(directory or "."):
        return []
    single, index = stem + SAFETENSORS_SUFFIX, stem + INDEX_SUFFIX
    return sorted(
        os.path.join(directory, e)
        for e in os.listdir(directory or ".")
        if e in (single, index) or _cpp.sharded.is_shard_file_name(stem, e)
    )


class CheckpointError(Exception):
    """A path that does not name a usable checkpoint (missing, empty directory, ambiguous). The message names
    the path."""


class IndexFormatError(CheckpointError):
    """An index file that exists but is not a valid index (the C++ library's message, naming the index)."""


@dataclass
class Shard:
    """One safetensors file of a checkpoint. ``names`` are the tensors an index assigns to it, sorted; None
    means every tensor the file holds (no index). ``position`` is its place in the index's ``shard_names``,
    what ``ShardIndex.select`` takes."""

    path: str
    names: Optional[List[str]] = None
    position: Optional[int] = None


@dataclass
class Checkpoint:
    """What a command-line path names: ``kind`` is ``"file"``, ``"directory"`` or ``"index"``; ``shards`` are
    in file-name order. ``index_path``/``index_metadata``/``index`` are set when an index file describes the
    shards."""

    path: str
    kind: str
    shards: List[Shard] = field(default_factory=list)
    index_path: Optional[str] = None
    index_metadata: Optional[Dict[str, Any]] = None
    index: Optional["_cpp.sharded.ShardIndex"] = field(default=None, compare=False, repr=False)


# -- sizes -------------------------------------------------------------------------------------------------

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """``"5GB"`` -> 5_000_000_000, ``"2GiB"`` -> 2 * 2**30, ``"1000"`` -> 1000 bytes. Units are case-insensitive:
    B, KB/MB/GB/TB (powers of 1000, as transformers and huggingface_hub count) and KiB/MiB/GiB/TiB (powers of
    1024). Raises ValueError for anything else, or a size below one byte."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"invalid size {text!r}: expected a number and a unit among B, KB, MB, GB, TB, KiB, MiB, GiB, TiB "
            "(for example 5GB or 500MiB)"
        )
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise ValueError(f"invalid size {text!r}: must be at least one byte")
    return value


def format_size(nbytes: int) -> str:
    """A size for people: ``"512 B"``, ``"250.0 KiB"``, ``"4.7 GiB"``."""
    if nbytes < 1024:
        return f"{nbytes} B"
    value = float(nbytes)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.1f} {unit}"


# -- the index (the C++ library's) -----------------------------------------------------------------------

def read_index(path: str) -> "_cpp.sharded.ShardIndex":
    """The parsed, validated index at ``path``. Raises IndexFormatError (the library's message, naming
    ``path``) for an invalid index, or OSError."""
    try:
        return _cpp.sharded.ShardIndex.read(path)
    except OSError:
        raise
    except SafetensorError as e:
        raise IndexFormatError(" ".join(str(e).split())) from None


def _from_index(path: str, kind: str, shown: str) -> Checkpoint:
    index = read_index(path)
    metadata = json.loads(index.metadata_json) if index.metadata_json is not None else {}
    shards = [Shard(index.shard_path(s), index.assigned(s), s) for s in range(len(index.shard_names))]
    return Checkpoint(shown, kind, shards, index_path=path, index_metadata=metadata, index=index)


def resolve(path: str) -> Checkpoint:
    """What ``path`` names: a safetensors file; an index file (``*.json``: the shards it names, each limited to
    the names it assigns); or a directory (its one ``*.safetensors.index.json`` when it has one, else every
    ``*.safetensors`` file in it, not recursing). Shards an index names are not checked for existence here.
    A URL (``s3://``, ``https://``) names an index when its path ends in ``.json``, else one file: object
    stores have no directories to list. Raises CheckpointError (or IndexFormatError) naming the path."""
    if _cpp.is_remote_location(path):
        if path.split("?", 1)[0].split("#", 1)[0].endswith(".json"):
            return _from_index(path, "index", path)
        return Checkpoint(path, "file", [Shard(path)])
    if os.path.isdir(path):
        try:
            entries = sorted(os.listdir(path))
        except OSError as e:
            raise CheckpointError(f"{path}: cannot list directory: {e.strerror}") from None
        indexes = [e for e in entries if e.endswith(INDEX_SUFFIX) and os.path.isfile(os.path.join(path, e))]
        if len(indexes) > 1:
            raise CheckpointError(
                f"{path}: several index files ({', '.join(indexes)}); name the one to use"
            )
        if indexes:
            return _from_index(os.path.join(path, indexes[0]), "directory", path)
        files = [e for e in entries if e.endswith(SAFETENSORS_SUFFIX) and os.path.isfile(os.path.join(path, e))]
        if not files:
            raise CheckpointError(f"{path}: no *.safetensors files in this directory")
        return Checkpoint(path, "directory", [Shard(os.path.join(path, f)) for f in files])
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such file or directory")
    if path.endswith(".json"):
        return _from_index(path, "index", path)
    return Checkpoint(path, "file", [Shard(path)])
