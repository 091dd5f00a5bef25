"""One rank of tests/python/distributed/test_dcp_reader.py: joins a gloo process group, loads checkpoints into DTensor state
dicts with ``torch.distributed.checkpoint.load`` through safetensors.dcp's reader and torch's, and writes what it
got (digests of each local tensor, and of what ``load_file`` cut with ``compute_local_shape_and_global_offset``
says it should get) to a JSON file.

Usage: dcp_worker.py SPEC.json OUT_DIR. RANK and WORLD_SIZE come from the environment, rendezvous through the
TCPStore at ``ST_DIST_STORE=host:port``; every collective is bounded by ``ST_DIST_TIMEOUT`` seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from safetensors.dcp import HuggingFaceStorageReader
from safetensors.torch import load_file
from worker import join_group  # the script directory is on sys.path

#: Per tensor, its placements on a 2x2 mesh (a 1-D mesh of 2 takes the first): set "a" and set "b" differ for
#: every tensor that can be split, so that a checkpoint saved with one is loaded with the other. "-": a plain
#: tensor (every rank loads all of it); "-t": a plain, transposed (non-contiguous) destination.
PLACEMENTS: Dict[str, Dict[str, List[str]]] = {
    "a": {"w2d": ["S0", "S1"], "w3d": ["S1", "S2"], "v1d": ["S0", "S0"], "ids": ["R", "S1"],
          "bytes": ["S1", "R"], "mask": ["S0", "S1"], "bf": ["S1", "S0"], "bf_keep": ["S0", "S0"],
          "half": ["S2", "S0"], "scalar": ["R", "R"], "empty": ["S0", "S1"], "plain": ["-"], "nc": ["-t"]},
    "b": {"w2d": ["S1", "S0"], "w3d": ["S2", "R"], "v1d": ["R", "S0"], "ids": ["S0", "S0"],
          "bytes": ["S0", "S1"], "mask": ["R", "S1"], "bf": ["S0", "R"], "bf_keep": ["S1", "S1"],
          "half": ["S0", "S1"], "scalar": ["R", "R"], "empty": ["S1", "R"], "plain": ["-"], "nc": ["-t"]},
}


def placements(names: List[str], world: int) -> Tuple[Any, ...]:
    out = [Replicate() if n == "R" else Shard(int(n[1:])) for n in names]
    return tuple(out[:1] if world == 2 else out)


def digest(t: torch.Tensor) -> List[Any]:
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return [str(t.dtype), list(t.shape), hashlib.sha256(data).hexdigest()]


def local_box(full: torch.Tensor, mesh: DeviceMesh, places: Tuple[Any, ...]) -> torch.Tensor:
    shape, offset = compute_local_shape_and_global_offset(full.shape, mesh, places)
    return full[tuple(slice(o, o + s) for o, s in zip(offset, shape))]


def state_dict(full: Dict[str, torch.Tensor], mesh: DeviceMesh, which: str, world: int, *,
               cast: Dict[str, str], filled: bool) -> Dict[str, torch.Tensor]:
    """The state dict of placement set ``which``: the true values (``filled``), else garbage (0x5A bytes, not
    even a valid bool) in the destination dtypes ``cast`` names."""
    out: Dict[str, torch.Tensor] = {}
    for name, tensor in full.items():
        dtype = getattr(torch, cast[name]) if name in cast else tensor.dtype
        spec = PLACEMENTS[which][name]
        if spec[0] in ("-", "-t"):
            local = tensor.clone() if spec[0] == "-" else tensor.t().contiguous().t()
        else:
            places = placements(spec, world)
            local = local_box(tensor, mesh, places).contiguous().clone()
        local = local.to(dtype)
        if not filled:
            memory = local if local.is_contiguous() else local.t()  # "-t": its transpose is contiguous
            memory.reshape(-1).view(torch.uint8).fill_(0x5A)
        if spec[0] in ("-", "-t"):
            out[name] = local
        else:
            out[name] = DTensor.from_local(local, mesh, places, run_check=False, shape=tensor.shape,
                                           stride=torch.empty(tensor.shape).stride())
    return out


def local_digests(sd: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    return {name: digest(t.to_local() if isinstance(t, DTensor) else t) for name, t in sd.items()}


def metadata_equal(path: str) -> Dict[str, Any]:
    ours = HuggingFaceStorageReader(path).read_metadata()
    theirs = dcp.HuggingFaceStorageReader(path).read_metadata()
    return {"state_dict_metadata": ours.state_dict_metadata == theirs.state_dict_metadata,
            "storage_data": ours.storage_data == theirs.storage_data,
            "chunks": {k: len(v.chunks) for k, v in ours.state_dict_metadata.items()}}


def run(scenario: Dict[str, Any], full: Dict[str, torch.Tensor], mesh: DeviceMesh, rank: int,
        world: int) -> Dict[str, Any]:
    path, which, cast = scenario["path"], scenario["load"], scenario.get("cast", {})
    names = scenario.get("names") or list(full)
    full = {n: full[n] for n in names}
    if "save" in scenario:  # torch's writer, every rank its own shard file (DCP_SHARDING_INFO)
        source = state_dict(full, mesh, scenario["save"], world, cast={}, filled=True)
        source = {n: t if isinstance(t, DTensor) else t.contiguous() for n, t in source.items()}  # save's rule
        dcp.save(source, storage_writer=dcp.HuggingFaceStorageWriter(path, save_distributed=True))
        dist.barrier()
    result: Dict[str, Any] = {}
    targets = state_dict(full, mesh, which, world, cast=cast, filled=True)
    result["expected"] = local_digests(targets)
    mine = state_dict(full, mesh, which, world, cast=cast, filled=False)
    reader = HuggingFaceStorageReader(path, thread_count=scenario.get("threads", 1),
                                      storage_options=scenario.get("storage_options"))
    dcp.load(mine, storage_reader=reader)
    result["ours"] = local_digests(mine)
    if scenario.get("torch", True):
        theirs = state_dict(full, mesh, which, world, cast=cast, filled=False)
        dcp.load(theirs, storage_reader=dcp.HuggingFaceStorageReader(path))
        result["torch"] = local_digests(theirs)
        if rank == 0:
            result["metadata"] = metadata_equal(path)
    return result


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    out_path = os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.json")
    rank, world = join_group()
    mesh = init_device_mesh("cpu", (2,) if world == 2 else (2, 2))
    full = load_file(spec["full"])
    results: Dict[str, Any] = {}
    for scenario in spec["scenarios"]:
        try:
            results[scenario["name"]] = run(scenario, full, mesh, rank, world)
        except BaseException:
            results[scenario["name"]] = {"crash": traceback.format_exc()}
            with open(out_path, "w") as f:
                json.dump(results, f)
            os._exit(0)  # the process group may be broken: nothing more to do, nothing to tear down
        with open(out_path + ".tmp", "w") as f:  # after every scenario: a later hang keeps these
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)
    dist.destroy_process_group()
    # No interpreter shutdown: DCP's own last collectives (torch's all_gather_object) leave their tensors to
    # gloo's worker threads, which drop them after wait() returned, taking the GIL; one that meets a finalizing
    # interpreter aborts the process. safetensors.distributed's calls wait for that (see the other workers).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
