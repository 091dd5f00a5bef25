"""``HuggingFaceStorageWriter``: torch DCP's Hugging Face writer, writing the final files straight from every
rank's shards.

torch's writer (torch.distributed.checkpoint.hf_storage) writes one file per rank (``save_distributed``) and,
with ``enable_consolidation``, reads them all back on the coordinator to write the full files. This one
writes the full files directly, through ``safetensors.distributed``'s multi-writer machinery
(``_files``): the coordinator plans every file's layout from the global plan (the layout ``save_file``
gives, so each file is byte-identical to ``save_file(its full tensors, metadata={"format": "pt"})``) and
creates the files under temporary names; each rank writes its ``WriteItem`` chunks -- boxes of the full
tensors -- at their final offsets and fsyncs them; the coordinator renames the files into place in
``finish`` (after DCP's gather of write results: every rank has written), then writes the index.

Files: ``model-0000i-of-0000N.safetensors`` per ``fqn_to_index_mapping`` (N its largest index), else one
``model-00001-of-00001.safetensors``, as torch names them; ``model.safetensors.index.json`` as torch writes it.
A rank whose write fails removes the temporaries before DCP raises on every rank; a rank killed mid-write
leaves them (hidden ``.NAME.TOKEN.tmp`` files) -- final names are never touched before ``finish``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from typing import Dict, List, Optional, Tuple

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import SerializationFormat
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .._core import SafetensorError
from ..distributed._files import (FileLayout, TensorDesc, create_temporary, dtype_code, nbytes,
                                  plan_file, publish, remove_quietly, temporary_name, WritePiece,
                                  write_pieces)

__all__ = ["HuggingFaceStorageWriter", "file_name", "plan_outputs", "write_index"]

INDEX_FILE = "model.safetensors.index.json"


def file_name(index: int, largest: int) -> str:
    """torch's name of output file ``index`` of ``largest``: ``model-00001-of-00003.safetensors``."""
    return f"model-{index:05d}-of-{largest:05d}.safetensors"


def plan_outputs(descs: List[TensorDesc], mapping: Optional[Dict[str, int]]) -> List[FileLayout]:
    """The output files of ``descs``: one per index of ``mapping`` (fqn -> 1..N), else one file; each laid out
    as ``save_file(tensors, metadata={"format": "pt"})`` writes it. Raises SafetensorError for a tensor the
    mapping does not place."""
    members: Dict[str, List[TensorDesc]] = {}
    if mapping is None:
        members[file_name(1, 1)] = list(descs)
    else:
        largest = max(mapping.values(), default=1)
        for desc in descs:
            if desc[0] not in mapping:
                raise SafetensorError(f"tensor {desc[0]} is not in fqn_to_index_mapping")
            members.setdefault(file_name(mapping[desc[0]], largest), []).append(desc)
    return [plan_file(name, m, {"format": "pt"}) for name, m in sorted(members.items())]


def write_index(directory: str, layouts: List[FileLayout], token: str) -> None:
    """Writes ``model.safetensors.index.json`` for ``layouts`` as torch writes it (json, indent 2), atomically
    (a synced temporary renamed into place)."""
    weight_map = {fqn: f.file_name for f in layouts for fqn in f.offsets}
    total = sum(end - begin for f in layouts for begin, end in f.offsets.values())
    text = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    temporary = f".{INDEX_FILE}.{token}.tmp"
    with open(os.path.join(directory, temporary), "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    publish(directory, [(temporary, INDEX_FILE)])


@dataclasses.dataclass
class Assignment:
    """What the coordinator sends each rank in its plan's ``storage_data``: the save's token, every temporary
    name (to remove on failure) and, per fqn, its file and the absolute offset of its bytes."""

    token: str
    temporaries: List[str]
    place: Dict[str, Tuple[str, int]]


@dataclasses.dataclass
class StorageInfo:
    """A write result's storage data: the file holding the chunk (relative to the directory)."""

    relative_path: str
    length: int


class HuggingFaceStorageWriter(FileSystemWriter):
    """A drop-in for ``torch.distributed.checkpoint.HuggingFaceStorageWriter`` writing the full safetensors
    files directly (see the module docstring). ``save_distributed`` and ``enable_consolidation`` are accepted
    as torch takes them; the output is always the full files in ``path`` (no ``sharded/`` copy is made, since
    no per-rank file is ever written). ``thread_count_consolidation`` is accepted and unused. Not thread-safe:
    one ``dcp.save`` at a time per instance."""

    def __init__(
        self,
        path: str,
        fqn_to_index_mapping: Optional[Dict[str, int]] = None,
        thread_count: int = 1,
        save_distributed: bool = False,
        enable_consolidation: bool = False,
        thread_count_consolidation: int = 1,
    ) -> None:
        super().__init__(path=path, serialization_format=SerializationFormat.SAFETENSORS, thread_count=thread_count)
        self.fqn_to_index_mapping = fqn_to_index_mapping
        self.save_distributed = save_distributed
        self.enable_consolidation = enable_consolidation
        self.consolidated_output_path: Optional[str] = str(self.path) if enable_consolidation else None
        self.thread_count_consolidation = thread_count_consolidation
        self._layouts: List[FileLayout] = []
        self._token: Optional[str] = None

    @property
    def metadata_path(self) -> str:
        return INDEX_FILE

    def _directory(self) -> str:
        return os.fspath(self.path)

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        """Coordinator: plans every file from all ranks' items and creates the temporaries."""
        descs: Dict[str, TensorDesc] = {}
        for plan in plans:
            for item in plan.items:
                fqn = item.index.fqn
                if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
                    raise SafetensorError(f"HuggingFaceStorageWriter: {fqn} is not a tensor; a safetensors file "
                                          "holds tensors only")
                desc = (fqn, dtype_code(fqn, item.tensor_data.properties.dtype),
                        tuple(int(s) for s in item.tensor_data.size))
                if descs.setdefault(fqn, desc) != desc:
                    raise SafetensorError(f"tensor {fqn}: ranks disagree on its dtype and shape")
        self._layouts = plan_outputs(list(descs.values()), self.fqn_to_index_mapping)
        self._token = token = secrets.token_hex(8)
        temporaries = [temporary_name(f.file_name, token) for f in self._layouts]
        place = {fqn: (f.file_name, begin) for f in self._layouts for fqn, (begin, _) in f.offsets.items()}
        os.makedirs(self._directory(), exist_ok=True)
        try:
            for f in self._layouts:
                create_temporary(self._directory(), f, token)
        except BaseException:
            remove_quietly(self._directory(), temporaries)
            raise
        return [dataclasses.replace(plan, storage_data=Assignment(token, temporaries, place)) for plan in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        """Every rank: writes its chunks at their final offsets, fsyncs them."""
        assignment: Assignment = plan.storage_data
        results, pieces = [], []
        try:
            for item in plan.items:
                fqn = item.index.fqn
                td = item.tensor_data
                shape = tuple(int(s) for s in td.size)
                box = tuple((int(o), int(o) + int(s)) for o, s in zip(td.chunk.offsets, td.chunk.sizes))
                tensor = planner.resolve_data(item)
                if not isinstance(tensor, torch.Tensor):
                    raise SafetensorError(f"HuggingFaceStorageWriter: {fqn} is not a tensor")
                name, begin = assignment.place[fqn]
                pieces.append(WritePiece(name, fqn, begin, shape, box, tensor))
                size = nbytes(dtype_code(fqn, tensor.dtype), tuple(int(s) for s in td.chunk.sizes))
                results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=StorageInfo(name, size)))
            write_pieces(self._directory(), assignment.token, pieces)
        except BaseException:
            remove_quietly(self._directory(), assignment.temporaries)
            raise
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """Coordinator, after every rank has written: renames the files into place, then writes the index."""
        directory, token = self._directory(), self._token
        if token is None:
            raise SafetensorError("HuggingFaceStorageWriter.finish: no save was planned (prepare_global_plan)")
        try:
            publish(directory, [(temporary_name(f.file_name, token), f.file_name) for f in self._layouts])
        except BaseException:
            remove_quietly(directory, [temporary_name(f.file_name, token) for f in self._layouts])
            raise
        write_index(directory, self._layouts, token)
        self._token = None
