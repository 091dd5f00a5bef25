"""Step 1 of a distributed load: what a rank opens -- one file, or the shards of a checkpoint -- as a
``ShardedFile`` (the C++ library's one implementation of the index rules: which shard holds which tensor, a
name in two shards), and this rank's plan as pieces of each file, validated as prefetch validates plans."""

from __future__ import annotations

import hashlib
import os
from typing import Any, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from .. import _safetensors_cpp as _cpp
from .._core import PathLike, SafetensorError, StorageOptions, fspath, remote_pairs
from .._plan import Piece, PlanValue, checked_plan, plan_pieces
from .._checkpoint_paths import CheckpointError, resolve

__all__ = ["Opened", "Planned", "Shard", "digest", "open_checkpoint", "open_file", "plan"]

#: A tensor of this rank's plan: its name and its piece (the whole tensor, rows of it, or a box).
Planned = Tuple[str, Piece]


class Shard(NamedTuple):
    """One file a rank opened."""

    label: str  # the file's name, for messages (paths may differ between ranks)
    file: Any  # _safetensors_cpp.File
    names: List[str]  # the tensors of the checkpoint this file holds, in file order


class Opened(NamedTuple):
    """What a rank opened: its shards in checkpoint order, and what names a tensor it lacks (the File of a
    single-file load, else the ShardedFile)."""

    shards: List[Shard]
    holder: Any


def open_file(filename: PathLike, backend: str, storage_options: Optional[StorageOptions] = None) -> Opened:
    """One ``.safetensors`` file (a path or a URL), all of its tensors."""
    sharded = _cpp.sharded.ShardedFile.open_files([fspath(filename)], backend, remote=remote_pairs(storage_options))
    return _opened(sharded, sharded.shards[0])


def open_checkpoint(checkpoint: Union[PathLike, Sequence[PathLike]], backend: str,
                    storage_options: Optional[StorageOptions] = None) -> Opened:
    """An index file (its shards, each limited to what the index assigns to it), a directory (its one index,
    else every ``*.safetensors`` file in it), one file, or a sequence of files; paths or URLs (an index URL's
    shards are resolved beside it)."""
    remote = remote_pairs(storage_options)
    if isinstance(checkpoint, (str, bytes, os.PathLike)) and _cpp.is_remote_location(fspath(checkpoint)):
        location = fspath(checkpoint)
        if location.split("?", 1)[0].endswith(".json"):
            sharded = _cpp.sharded.ShardedFile.open_index(location, backend, remote=remote)
        else:
            sharded = _cpp.sharded.ShardedFile.open_files([location], backend, remote=remote)
    elif isinstance(checkpoint, (str, bytes, os.PathLike)):
        try:
            resolved = resolve(fspath(checkpoint))
        except CheckpointError as e:
            raise SafetensorError(str(e)) from None
        if resolved.index_path is not None:
            sharded = _cpp.sharded.ShardedFile.open_index(resolved.index_path, backend, remote=remote)
        else:
            sharded = _cpp.sharded.ShardedFile.open_files([shard.path for shard in resolved.shards], backend, remote=remote)
    else:
        paths = [fspath(p) for p in checkpoint]
        if not paths:
            raise SafetensorError("load_sharded: no files given")
        sharded = _cpp.sharded.ShardedFile.open_files(paths, backend, remote=remote)
    return _opened(sharded, sharded)


def _opened(sharded: Any, holder: Any) -> Opened:
    names: List[List[str]] = [[] for _ in sharded.shards]
    for name, _ in sharded.infos():  # shard by shard, in file order within a shard
        names[sharded.shard_of(name)].append(name)
    shards = [Shard(os.path.basename(file.path), file, held) for file, held in zip(sharded.shards, names)]
    return Opened(shards, holder)


def plan(opened: Opened, plan: Optional[Mapping[str, PlanValue]]) -> List[List[Planned]]:
    """This rank's pieces of each shard, in file order (``plan`` None: every tensor whole; ``{}``: none)."""
    if plan is None:
        return [plan_pieces(shard.file, None, names=shard.names) for shard in opened.shards]
    chosen = checked_plan(plan)
    where = {name: i for i, shard in enumerate(opened.shards) for name in shard.names}
    per_shard: List[dict] = [{} for _ in opened.shards]
    for name, rows in chosen.items():
        if name not in where:
            opened.holder.info(name)  # raises "File does not contain tensor NAME"
        per_shard[where[name]][name] = rows
    return [plan_pieces(shard.file, sub, empty_ok=True) for shard, sub in zip(opened.shards, per_shard)]


def digest(file: Any) -> str:
    """The layout of a file (names, dtypes, shapes, offsets, metadata, size): ranks must agree on it. The
    tensor bytes themselves cannot be compared without reading them."""
    text = repr((file.size, file.data_offset, file.infos(), sorted((file.metadata() or {}).items())))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
