"""``HuggingFaceStorageReader``: torch.distributed.checkpoint's reader of Hugging Face safetensors checkpoints,
reading through the native library.

Contract (a drop-in for ``torch.distributed.checkpoint.HuggingFaceStorageReader``; ``dcp.load`` changes by one
import):

- Constructor: torch's ``(path, thread_count=1)`` plus the keyword-only ``storage_options`` (the package's
  remote options, for ``s3://`` and ``https://`` paths).
- ``read_metadata()`` returns what torch's reader returns for a local directory: every ``*.safetensors`` file in
  it (listed as torch lists them), each tensor a chunk at offset zero, or at the ``saved_offsets`` of the file's
  ``DCP_SHARDING_INFO`` metadata (per-rank shard files of ``HuggingFaceStorageWriter(save_distributed=True)``);
  a chunk's storage data names the file by the same path. A remote directory cannot be listed: its
  ``model.safetensors.index.json`` names the files (else the directory's one ``model.safetensors``), and only
  their headers are fetched.
- ``read_data(plan, planner)`` serves every ``ReadItem`` of the plan (a box of a file's tensor into the box of
  ``planner.resolve_tensor(item)``), all files and items at once on a pool of ``max(thread_count, ...)``
  threads: each file is opened once, each box is planned with ``File.plan_slice`` and read with
  ``File.read_slice`` (native, the GIL released) straight into the destination where it is a contiguous CPU
  tensor of the file's dtype, else into a temporary of the file's dtype that ``dest.copy_`` casts and moves to
  the destination's device. Then ``planner.commit_tensor`` for each item, in plan order, and a completed
  ``torch.futures.Future``. The first error of any read is raised once every read has ended.
- Thread rule: like torch's reader, an instance serves one load at a time (external synchronization).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future as _PoolFuture
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch.distributed.checkpoint import HuggingFaceStorageReader as _TorchHuggingFaceStorageReader
# torch's own names and record of a chunk's storage data (the file by its path, the chunk's shape and dtype):
# metadata from either reader serves the other.
from torch.distributed.checkpoint._hf_utils import CUSTOM_METADATA_KEY as SHARDING_INFO_KEY
from torch.distributed.checkpoint._hf_utils import SAVED_OFFSETS_KEY, SUFFIX
from torch.distributed.checkpoint._hf_utils import _HFStorageInfo as StorageInfo
from torch.distributed.checkpoint._hf_utils import _metadata_fn as INDEX_NAME
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from .. import _safetensors_cpp as _cpp
from .._core import StorageOptions, fspath, remote_pairs
from .._safe_open import reading_backend
from .._torch_types import empty, torch_dtype, torch_shape

__all__ = ["BACKEND", "HuggingFaceStorageReader", "INDEX_NAME", "SAVED_OFFSETS_KEY", "SHARDING_INFO_KEY",
           "SINGLE_FILE_NAME", "SUFFIX", "describe", "read_item"]

#: A remote directory without an index: its one file, as the hub names it.
SINGLE_FILE_NAME = "model.safetensors"

#: How the reader opens files: ``"auto"``, as every load of the package that reads (not views) does.
BACKEND: str = reading_backend("mmap", True)

#: A file the metadata describes: its path as the storage data names it, the open file, the tensors it serves.
Described = Tuple[str, Any, List[str]]


class HuggingFaceStorageReader(_TorchHuggingFaceStorageReader):
    """Reads a Hugging Face safetensors checkpoint (a local directory, or an ``s3://`` / ``https://`` one) for
    ``torch.distributed.checkpoint.load``; the module docstring states the contract. Not safe for concurrent
    use by multiple threads (one load at a time, as torch's reader)."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], thread_count: int = 1, *,
                 storage_options: Optional[StorageOptions] = None) -> None:
        """path: the checkpoint's directory, local or remote. thread_count: the fewest threads ``read_data``
        reads with (torch's meaning: threads over files; here over boxes). storage_options: for remote paths,
        as ``safe_open`` takes them."""
        self._remote_pairs: List[Tuple[str, str]] = remote_pairs(storage_options)
        self._opened: Dict[str, Any] = {}  # path -> File: what read_metadata opened, for read_data
        super().__init__(path=path, thread_count=thread_count)
        self._keep_remote_path(path)

    def _keep_remote_path(self, path: Union[str, "os.PathLike[str]", None]) -> None:
        """torch's FileSystem makes a ``Path`` of the path, which folds ``s3://`` into ``s3:/``: a URL stays
        text."""
        if path is not None and _cpp.is_remote_location(fspath(path)):
            self.path = fspath(path)

    def reset(self, checkpoint_id: Union[str, "os.PathLike[str]", None] = None) -> None:
        """torch's reset (a new load id; ``checkpoint_id``, if given, is the new path), and forgets open files."""
        self._opened = {}
        super().reset(checkpoint_id)
        self._keep_remote_path(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, "os.PathLike[str]"]) -> bool:
        """True for what torch's reader takes (a local path) and for the remote locations the package reads."""
        if isinstance(checkpoint_id, (str, os.PathLike)) and _cpp.is_remote_location(fspath(checkpoint_id)):
            return True
        return super().validate_checkpoint_id(checkpoint_id)

    # -- metadata ------------------------------------------------------------------------------------------------

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's metadata, as torch's reader builds it (module docstring)."""
        self._opened = {}
        location = fspath(self.path)
        described = self._remote_files(location) if _cpp.is_remote_location(location) else self._local_files()
        for path, file, _ in described:
            self._opened[path] = file
        metadata = describe(described)
        metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _local_files(self) -> List[Described]:
        """Every ``*.safetensors`` file of the directory, in the order torch's reader lists them, all tensors."""
        out: List[Described] = []
        for path in self.fs.ls(self.path):
            if path.endswith(SUFFIX):
                file = _cpp.File(path, BACKEND)
                out.append((path, file, file.keys()))
        return out

    def _remote_files(self, location: str) -> List[Described]:
        """The files a remote directory's index names (each with the tensors the index assigns to it), else its
        ``model.safetensors``."""
        base = location.rstrip("/")
        try:
            sharded = _cpp.sharded.ShardedFile.open_index(f"{base}/{INDEX_NAME}", BACKEND, remote=self._remote_pairs)
        except FileNotFoundError:
            try:
                sharded = _cpp.sharded.ShardedFile.open_files([f"{base}/{SINGLE_FILE_NAME}"], BACKEND,
                                                      remote=self._remote_pairs)
            except FileNotFoundError as e:
                raise type(e)(f"{location}: neither {INDEX_NAME} nor {SINGLE_FILE_NAME} was found") from None
        names: List[List[str]] = [[] for _ in sharded.shards]
        for name, _ in sharded.infos():
            names[sharded.shard_of(name)].append(name)
        return [(file.path, file, sorted(held)) for file, held in zip(sharded.shards, names)]

    # -- data ----------------------------------------------------------------------------------------------------

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Reads every item of ``plan`` into ``planner``'s tensors, then commits them (module docstring)."""
        where = [self.storage_data[item.storage_index].relative_path for item in plan.items]
        paths = sorted(set(where))
        destinations = [planner.resolve_tensor(item).detach() for item in plan.items]
        workers = max(1, self.thread_count, min(len(plan.items), _cpp.engine.DEFAULT_READER_THREADS))
        try:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="safetensors-dcp") as pool:
                files = dict(zip(paths, _all([pool.submit(self._open, path) for path in paths])))
                _all([pool.submit(read_item, files[path], item, dest)
                      for path, item, dest in zip(where, plan.items, destinations)])
        finally:
            self._opened = {}  # a load opens its files once; the next read_metadata opens them again
        for item, dest in zip(plan.items, destinations):
            planner.commit_tensor(item, dest)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _open(self, path: str) -> Any:
        """The file at ``path``: the one read_metadata opened in this process, else opened now."""
        file = self._opened.get(path)
        return file if file is not None else _cpp.File(path, BACKEND, remote=self._remote_pairs)


def _all(futures: List[_PoolFuture]) -> List[Any]:
    """The results of ``futures`` once every one has ended; the first error (in submission order) raised."""
    wait(futures)
    return [f.result() for f in futures]


def describe(files: Iterable[Described]) -> Metadata:
    """torch's HuggingFaceStorageReader.read_metadata over open files: per tensor its global size and chunks
    (offset zero, or the file's ``DCP_SHARDING_INFO`` saved offsets), per chunk the file's path."""
    tensors: Dict[str, TensorStorageMetadata] = {}
    storage: Dict[MetadataIndex, StorageInfo] = {}
    for path, file, names in files:
        extra = file.metadata()
        sharding = json.loads(extra[SHARDING_INFO_KEY]) if extra and extra.get(SHARDING_INFO_KEY) else None
        for name in names:
            code, header_shape, _, _ = file.info(name)
            shape = list(header_shape)
            offset = list(sharding[name][SAVED_OFFSETS_KEY]) if sharding is not None else [0] * len(shape)
            dtype = torch_dtype(code)
            chunk = ChunkStorageMetadata(offsets=torch.Size(offset), sizes=torch.Size(shape))
            known = tensors.get(name)
            if known is None:
                tensors[name] = TensorStorageMetadata(
                    properties=TensorProperties(dtype=dtype),
                    size=torch.Size([s + o for s, o in zip(shape, offset)]),
                    chunks=[chunk],
                )
            else:
                known.chunks.append(chunk)
                known.size = torch.Size([max(k, s + o) for k, s, o in zip(known.size, shape, offset)])
            storage[MetadataIndex(fqn=name, offset=offset)] = StorageInfo(
                relative_path=path, shape=torch.Size(shape), dtype=dtype)
    return Metadata(state_dict_metadata=tensors, storage_data=storage)


def read_item(file: Any, item: ReadItem, dest: torch.Tensor) -> None:
    """Reads one item's box of ``file``'s tensor into ``dest`` (its resolved destination): straight into its
    memory where it is a contiguous CPU tensor of the file's dtype, else through a temporary and ``copy_``."""
    name = item.storage_index.fqn
    code = file.info(name)[0]
    box = file.plan_slice(name, [slice(o, o + n) for o, n in zip(item.storage_offsets, item.lengths)])
    shape = torch.Size(torch_shape(code, tuple(box.shape)))
    if dest.size() != shape:  # torch's reader's check and text
        raise AssertionError(f"req {item.storage_index} mismatch sizes {dest.size()} vs {shape}")
    if _takes_bytes(dest, torch_dtype(code), box.nbytes):
        if box.nbytes:
            file.read_slice(name, box, dest.data_ptr())
        return
    tmp = empty(code, tuple(box.shape), "cpu")
    if box.nbytes:
        file.read_slice(name, box, tmp.data_ptr())
    dest.copy_(tmp)


def _takes_bytes(dest: torch.Tensor, dtype: torch.dtype, nbytes: int) -> bool:
    """Whether the file's bytes can land in ``dest``'s memory as they are."""
    return (type(dest) is torch.Tensor and dest.device.type == "cpu" and dest.layout == torch.strided
            and dest.dtype == dtype and dest.is_contiguous() and not dest.is_conj() and not dest.is_neg()
            and dest.numel() * dest.element_size() == nbytes)

