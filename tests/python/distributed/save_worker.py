"""One rank of a distributed-save test (and the helpers the tests share with it): joins a gloo process group
over a TCPStore the test hosts, runs the scenarios of the spec, and writes one JSON result per scenario.

Usage: save_worker.py SPEC.json OUT_DIR, with RANK, WORLD_SIZE, ST_DIST_STORE=host:port and ST_DIST_TIMEOUT
(seconds bounding every collective) in the environment. State dicts are built from a seed, identically in
the test process (``full_state_dict``), so the test compares the files with ``save_file`` of the full tensors.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Dict, List, Tuple

import torch

#: (name, dtype, global shape, placements per mesh dimension: "S0", "S1", "R", or "plain")
Entry = Tuple[str, str, List[int], List[str]]

DTYPES = ["bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
          "float8_e5m2fnuz", "float8_e8m0fnu"]

#: Left out of DCP saves: torch's HuggingFaceStorageReader sizes a float4_e2m1fn_x2 tensor by its header (value)
#: shape, not torch's shape, so it cannot load one back.
DCP_LEFT_OUT = ("f4",)


def entries(mesh_ndim: int, world: int) -> List[Entry]:
    """A state dict covering every placement of the mesh, uneven shards, every dtype, empty and 0-d tensors."""
    if mesh_ndim == 1:
        placements = [["S0"], ["S1"], ["R"]]
    else:
        placements = [["S0", "S1"], ["S1", "S0"], ["R", "S0"], ["S0", "R"], ["S0", "S0"], ["R", "R"], ["S1", "R"]]
    out: List[Entry] = []
    for i, p in enumerate(placements):
        out.append((f"layer.{i}.weight", "float32", [7 + i, 5 + 2 * i], p))
        out.append((f"layer.{i}.three_d", "bfloat16", [3, 5, 6], p))
    for dtype in DTYPES:
        out.append((f"dtype.{dtype}.rows", dtype, [world + 3, 3], ["S0"] * mesh_ndim))
        out.append((f"dtype.{dtype}.cols", dtype, [2, world + 1], ["S1"] + ["R"] * (mesh_ndim - 1)))
        out.append((f"dtype.{dtype}.plain", dtype, [5], ["plain"]))
    out += [
        ("short", "float32", [world - 1], ["S0"] * mesh_ndim),  # a rank with nothing
        ("empty", "float32", [0, 4], ["S0"] * mesh_ndim),
        ("empty.plain", "int64", [3, 0], ["plain"]),
        ("scalar", "float64", [], ["plain"]),
        ("scalar.dtensor", "bfloat16", [], ["R"] * mesh_ndim),
        ("packed.f4", "float4_e2m1fn_x2", [4, 2], ["plain"]),
    ]
    return out


def full_tensor(name: str, dtype: str, shape: List[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash_name(name) + seed)
    dt = getattr(torch, dtype)
    n = 1
    for s in shape:
        n *= s
    if dt == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    raw = torch.randint(0, 256, (n * dt.itemsize,), generator=g, dtype=torch.uint8)
    if dt.is_floating_point and dt.itemsize > 1:  # finite values, no NaN payload games
        return torch.randn(shape, generator=g).to(dt)
    return raw.view(dt).reshape(shape)


def hash_name(name: str) -> int:
    return sum((i + 1) * ord(c) for i, c in enumerate(name))


def full_state_dict(spec: List[Entry], seed: int) -> Dict[str, torch.Tensor]:
    return {name: full_tensor(name, dtype, shape, seed) for name, dtype, shape, _ in spec}


def sharded_state_dict(spec: List[Entry], seed: int, mesh: Any) -> Dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    out = {}
    for name, dtype, shape, placements in spec:
        full = full_tensor(name, dtype, shape, seed)
        if placements == ["plain"]:
            out[name] = full
            continue
        ps = [Replicate() if p == "R" else Shard(int(p[1])) for p in placements]
        out[name] = distribute_tensor(full, mesh, ps, src_data_rank=None)
    return out


def scenario(rank: int, world: int, args: Dict[str, Any], mesh: Any) -> Dict[str, Any]:
    import safetensors.distributed as sdist
    from safetensors.distributed import _files

    kind = args["kind"]
    spec = entries(mesh.ndim, world)
    sd = sharded_state_dict(spec, args.get("seed", 0), mesh)
    directory = args["dir"].replace("{rank}", str(rank))
    if kind == "save":
        from worker import LENT, held_count

        LENT.clear()
        sdist.save_state_dict(sd, directory, max_shard_size=args["max"], metadata=args.get("metadata"))
        if not LENT or held_count():  # the save returned with gloo's threads still holding its tensors
            raise AssertionError(f"{held_count()} of the {len(LENT)} tensors given to collectives still held")
        return {}
    if kind in ("fail", "die"):
        original = _files.write_piece

        def seam(*a: Any, **k: Any) -> None:
            if rank == args["rank"]:
                if kind == "die":
                    os._exit(3)
                raise OSError(28, "No space left on device (injected)")
            original(*a, **k)

        _files.write_piece = seam
        try:
            sdist.save_state_dict(sd, directory, max_shard_size=args["max"])
        finally:
            _files.write_piece = original
        return {}
    if kind == "disagree":
        if rank == 1:
            sd["scalar"] = torch.zeros(2, dtype=torch.float64)
        sdist.save_state_dict(sd, directory)
        return {}
    if kind == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader as TorchReader
        from torch.distributed.checkpoint import HuggingFaceStorageWriter as TorchWriter

        from safetensors.dcp import HuggingFaceStorageWriter

        sd = {k: v for k, v in sd.items() if not any(x in k for x in DCP_LEFT_OUT)}
        mapping = args.get("mapping")
        if args.get("torch_writer"):
            writer = TorchWriter(directory, save_distributed=True)
        else:
            writer = HuggingFaceStorageWriter(directory, fqn_to_index_mapping=mapping, save_distributed=True,
                                              enable_consolidation=args.get("consolidate", False))
        dcp.save(sd, storage_writer=writer)
        if args.get("torch_writer"):
            return {}
        back = {k: torch.zeros_like(v) for k, v in sd.items()}
        dcp.load(back, storage_reader=TorchReader(directory))
        return {"mismatched": [k for k in sd if not torch.equal(_bytes(back[k]), _bytes(sd[k]))]}
    raise ValueError(kind)


def _bytes(t: Any) -> torch.Tensor:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.contiguous().reshape(-1).view(torch.uint8)


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from worker import join_group, watch_collectives  # the script directory is on sys.path

    spec = json.loads(open(sys.argv[1]).read())
    out = sys.argv[2]
    rank, world = join_group()
    watch_collectives()
    mesh = init_device_mesh("cpu", tuple(spec["mesh"]))
    for i, args in enumerate(spec["scenarios"]):
        try:
            result = {"ok": scenario(rank, world, args, mesh)}
        except BaseException as e:  # noqa: BLE001 - the test checks the text (DCP's CheckpointException too)
            result = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        with open(os.path.join(out, f"{i}.{rank}.json"), "w") as f:
            json.dump(result, f)
        if args.get("last_collective"):
            break
    # No teardown: after a scenario that killed a rank the group cannot be destroyed cleanly.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
