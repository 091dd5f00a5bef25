"""Saving a sharded state dict: every rank writes the pieces it holds straight into the final files.

The steps, the same on every rank (each exchange is one ``all_gather_object`` of small objects, bounded by the
process group's timeout; a rank that failed still takes part in every exchange, so nobody waits forever):

1. Describe, locally: each value's piece (``_placement.local_piece``: global shape, dtype, box); rank 0 makes
   the directory and writes a marker file holding a random token. Exchange statuses, descriptions, the token.
2. Plan, identically on every rank from what was gathered: ranks must agree on names, dtypes and shapes; the
   split is huggingface_hub's (``plan_shards``), each file's layout the writer's (``_files.plan_file``). Each
   distinct box gets one writer among the ranks holding it, the one with the fewest bytes so far (so replicated
   DTensors and plain tensors, held whole by every rank, are spread over the ranks). Each rank checks it sees
   the marker (the directory is shared); rank 0 creates the temporary files. Exchange statuses.
3. Write: each rank writes its pieces at their final offsets and fsyncs them. Exchange statuses: the barrier.
4. Publish: rank 0 renames the temporaries into place, writes the index (several files), removes what an
   earlier save of another split left there (``model*`` shards, index or single file not written now), fsyncs
   the directory. Exchange its status.

Any failure before step 4 -- an error on any rank, a collective that failed because a rank died -- removes the
temporaries (every surviving rank tries: the names follow from the token) and raises on every rank; final
names are never touched before step 4.
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from .. import _safetensors_cpp as _cpp
from .._core import Box, PathLike, SafetensorError
from .._checkpoint_paths import INDEX_SUFFIX, checkpoint_files, parse_size
from ._files import (FileLayout, TensorDesc, create_temporary, dtype_code, fsync_directory, nbytes, plan_file,
                     publish, remove_quietly, temporary_name, WritePiece, write_pieces)
from ._group import Group, error_text, failures_text
from ._placement import box_shape, local_piece

__all__ = ["Layout", "assign_writers", "plan_layout", "save"]

#: The single-file name, as save_pretrained and huggingface_hub name an unsharded checkpoint.
SINGLE_FILE = "model.safetensors"
ACTION = "save"


class Layout:
    """Where every tensor goes: the files (in order), the file of each tensor, and the hub's index plan."""

    def __init__(self, files: List[FileLayout], file_of: Dict[str, str], plan: Optional[Any]) -> None:
        self.files = files
        self.file_of = file_of
        self.plan = plan  # the ShardPlan whose index to write, None for one file

    def by_name(self) -> Dict[str, FileLayout]:
        return {f.file_name: f for f in self.files}


def user_metadata(metadata: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """``{"format": "pt", **metadata}``: what transformers writes in each shard (checked as save_file does)."""
    out = {"format": "pt"}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str, got {type(key).__name__} -> {type(value).__name__} "
                            f"for key {key!r}")
        out[key] = value
    return out


def plan_layout(descs: Sequence[TensorDesc], max_shard_bytes: int, metadata: Dict[str, str]) -> Layout:
    """The files ``huggingface_hub.split_torch_state_dict_into_shards`` makes of ``descs`` (in state-dict
    order), each laid out as ``save_file`` writes it: one ``model.safetensors`` when they fit."""
    by_name = {d[0]: d for d in descs}
    plan = _cpp.sharded.plan_shards([(name, nbytes(code, shape)) for name, code, shape in descs], max_shard_bytes)
    shards = plan.shards or [(SINGLE_FILE, [], 0)]
    files, file_of = [], {}
    for file_name, inputs, _ in shards:
        if len(shards) == 1:
            file_name, inputs = SINGLE_FILE, list(range(len(descs)))
        members = [descs[i] for i in inputs]
        files.append(plan_file(file_name, members, metadata))
        file_of.update((name, file_name) for name, _, _ in members)
    assert len(file_of) == len(by_name)
    return Layout(files, file_of, plan if len(shards) > 1 else None)


def assign_writers(order: Sequence[TensorDesc], boxes: Sequence[Dict[str, Optional[Box]]]) -> Dict[str, Dict[Box, int]]:
    """``{name: {box: writer rank}}`` from each rank's ``{name: box or None}``: one writer per distinct box,
    the holder with the fewest bytes assigned so far (lowest rank on ties). Raises SafetensorError where the
    distinct boxes do not cover the tensor (ranks that disagree on placements)."""
    assigned = [0] * len(boxes)
    out: Dict[str, Dict[Box, int]] = {}
    for name, code, shape in order:
        holders: Dict[Box, List[int]] = {}
        for rank, mine in enumerate(boxes):
            box = mine.get(name)
            if box is not None and all(stop > start for start, stop in box):
                holders.setdefault(box, []).append(rank)
        total = 1
        for s in shape:
            total *= s
        covered = 0
        for box in holders:
            n = 1
            for s in box_shape(box):
                n *= s
            covered += n
        if covered != total:
            raise SafetensorError(
                f"tensor {name}: the ranks' pieces hold {covered} of its {total} elements (the ranks disagree "
                "on its placements, or a piece overlaps another)")
        item = nbytes(code, ())
        writers: Dict[Box, int] = {}
        for box, ranks in holders.items():
            rank = min(ranks, key=lambda r: (assigned[r], r))
            size = item
            for s in box_shape(box):
                size *= s
            assigned[rank] += size
            writers[box] = rank
        out[name] = writers
    return out


def describe(state_dict: Mapping[str, Any]) -> Tuple[List[TensorDesc], Dict[str, Box], Dict[str, torch.Tensor]]:
    """This rank's descriptions (state-dict order), boxes (None where it holds nothing) and local tensors."""
    if not isinstance(state_dict, Mapping):
        raise SafetensorError(f"save_state_dict: state_dict must be a dict of tensors, got "
                              f"{type(state_dict).__name__}")
    descs, boxes, locals_ = [], {}, {}
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise SafetensorError(f"state dict keys must be str, got {type(name).__name__}: {name!r}")
        piece = local_piece(name, value)
        descs.append((name, dtype_code(name, piece.dtype), piece.shape))
        boxes[name] = piece.box
        locals_[name] = piece.local
    return descs, boxes, locals_


def check_agreement(gathered: Sequence[List[TensorDesc]]) -> None:
    """Raises SafetensorError (the same text on every rank) where ranks differ in names, dtypes or shapes."""
    first = {name: (code, shape) for name, code, shape in gathered[0]}
    for rank, descs in enumerate(gathered[1:], start=1):
        mine = {name: (code, shape) for name, code, shape in descs}
        if mine.keys() != first.keys():
            only0 = sorted(first.keys() - mine.keys())[:5]
            only = sorted(mine.keys() - first.keys())[:5]
            raise SafetensorError(f"the ranks' state dicts differ: rank 0 has {only0} that rank {rank} has not, "
                                  f"rank {rank} has {only} that rank 0 has not")
        for name, info in first.items():
            if mine[name] != info:
                raise SafetensorError(f"tensor {name}: ranks disagree on its dtype and shape: rank 0 has "
                                      f"{info[0]} {list(info[1])}, rank {rank} has {mine[name][0]} "
                                      f"{list(mine[name][1])}")


def _exchange(grp: Group, status: Optional[str], what: str, payload: Any = None) -> List[Any]:
    gathered = grp.gather((status, payload), what, action=ACTION)
    text = failures_text([s for s, _ in gathered], grp.world, what, action=ACTION)
    if text is not None:
        raise SafetensorError(text)
    return [p for _, p in gathered]


def _marker(token: str) -> str:
    return f".safetensors-save.{token}.marker"


def save(state_dict: Mapping[str, Any], directory: PathLike, group: Optional[dist.ProcessGroup],
         max_shard_size: Union[int, str], metadata: Optional[Mapping[str, str]]) -> None:
    """``safetensors.distributed.save_state_dict`` (see its docstring)."""
    grp = Group(group)
    directory = os.fspath(directory)
    temporaries: List[str] = []  # what this save may have created under temporary names, once known
    try:
        _save(grp, state_dict, directory, max_shard_size, metadata, temporaries)
    except BaseException:
        # Every survivor removes what it can: the rank that created the files may be the one that died. A
        # temporary already renamed into place is no longer there to remove.
        remove_quietly(directory, temporaries)
        raise


def _save(grp: Group, state_dict: Mapping[str, Any], directory: str, max_shard_size: Union[int, str],
          metadata: Optional[Mapping[str, str]], temporaries: List[str]) -> None:
    # 1. describe
    status, token, descs, boxes, tensors = None, None, [], {}, {}
    try:
        max_bytes = parse_size(max_shard_size) if isinstance(max_shard_size, str) else int(max_shard_size)
        if max_bytes < 1:
            raise ValueError(f"invalid max_shard_size {max_shard_size!r}: must be at least one byte")
        md = user_metadata(metadata)
        descs, boxes, tensors = describe(state_dict)
        if grp.rank == 0:
            token = secrets.token_hex(8)
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, _marker(token)), "w") as f:
                f.write(token)
            temporaries.append(_marker(token))
    except Exception as e:  # noqa: BLE001 - reported to every rank, raised there
        status = error_text(e)
    gathered = _exchange(grp, status, "describing the state dict", (token, descs, boxes))
    token = gathered[0][0]
    temporaries[:] = [_marker(token)]

    # 2. plan (every rank, the same), check the directory, create the temporaries
    check_agreement([g[1] for g in gathered])
    layout = plan_layout(gathered[0][1], max_bytes, md)
    writers = assign_writers(gathered[0][1], [g[2] for g in gathered])
    temporaries.extend(temporary_name(f.file_name, token) for f in layout.files)
    status = None
    try:
        if grp.rank == 0:
            for f in layout.files:
                create_temporary(directory, f, token)
        else:
            _check_marker(directory, token)
    except Exception as e:  # noqa: BLE001
        status = error_text(e)
    _exchange(grp, status, "creating the files")

    # 3. write this rank's pieces, then the barrier
    status = None
    try:
        shapes = {name: shape for name, _, shape in gathered[0][1]}
        files = layout.by_name()
        pieces = []
        for name, file_name in layout.file_of.items():
            box = boxes.get(name)
            if box is not None and writers[name].get(box) == grp.rank:
                begin = files[file_name].offsets[name][0]
                pieces.append(WritePiece(file_name, name, begin, shapes[name], box, tensors[name]))
        write_pieces(directory, token, pieces)
    except Exception as e:  # noqa: BLE001
        status = error_text(e)
    _exchange(grp, status, "writing the tensors")

    # 4. publish
    status = None
    if grp.rank == 0:
        try:
            before = checkpoint_files(directory)
            publish(directory, [(temporary_name(f.file_name, token), f.file_name) for f in layout.files])
            written = {f.file_name for f in layout.files}
            if layout.plan is not None:
                _cpp.sharded.write_index(directory, layout.plan, True)
                written.add(layout.plan.index_file_name)
            # What an earlier save of another split left (its shards, its index or its single file) goes, the
            # index first, so no reader meets an index naming removed shards or a stale file beside the new.
            stale = [os.path.basename(p) for p in before if os.path.basename(p) not in written]
            remove_quietly(directory, sorted(stale, key=lambda n: not n.endswith(INDEX_SUFFIX)) + [_marker(token)])
            fsync_directory(directory)
        except Exception as e:  # noqa: BLE001
            status = error_text(e)
    _exchange(grp, status, "publishing the files")


def _check_marker(directory: str, token: str) -> None:
    path = os.path.join(directory, _marker(token))
    try:
        with open(path) as f:
            seen = f.read()
    except OSError:
        seen = None
    if seen != token:
        raise SafetensorError(
            f"directory {directory} is not shared by the ranks: this rank does not see the marker file rank 0 "
            f"wrote there ({_marker(token)}); every rank must save to the same directory on a filesystem they "
            "all see")
