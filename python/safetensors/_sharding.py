"""Checkpoints made of several files: what a path names, index files, sizes and the shard plan.

A checkpoint is one ``.safetensors`` file, a directory, or an index file in the layout transformers writes::

    model.safetensors.index.json   {"metadata": {"total_size": N}, "weight_map": {tensor name: shard file}}
    model-00001-of-00002.safetensors
    model-00002-of-00002.safetensors

Nothing here reads tensor data or needs a framework; the command-line tool (``_cli.py``) builds on it.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "IndexFormatError",
    "Shard",
    "format_size",
    "parse_size",
    "plan_shards",
    "read_index",
    "resolve",
    "shard_file_names",
    "write_index",
]

INDEX_SUFFIX = ".safetensors.index.json"
SAFETENSORS_SUFFIX = ".safetensors"


class CheckpointError(Exception):
    """A path that does not name a usable checkpoint (missing, empty directory, ambiguous). The message names
    the path."""


class IndexFormatError(CheckpointError):
    """An index file that exists but is not a valid index (bad JSON, wrong schema, unsafe shard names)."""


@dataclass
class Shard:
    """One safetensors file of a checkpoint. ``names`` are the tensors an index assigns to it, in the index's
    order (sorted); None means every tensor the file holds (no index)."""

    path: str
    names: Optional[List[str]] = None


@dataclass
class Checkpoint:
    """What a command-line path names: ``kind`` is ``"file"``, ``"directory"`` or ``"index"``; ``shards`` are
    in file-name order. ``index_path``/``index_metadata`` are set when an index file describes the shards."""

    path: str
    kind: str
    shards: List[Shard] = field(default_factory=list)
    index_path: Optional[str] = None
    index_metadata: Optional[Dict[str, Any]] = None


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


# -- the shard plan ----------------------------------------------------------------------------------------

def plan_shards(sizes: Sequence[Tuple[str, int]], max_shard_bytes: int) -> List[List[str]]:
    """Splits ``[(name, nbytes)]`` into shards of at most ``max_shard_bytes`` of tensor data, the way
    huggingface_hub's ``split_torch_state_dict_into_shards`` does, so converted checkpoints are laid out like
    ``save_pretrained`` output: tensors are taken in order and a shard is closed when the next tensor would
    overflow it; a tensor larger than the limit gets a shard of its own, placed where it was met."""
    shards: List[List[str]] = []
    current: List[str] = []
    current_bytes = 0
    for name, nbytes in sizes:
        if nbytes > max_shard_bytes:
            shards.append([name])
            continue
        if current and current_bytes + nbytes > max_shard_bytes:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(name)
        current_bytes += nbytes
    if current or not shards:
        shards.append(current)
    return shards


def shard_file_names(stem: str, count: int) -> List[str]:
    """``model-00001-of-00003.safetensors`` ... for ``stem="model"``, as transformers names shards."""
    return [f"{stem}-{i:05d}-of-{count:05d}{SAFETENSORS_SUFFIX}" for i in range(1, count + 1)]


def write_index(path: str, total_size: int, weight_map: Dict[str, str]) -> None:
    """Writes an index the way transformers does (two-space indent, sorted keys, final newline), atomically:
    a reader never sees half an index."""
    document = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".index-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temp, 0o666 & ~_umask())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- reading a checkpoint path -----------------------------------------------------------------------------

def _reject_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def read_index(path: str) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """``(metadata, weight_map)`` of an index file. Shard names must be plain relative paths (no absolute path,
    no ``..``); duplicate keys are an error. Raises IndexFormatError (naming ``path``), or OSError."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        document = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise IndexFormatError(f"{path}: not a valid index file: {e}") from None
    if not isinstance(document, dict):
        raise IndexFormatError(f"{path}: not a valid index file: expected a JSON object")
    metadata = document.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise IndexFormatError(f'{path}: not a valid index file: "metadata" must be an object')
    weight_map = document.get("weight_map")
    if not isinstance(weight_map, dict):
        raise IndexFormatError(f'{path}: not a valid index file: no "weight_map" object')
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise IndexFormatError(f"{path}: not a valid index file: tensor {name!r} maps to {shard!r}, not a file name")
        parts = shard.replace("\\", "/").split("/")
        if os.path.isabs(shard) or ".." in parts:
            raise IndexFormatError(f"{path}: shard {shard!r} (for tensor {name!r}) is outside the index's directory")
    return metadata, weight_map


def _from_index(path: str, kind: str, shown: str) -> Checkpoint:
    metadata, weight_map = read_index(path)
    directory = os.path.dirname(path)
    by_file: Dict[str, List[str]] = {}
    for name in sorted(weight_map):
        by_file.setdefault(weight_map[name], []).append(name)
    shards = [Shard(os.path.join(directory, file), names) for file, names in sorted(by_file.items())]
    return Checkpoint(shown, kind, shards, index_path=path, index_metadata=metadata)


def resolve(path: str) -> Checkpoint:
    """What ``path`` names: a safetensors file; an index file (``*.json``: the shards it names, each limited to
    the names it assigns); or a directory (its one ``*.safetensors.index.json`` when it has one, else every
    ``*.safetensors`` file in it, not recursing). Shards an index names are not checked for existence here.
    Raises CheckpointError (or IndexFormatError) naming the path."""
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
