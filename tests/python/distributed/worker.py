"""One rank of a distributed-load test: joins a gloo process group, runs the scenarios it is given, and
writes what it saw (tensor digests, load statistics, bytes read from storage, error texts) to a JSON file.

Usage: worker.py SPEC.json OUT_DIR. The spec names the scenarios (see ``SCENARIOS``) and their arguments.
Rendezvous: ``ST_DIST_STORE=host:port`` joins a TCPStore the test process hosts; otherwise env://
(MASTER_ADDR / MASTER_PORT). RANK and WORLD_SIZE come from the environment. Every collective is bounded by
the process group's timeout (``ST_DIST_TIMEOUT`` seconds).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import sys
import time
import traceback
from typing import Any, Dict, Tuple

import torch
import torch.distributed as dist

import safetensors.distributed as sdist
from safetensors.distributed import _moving
from safetensors import SafetensorError


def digests(tensors: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    out = {}
    for name, t in tensors.items():
        if t.device.type == "meta":
            out[name] = [str(t.dtype), list(t.shape), "meta", None]
            continue
        data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out[name] = [str(t.dtype), list(t.shape), str(t.device), hashlib.sha256(data).hexdigest()]
    return out


def storage_read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return -1


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def to_plan(plan):
    if plan is None:
        return None
    return {name: None if rows is None else slice(*rows) for name, rows in plan.items()}


def per_rank(value, rank):
    """A value given per rank (a dict with "per_rank") or the same for every rank."""
    if isinstance(value, dict) and "per_rank" in value:
        return value["per_rank"][rank]
    return value


# Every tensor the loader hands to a collective (see watch_collectives), cleared before each load.
LENT: list = []


def watch_collectives() -> None:
    """Wraps the collectives the loader calls (looked up on torch.distributed at each call) to note the tensors
    they are handed: a load must return only once the backend's threads let go of them (safetensors.distributed
    ._group.released), or a process that exits right after it can abort in interpreter shutdown."""
    for name in ("all_gather", "broadcast", "isend", "irecv"):
        real = getattr(dist, name)

        def noted(first, *args, _real=real, **kwargs):
            LENT.extend(first if isinstance(first, list) else [first])
            if args and isinstance(args[0], torch.Tensor):
                LENT.append(args[0])
            return _real(first, *args, **kwargs)

        setattr(dist, name, noted)


def held_count() -> int:
    """How many of the tensors in LENT something besides Python holds, now (no wait, no GIL release)."""
    return sum(1 for t in LENT if t._use_count() > 1)


def run_load(args: Dict[str, Any], rank: int) -> Dict[str, Any]:
    LENT.clear()
    stats = sdist.LoadStats()
    kwargs = dict(plan=to_plan(per_rank(args.get("plan"), rank)),
                  chunk_bytes=per_rank(args.get("chunk_bytes", 1 << 20), rank),
                  stats=stats, backend=args.get("backend", "pread"))
    if "storage_options" in args:
        kwargs["storage_options"] = per_rank(args["storage_options"], rank)
    path = per_rank(args["path"], rank)
    cold = args.get("cold", False)
    if cold:
        for p in per_rank(args.get("cold_files", [path]), rank):
            drop_cache(p)
        dist.barrier()
    before = storage_read_bytes()
    start = time.monotonic()
    try:
        if args.get("sharded"):
            tensors = sdist.load_sharded(path, args.get("device", "cpu"), **kwargs)
        else:
            tensors = sdist.load_file(path, args.get("device", "cpu"), **kwargs)
    except SafetensorError as e:
        return {"error": str(e), "error_type": type(e).__name__, "seconds": time.monotonic() - start}
    held = held_count()
    result = {"seconds": time.monotonic() - start, "tensors": digests(tensors), "order": list(tensors),
              "stats": stats.__dict__, "lent": len(LENT), "held": held}
    if cold:
        result["storage_read_bytes"] = storage_read_bytes() - before
    return result


def run_alone(args: Dict[str, Any], rank: int) -> Dict[str, Any]:
    """Every rank loads its file alone (the baseline), cold."""
    from safetensors.torch import load_file

    path = per_rank(args["path"], rank)
    drop_cache(path)
    dist.barrier()
    before = storage_read_bytes()
    found = digests(load_file(path))  # mmap views read when touched: the digests touch every byte
    return {"storage_read_bytes": storage_read_bytes() - before, "tensors": found}


def install_fault(args: Dict[str, Any], rank: int) -> None:
    """Replaces the loader's read seam on the faulty rank: it dies (SIGKILL) or raises at its Nth read."""
    fault = args.get("fault")
    if not fault or fault["rank"] != rank:
        return
    real = _moving.read_chunk
    calls = [0]

    def faulty(file, offset, dst):
        calls[0] += 1
        if calls[0] == fault["at"]:
            if fault["kind"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault["kind"] == "stall":  # a read that hangs (a stuck NFS server), then goes on
                time.sleep(fault["seconds"])
            else:
                raise OSError(5, "Input/output error (injected)")
        real(file, offset, dst)

    _moving.read_chunk = faulty


def join_group() -> Tuple[int, int]:
    """Joins the gloo process group the test spawned this rank into (RANK and WORLD_SIZE from the environment;
    the test's TCPStore at ST_DIST_STORE, else torch's env:// rendezvous; ST_DIST_TIMEOUT seconds, default 20)
    and returns (rank, world). Every test worker starts with it."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=float(os.environ.get("ST_DIST_TIMEOUT", "20")))
    store_at = os.environ.get("ST_DIST_STORE")
    if store_at:
        host, port = store_at.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world + 1, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world, timeout=timeout)
    return rank, world


def main() -> int:
    spec = json.load(open(sys.argv[1]))
    out_dir = sys.argv[2]
    rank, world = join_group()
    watch_collectives()
    results = {}
    out_path = os.path.join(out_dir, f"rank{rank}.json")
    for scenario in spec["scenarios"]:
        name = scenario["name"]
        crashed = False
        try:
            install_fault(scenario, rank)
            absent = scenario.get("absent")
            if absent and absent["rank"] == rank:  # a rank that never calls the load (it failed elsewhere)
                time.sleep(absent["seconds"])
                os._exit(0)
            runner = run_alone if scenario.get("alone") else run_load
            results[name] = runner(scenario, rank)
        except BaseException:
            results[name] = {"crash": traceback.format_exc()}
            crashed = True
        finally:
            _moving.read_chunk = _REAL_READ
        with open(out_path + ".tmp", "w") as f:  # written after every scenario: a later hang keeps these
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)
        if crashed or scenario.get("fault", {}).get("kind") in ("kill", "stall"):
            os._exit(0)  # the process group may be broken: nothing more to do, nothing to tear down
    dist.destroy_process_group()
    return 0


_REAL_READ = _moving.read_chunk

if __name__ == "__main__":
    sys.exit(main())
