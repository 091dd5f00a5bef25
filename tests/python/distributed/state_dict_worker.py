"""One rank of a ``load_state_dict`` test: joins a gloo process group, builds DTensor state dicts for the
scenarios it is given, loads them, and writes what it saw to a JSON file.

Usage: state_dict_worker.py SPEC.json OUT_DIR (RANK, WORLD_SIZE and ST_DIST_STORE from the environment, as for
worker.py). Each scenario names a checkpoint, a mesh shape and, per tensor, its placements (``"S0"``: Shard(0),
``"R"``: Replicate(), ``"P"``: Partial(), ``"plain"``: a plain tensor) and destination dtype. The expected value
of every local tensor is the full tensor from a single-process ``load_file``, cut with torch's own
``compute_local_shape_and_global_offset`` and converted with ``Tensor.to``; the result records, per tensor,
whether the loaded bytes equal it.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

import safetensors.distributed as sdist
from safetensors import SafetensorError, safe_open
from safetensors.distributed import _moving
from worker import LENT, held_count, join_group, watch_collectives  # the script directory is on sys.path


def io_counters() -> Dict[str, int]:
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            key, value = line.split(":")
            out[key] = int(value)
    return out


def placement(code: str) -> Any:
    if code == "R":
        return Replicate()
    if code == "P":
        return Partial()
    return Shard(int(code[1:]))


def full_tensors(files: List[str]) -> Dict[str, torch.Tensor]:
    out = {}
    for path in files:
        with safe_open(path, "pt", backend="pread") as f:
            for name in f.keys():
                out[name] = f.get_tensor(name)
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def build(scenario: Dict[str, Any], full: Dict[str, torch.Tensor], mesh: Any):
    """The state dict (DTensors of garbage-filled local shards, on the scenario's device) and the expected local
    values (on the CPU)."""
    state, expected = {}, {}
    device = scenario.get("device", "cpu")
    for name, spec in scenario["tensors"].items():
        source = full[name] if name in full else torch.zeros(spec.get("shape", [2]), dtype=torch.float32)
        dtype = getattr(torch, spec["dtype"]) if spec.get("dtype") else source.dtype
        shape = list(spec.get("shape", source.shape))
        if spec["placements"] == "plain":
            state[name] = torch.full(shape, 7).to(dtype).to(device)  # wrong values a missed byte would show
            expected[name] = source.to(dtype)
            continue
        placements = [placement(p) for p in spec["placements"]]
        local_shape, offset = compute_local_shape_and_global_offset(torch.Size(shape), mesh, placements)
        local = torch.empty(local_shape, dtype=dtype)
        if local.numel():
            local.reshape(-1).view(torch.uint8).fill_(0xA5)  # garbage a missed byte would show
        local = local.to(device)
        strides = []
        acc = 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        state[name] = DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(shape),
                                         stride=tuple(reversed(strides)))
        index = tuple(slice(o, o + n) for o, n in zip(offset, local_shape))
        expected[name] = source[index].to(dtype) if shape else source.to(dtype)
    return state, expected


def run_plan(scenario: Dict[str, Any], rank: int) -> Dict[str, Any]:
    """load_file / load_sharded with this rank's plan of boxes ({name: [[start, stop], ...]}): each tensor must
    be the full tensor's box."""
    full = full_tensors(scenario["files"])
    plan = {name: tuple(slice(a, b) for a, b in box) for name, box in scenario["plans"][rank].items()}
    stats = sdist.LoadStats()
    load = sdist.load_sharded if scenario.get("sharded") else sdist.load_file
    got = load(scenario["checkpoint"], plan=plan, chunk_bytes=scenario.get("chunk_bytes", 4096), stats=stats,
               backend="pread")
    checks = {name: same_bits(got[name], full[name][plan[name]]) for name in plan}
    return {"checks": checks, "order": list(got), "stats": stats.__dict__}


def run(scenario: Dict[str, Any], rank: int) -> Dict[str, Any]:
    if "plans" in scenario:
        return run_plan(scenario, rank)
    device = scenario.get("device", "cpu")
    if device != "cpu":  # the simulated Ascend NPU (tests/python/npu_sim), one device per rank
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        import npu_sim

        if not npu_sim.installed():
            npu_sim.install(1)
    mesh = init_device_mesh(device, tuple(scenario["mesh"]))
    files = scenario["files"]
    full = full_tensors(files)
    state, expected = build(scenario, full, mesh)
    stats = sdist.LoadStats()
    checkpoint = scenario["checkpoint"]
    if isinstance(checkpoint, dict):
        checkpoint = checkpoint["per_rank"][rank]
    fault = scenario.get("fault")
    if fault and fault["rank"] == rank:
        def failing(*args: Any) -> None:
            raise OSError(5, "Input/output error (injected)")
        _moving.read_chunk = failing
        _moving.read_part = failing
    before = io_counters()
    LENT.clear()
    try:
        got = sdist.load_state_dict(state, checkpoint, strict=scenario.get("strict", True),
                                    chunk_bytes=scenario.get("chunk_bytes", 4096), stats=stats,
                                    backend=scenario.get("backend", "pread"),
                                    storage_options=scenario.get("storage_options"))
    except SafetensorError as e:
        return {"error": str(e)}
    held = held_count()
    after = io_counters()
    checks = {}
    for name, value in state.items():
        local = value.to_local() if isinstance(value, DTensor) else value
        checks[name] = local.device.type == scenario.get("device", "cpu") and same_bits(local.cpu(), expected[name])
    return {"missing": got.missing_keys, "unexpected": got.unexpected_keys, "checks": checks,
            "stats": stats.__dict__, "rchar": after["rchar"] - before["rchar"],
            "type": type(got).__name__, "lent": len(LENT), "held": held}


def main() -> int:
    spec = json.load(open(sys.argv[1]))
    out_dir = sys.argv[2]
    rank, world = join_group()
    watch_collectives()
    results: Dict[str, Any] = {}
    out_path = os.path.join(out_dir, f"rank{rank}.json")
    real = (_moving.read_chunk, _moving.read_part)
    for scenario in spec["scenarios"]:
        try:
            results[scenario["name"]] = run(scenario, rank)
        except BaseException:
            results[scenario["name"]] = {"crash": traceback.format_exc()}
        finally:
            _moving.read_chunk, _moving.read_part = real
        with open(out_path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
