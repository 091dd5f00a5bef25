"""``load_state_dict``: a sharded model's state dict (DTensors on any mesh, plain tensors) filled in place from a
safetensors checkpoint, each rank reading only the bytes of its own pieces.

Each entry becomes a piece of this rank's plan (``_placement``: a DTensor's box from its mesh and placements, a
plain tensor whole), so the load is the distributed loader's (``_load.run``): one schedule for the group, bytes
several ranks need (replicated tensors, the replicated dimension of a 2-D mesh) read once and exchanged, a box
of an inner dimension read as strided runs, and every byte landing straight in the rank's tensor where it can
(``_moving.Landing``: same dtype, contiguous, on the device the bytes travel on), else converted into it as
``Tensor.copy_`` converts.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Set, Tuple

import torch
import torch.distributed as dist

from .._core import SafetensorError
from .._plan import PlanValue, plan_pieces
from .._torch_types import torch_dtype
from ._load import Prepared, run
from ._moving import Landing, LoadStats
from ._opening import Opened
from ._placement import box_shape, box_slices, is_whole, local_piece

__all__ = ["IncompatibleKeys", "load_state_dict"]


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` returns, as ``torch.nn.Module.load_state_dict`` does: the state dict's keys
    the checkpoint lacks, and the checkpoint's tensors the state dict has no key for."""

    missing_keys: List[str]
    unexpected_keys: List[str]


def load_state_dict(state_dict: Mapping[str, Any], open_source: Callable[[str], Opened], *,
                    group: Optional[dist.ProcessGroup], strict: bool, backend: str, chunk_bytes: int,
                    stats: Optional[LoadStats]) -> IncompatibleKeys:
    keys = list(state_dict)
    found: Dict[str, List[str]] = {"missing": [], "unexpected": []}

    target, device_error = _target_device(state_dict)

    def prepare(opened: Opened, comm: torch.device) -> Prepared:
        if device_error is not None:  # raised here, so that every rank hears of it
            raise device_error
        where = {name: i for i, shard in enumerate(opened.shards) for name in shard.names}
        wanted: Set[str] = set(keys)
        found["missing"] = [k for k in keys if k not in where]
        found["unexpected"] = [name for shard in opened.shards for name in shard.names if name not in wanted]
        if strict and found["missing"]:
            listed = ", ".join(found["missing"][:8]) + (", ..." if len(found["missing"]) > 8 else "")
            raise SafetensorError(f"load_state_dict: the checkpoint does not contain {len(found['missing'])} "
                                  f"tensor(s) of the state dict: {listed} (strict=False loads the others)")
        plans: List[Dict[str, PlanValue]] = [{} for _ in opened.shards]
        locals_: Dict[str, Any] = {}
        for name in keys:
            if name not in where:
                continue
            piece = local_piece(name, state_dict[name])
            shard = opened.shards[where[name]]
            code, shape, _, _ = shard.file.info(name)
            if tuple(shape) != piece.shape:
                raise SafetensorError(f"load_state_dict: tensor {name} has shape {list(shape)} in {shard.label} but "
                                      f"{list(piece.shape)} in the state dict")
            if tuple(piece.local.shape) != box_shape(piece.box):
                raise SafetensorError(f"load_state_dict: tensor {name}: its local tensor has shape "
                                      f"{list(piece.local.shape)}, its placements give {list(box_shape(piece.box))}")
            _check_conversion(name, code, piece.local)
            plans[where[name]][name] = None if is_whole(piece.box, piece.shape) else box_slices(piece.box)
            locals_[name] = piece.local
        pieces = [plan_pieces(shard.file, plan, empty_ok=True) for shard, plan in zip(opened.shards, plans)]
        landings = [[Landing(locals_[name], p.code, comm) if p.end > p.begin and comm.type != "meta" else None
                     for name, p in file_pieces] for file_pieces in pieces]
        return pieces, landings

    with torch.no_grad():
        run(open_source, target, group, backend, chunk_bytes, stats, prepare)
    return IncompatibleKeys(found["missing"], found["unexpected"])


def _target_device(state_dict: Mapping[str, Any]) -> Tuple[torch.device, Optional[SafetensorError]]:
    """The device every destination lives on (one device type per load: the bytes travel on one), or the
    error that there are several."""
    devices = set()
    for value in state_dict.values():
        if isinstance(value, torch.Tensor):
            devices.add(value.device)
    types = {d.type for d in devices}
    if len(types) > 1:
        return torch.device("cpu"), SafetensorError(
            f"load_state_dict: the state dict's tensors are on several device types ({', '.join(sorted(types))}): "
            "load each device type's tensors in a call of its own")
    return (min(devices, key=str) if devices else torch.device("cpu")), None


def _check_conversion(name: str, code: str, dest: torch.Tensor) -> None:
    """Refuses, before anything is read, a file dtype that ``Tensor.copy_`` cannot convert into ``dest``."""
    source = torch_dtype(code)
    if source == dest.dtype or dest.device.type == "meta":
        return
    try:
        torch.zeros((), dtype=dest.dtype).copy_(torch.zeros((), dtype=source))
    except Exception as e:
        raise SafetensorError(f"load_state_dict: tensor {name} is {source} in the checkpoint and cannot be "
                              f"converted into the state dict's {dest.dtype}: {e}") from None
