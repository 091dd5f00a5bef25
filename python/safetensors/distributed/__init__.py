"""Loading a checkpoint on every rank of a ``torch.distributed`` process group, each byte read once per group.

When every rank of a job opens the same checkpoint and reads all of it, storage serves it ``world`` times (8
ranks on NFS read it 8 times). Here the ranks split the reading and hand each other the bytes over the
process group's own collectives -- NCCL on CUDA, HCCL on Ascend NPU, gloo on the CPU; no transport of our own.

A load runs in five steps, the same on every rank:

1. Open and plan, locally. Each rank opens the files and turns its own plan (``None``: every tensor whole;
   else ``{name: None | slice of rows | tuple of slices}``, validated exactly as ``safe_open.prefetch``
   validates its plans; ``load_state_dict`` makes it from the state dict's DTensor placements) into byte
   intervals of each file's data buffer, and boxes of inner dimensions (read as strided runs).
2. Agree, before any data moves (one ``all_gather_object``): every rank's status (ok, or its error text), the
   layout of every file it opened, its device type and its intervals. An error on any rank, ranks whose
   files differ in layout, or ranks loading to different device types raise the same SafetensorError on
   every rank.
3. Schedule, identically on every rank from what was gathered (:func:`schedule`): the union of all intervals
   is cut where the set of ranks needing the bytes changes, and at chunk boundaries (multiples of
   ``chunk_bytes`` in file offsets, so page-aligned); each chunk gets one reader among the ranks that need it,
   the one with the fewest bytes assigned so far. Bytes no rank needs are in no chunk: nobody reads them. A
   box is shared by the ranks naming the same box (replicas), cut into chunks of rows of its first dimension.
4. Move, in schedule order. A chunk's reader reads it with the native positional reads (GIL released) and
   broadcasts it when every rank needs it, or sends it to the ranks that need it; those receive it. The
   collectives are asynchronous, at most a window of chunks in flight, so a rank reads its next chunk while
   the previous ones travel. A chunk inside one tensor lands in that tensor; other chunks land in a staging
   buffer and are copied out (converted where the destination has another dtype or device). Accelerators communicate on the destination device; a gloo group moves CPU
   tensors.
5. Agree again: a read that failed does not leave its rank's collectives (it sends what it has, so nobody
   waits forever); the error is exchanged at the end and raised on every rank with the same text.

A rank that dies makes the others' collectives fail (at once when its connections close, else after the
process group's timeout); that is raised as a SafetensorError and the process group is unusable afterwards.

The modules, in the order of the steps: ``_placement`` and ``_state_dict`` (what a DTensor state dict plans),
``_opening`` (1: what a rank opens, on ``ShardedFile``, and its plan, through ``_plan.plan_pieces``), ``_group`` (2, 5: the process group and its collectives of statuses),
``_schedule`` (3: a pure function), ``_moving`` (4: reads and exchanges; ``read_chunk`` is the read seam) and
``_load`` (the steps in order).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist

from .._core import PathLike, SafetensorError, StorageOptions  # noqa: F401 - callers catch SafetensorError here
from . import _load, _opening, _save, _state_dict
from ._load import Plan
from ._moving import LoadStats
from ._schedule import Chunk, schedule  # noqa: F401 - the schedule is public for tests and tools
from ._state_dict import IncompatibleKeys

__all__ = ["DEFAULT_CHUNK_BYTES", "IncompatibleKeys", "LoadStats", "load_file", "load_sharded", "load_state_dict",
           "save_state_dict", "schedule"]


#: Bytes per chunk: the unit of reading and of one collective. A multiple of the page size. Chunks stay under
#: 1.5x this, so each is one positional read of the native reader (which splits reads at 8 MiB): the kernel
#: takes a lone read for a random one and reads just it, where two chunks look sequential and its readahead
#: (up to read_ahead_kb) runs into the next rank's chunk -- storage reads grew from 1/world to nearly the
#: whole file per rank with 16 MiB chunks on a disk with read_ahead_kb=8192.
DEFAULT_CHUNK_BYTES = 4 << 20

#: Where a rank's tensors go: ``"cpu"``, ``"cuda:1"``, ``"npu:0"``, a device index, a ``torch.device``.
Device = Union[str, int, torch.device]


# -- the public entry points -----------------------------------------------------------------------------------

def load_file(filename: PathLike, device: Device = "cpu", *, group: Optional[dist.ProcessGroup] = None,
              plan: Plan = None, backend: str = "auto", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
              stats: Optional[LoadStats] = None,
              storage_options: Optional[StorageOptions] = None) -> Dict[str, torch.Tensor]:
    """Loads ``filename`` on every rank of ``group``, reading each byte from storage once per group.

    Every rank of the group must call this (a collective). Ranks may pass different paths to the same
    checkpoint (e.g. a local copy per host) and different plans.

    Args:
        filename: the ``.safetensors`` file.
        device: where this rank's tensors go (``"cpu"``, ``"cuda:1"``, ``"npu:0"``, an int, a ``torch.device``,
            ``"meta"``); every rank must name the same device type.
        group: the process group (None: the default group). Its backend moves the bytes: NCCL/HCCL/... on
            the destination device, gloo (or MPI) through CPU tensors.
        plan: ``None``: every tensor, whole (each rank gets exactly what ``safetensors.torch.load_file``
            gives). Else this rank's ``{name: None | slice | tuple of slices}``: ``None`` for a whole tensor,
            a step-1 slice for rows ``[start, stop)`` of its first dimension, a tuple of step-1 slices for a box
            of the leading dimensions (negative bounds count from the end; never clamped), as for
            ``safe_open.prefetch``; ``{}`` takes part in the load and gets nothing. Ranks needing the
            same bytes share one read; bytes no rank needs are not read.
        backend: how files are read (``"auto"``: past the page cache where a file is not cached, else through
            it; ``"direct"``, ``"pread"`` or ``"mmap"``: as for ``safe_open``); tensors always own their memory.
        chunk_bytes: bytes per chunk (a multiple of the page size): the unit of one read and one collective.
        stats: a :class:`LoadStats` to fill with what this rank read and moved.
        storage_options: for an ``s3://`` or ``https://`` ``filename`` (as for ``safe_open``): each rank
            fetches only the chunks it reads, so the group downloads the checkpoint about once in total.

    Returns:
        ``{name: tensor}`` in file order: this rank's tensors (slices for sliced plan entries) on ``device``.

    Raises:
        SafetensorError: on every rank, with the same text, when any rank's file or plan is wrong (missing
            file or tensor, bad slice, ...), when ranks opened files of different layouts, or when a read
            failed on some rank; on the surviving ranks when a rank died or a collective timed out (bounded
            by the process group's timeout; the group is unusable afterwards).
    """
    return _load.load(partial(_opening.open_file, filename, storage_options=storage_options), device, group, plan,
                      backend, chunk_bytes, stats)


def load_sharded(checkpoint: Union[PathLike, Sequence[PathLike]], device: Device = "cpu", *,
                 group: Optional[dist.ProcessGroup] = None, plan: Plan = None, backend: str = "auto",
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, stats: Optional[LoadStats] = None,
                 storage_options: Optional[StorageOptions] = None) -> Dict[str, torch.Tensor]:
    """:func:`load_file` for a checkpoint of several files, planned and scheduled as one.

    ``checkpoint`` is an index file (``model.safetensors.index.json``: the shards it names, each limited to
    the tensors its ``weight_map`` assigns to it), a directory (its one index file, else every
    ``*.safetensors`` file in it), a single ``.safetensors`` file, or a sequence of ``.safetensors`` files.
    ``plan`` names tensors of the whole checkpoint. Returns ``{name: tensor}`` in shard order, then file order
    within a shard. Arguments and errors are those of :func:`load_file`; a name in no shard is refused with
    ``... does not contain tensor NAME``, a name in two shards (no index) as ``ShardedFile`` refuses it.
    """
    return _load.load(partial(_opening.open_checkpoint, checkpoint, storage_options=storage_options), device, group,
                      plan, backend, chunk_bytes, stats)



def load_state_dict(
    state_dict: Mapping[str, Any],
    checkpoint: Union[PathLike, Sequence[PathLike]],
    *,
    group: Optional[dist.ProcessGroup] = None,
    strict: bool = True,
    backend: str = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    storage_options: Optional[StorageOptions] = None,
    stats: Optional[LoadStats] = None,
) -> IncompatibleKeys:
    """Fills ``state_dict`` in place from a safetensors checkpoint, every rank reading only its own bytes.

    A collective: every rank of ``group`` calls it with its own state dict (the same keys, as a model's
    ``state_dict()`` gives). Values:

    - DTensors on any ``DeviceMesh`` (1-D, 2-D, ...) with ``Shard(dim)`` on any dimension (uneven splits as
      ``torch.chunk`` cuts them) and ``Replicate()``: this rank's local tensor gets its piece of the full
      tensor, as torch's ``compute_local_shape_and_global_offset`` places it. ``Partial`` (a pending reduction)
      and other placements a file cannot hold are refused, naming the tensor.
    - plain tensors: every rank gets the whole tensor.

    Destinations keep their dtype and device: the file's values are converted as ``Tensor.copy_`` converts (a
    bf16 checkpoint into f32 parameters). Rows of the first dimension are read as contiguous ranges, a shard
    of an inner dimension as strided runs (runs close together read as one); bytes several ranks need
    (replicated tensors, the replicated dimension of a 2-D mesh) are read once per group and exchanged over
    the group's collectives. Accelerator destinations are reached through the loading engine's pinned slabs
    (NCCL/HCCL groups move the bytes on the device; a gloo group moves CPU bytes, copied to the device).

    Args:
        state_dict: ``{name: DTensor | Tensor}``, filled in place (``model.state_dict()`` of an FSDP2 or
            tensor-parallel model).
        checkpoint: a ``.safetensors`` file, an index (``model.safetensors.index.json``), a directory, or a
            list of files; local paths or ``s3://``/``https://`` URLs (with ``storage_options``).
        group: the process group (None: the default group).
        strict: raise when the checkpoint lacks a key of the state dict (on every rank, before anything is
            read). Tensors of the checkpoint the state dict does not name are never an error: they are
            returned as ``unexpected_keys``.
        backend, chunk_bytes, storage_options, stats: as for :func:`load_file`.

    Returns:
        ``IncompatibleKeys(missing_keys, unexpected_keys)``, as ``Module.load_state_dict`` returns.

    Raises:
        SafetensorError: on every rank, with the same text: a missing key (strict), a shape that differs from
            the file's, a placement a file cannot serve, a dtype that cannot be converted, an unreadable file
            on any rank; on the surviving ranks when a rank died (as :func:`load_file`).
    """
    return _state_dict.load_state_dict(
        state_dict, partial(_opening.open_checkpoint, checkpoint, storage_options=storage_options), group=group,
        strict=strict, backend=backend, chunk_bytes=chunk_bytes, stats=stats)


def save_state_dict(
    state_dict: Mapping[str, Any],
    directory: PathLike,
    *,
    group: Optional[dist.ProcessGroup] = None,
    max_shard_size: Union[int, str] = "5GB",
    metadata: Optional[Mapping[str, str]] = None,
) -> None:
    """Saves a sharded state dict into ``directory`` as the model files a user publishes, each rank writing
    the bytes it holds straight into the final files (nothing is gathered to one rank).

    Every rank of ``group`` must call this (a collective) with the same ``directory`` on a filesystem they all
    see (checked: rank 0 writes a marker file every rank must see). The output is what
    ``huggingface_hub.split_torch_state_dict_into_shards`` makes of the full state dict: one
    ``model.safetensors`` when it fits in ``max_shard_size``, else ``model-0000i-of-0000N.safetensors`` and
    ``model.safetensors.index.json`` as transformers writes it; each file byte-identical to
    ``safetensors.torch.save_file(its full tensors, metadata={"format": "pt", **metadata})``.

    Crash safety as ``save_file``'s: every file is written under a temporary name in ``directory`` and renamed
    into place only once every rank has written and fsynced its part; then the directory is fsynced. When any
    rank fails or dies before that, every surviving rank raises, the temporaries are removed and no file under
    a final name has changed (an older checkpoint there stays as it was).

    Args:
        state_dict: ``{name: value}``; a value is a DTensor with ``Shard(dim)``/``Replicate()`` placements on
            any mesh (uneven shards as ``torch.chunk`` cuts them), or a plain tensor, identical on every rank
            (written once). Every rank must have the same names, dtypes and (global) shapes.
        directory: where the files go (created if missing).
        group: the process group (None: the default group); any backend that runs ``all_gather_object``.
        max_shard_size: the most tensor bytes in one file: an int or a size such as ``"5GB"`` or ``"500MiB"``.
        metadata: extra ``__metadata__`` entries for every file (str to str), after ``"format": "pt"``.

    Each distinct piece is written by exactly one rank: a replicated DTensor's or a plain tensor's by the rank
    holding it with the fewest bytes assigned so far, so those are spread over the ranks.

    Raises:
        SafetensorError: on every rank, with the same text, when a rank's state dict is unusable (a dtype
            safetensors cannot store, a ``Partial`` placement, a non-tensor value), when ranks disagree on
            names, dtypes or shapes, when the directory is not shared, or when a write failed on some rank; on
            the surviving ranks when a rank died or a collective timed out (bounded by the process group's
            timeout).
    """
    _save.save(state_dict, directory, group, max_shard_size, metadata)
