"""Distributed loading on the CPU (gloo): wall time and bytes read from storage per rank, world 1/2/4, against
every rank loading the whole file alone.

    .venv/bin/python bench/distributed_load.py                 # 256 MiB, worlds 1,2,4, 3 repetitions
    .venv/bin/python bench/distributed_load.py --size-mib 64 --reps 1 --worlds 2

Each rank reads its own copy of the checkpoint (as ranks on separate hosts do: a page cache each), dropped from
the page cache before every measurement (fsync + posix_fadvise(DONTNEED)); bytes read are the kernel's count
(/proc/self/io read_bytes) and the loader's. Ranks are processes joined by a TCPStore on 127.0.0.1, so
"network" is loopback: on one machine this measures storage traffic and overheads, not a real interconnect.

Modes: ``distributed`` is ``safetensors.distributed.load_file`` (each rank reads ~1/world, the rest arrives by
broadcast); ``alone`` is ``safetensors.torch.load_file(backend="pread")`` on every rank (each reads it all).
Wall time is the slowest rank's, from a barrier to its tensors being complete; the median over repetitions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from suite.pagecache import evict  # bench/ is this script's directory, so first on sys.path

MiB = 1 << 20


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return -1


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    import safetensors.distributed as sdist
    from safetensors.torch import load_file

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", args.port, world + 1, is_master=False, timeout=timeout)
    # --device cuda: NCCL, one GPU per rank, tensors delivered there; cpu: gloo.
    device = "cpu" if args.device == "cpu" else f"{args.device}:{rank}"
    backend = "gloo" if args.device == "cpu" else "nccl"
    if args.device != "cpu":
        import torch

        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    path = os.path.join(args.dir, f"copy{rank}.safetensors")
    rows = []
    for rep in range(args.reps):
        for mode in ("distributed", "alone"):
            evict(path)  # from the page cache: each rep reads from the disk
            dist.barrier()
            before = _read_bytes()
            stats = sdist.LoadStats()
            start = time.perf_counter()
            if mode == "distributed":
                tensors = sdist.load_file(path, device=device, chunk_bytes=args.chunk_mib * MiB, stats=stats)
            else:
                tensors = load_file(path, device=device, backend="pread")
            if args.device != "cpu":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            rows.append({"rep": rep, "mode": mode, "rank": rank, "seconds": seconds,
                         "storage_read": _read_bytes() - before, "loader_read": stats.bytes_read,
                         "sent": stats.bytes_sent, "received": stats.bytes_received})
            del tensors
            dist.barrier()
    with open(os.path.join(args.dir, f"result{world}-{rank}.json"), "w") as f:
        json.dump(rows, f)
    dist.destroy_process_group()


def make_checkpoint(directory: str, size_mib: int, copies: int) -> None:
    import shutil

    import torch

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    layer = 8 * MiB
    tensors = {f"layers.{i}.weight": torch.randint(0, 256, (layer,), dtype=torch.uint8, generator=g)
               .view(torch.bfloat16).reshape(2048, -1) for i in range(max(1, size_mib * MiB // layer))}
    tensors["norm.weight"] = torch.ones(4096, dtype=torch.float32)
    first = os.path.join(directory, "copy0.safetensors")
    save_file(tensors, first)
    for r in range(1, copies):
        shutil.copyfile(first, os.path.join(directory, f"copy{r}.safetensors"))


def run_world(args: argparse.Namespace, world: int) -> list:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=120))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--dir", args.dir, "--port", str(store.port),
           "--reps", str(args.reps), "--chunk-mib", str(args.chunk_mib), "--device", args.device]
    env = dict(os.environ, WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r))) for r in range(world)]
    deadline = time.monotonic() + 60 + 30 * args.reps * max(1, args.size_mib // 64)
    try:
        for p in procs:
            p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise SystemExit(f"world {world}: a rank failed ({[p.returncode for p in procs]})")
    rows = []
    for r in range(world):
        with open(os.path.join(args.dir, f"result{world}-{r}.json")) as f:
            rows += json.load(f)
    return rows


def table(results: dict, size: int) -> str:
    lines = [
        "| world | mode | wall s (slowest rank, median) | GB/s per rank | storage MiB read per rank (mean / max) "
        "| loader MiB read per rank | MiB received per rank |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for world, rows in results.items():
        for mode in ("distributed", "alone"):
            mine = [r for r in rows if r["mode"] == mode]
            reps = sorted({r["rep"] for r in mine})
            wall = statistics.median(max(r["seconds"] for r in mine if r["rep"] == rep) for rep in reps)
            storage = [r["storage_read"] / MiB for r in mine]
            loader = statistics.mean(r["loader_read"] / MiB for r in mine) if mode == "distributed" else size / MiB
            received = statistics.mean(r["received"] / MiB for r in mine)
            lines.append(f"| {world} | {mode} | {wall:.3f} | {size / wall / 1e9:.2f} | "
                         f"{statistics.mean(storage):.1f} / {max(storage):.1f} | {loader:.1f} | {received:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--chunk-mib", type=int, default=4, help="safetensors.distributed.DEFAULT_CHUNK_BYTES")
    parser.add_argument("--tmpdir", default=None, help="where the copies go (a disk, not tmpfs)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cpu: gloo; cuda: NCCL with one GPU per rank (worlds up to the GPU count)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    worlds = [int(w) for w in args.worlds.split(",")]
    with tempfile.TemporaryDirectory(prefix="st-dist-bench-", dir=args.tmpdir) as directory:
        args.dir = directory
        make_checkpoint(directory, args.size_mib, max(worlds))
        size = os.path.getsize(os.path.join(directory, "copy0.safetensors"))
        results = {w: run_world(args, w) for w in worlds}
    print(f"checkpoint: {size / MiB:.1f} MiB, chunks of {args.chunk_mib} MiB, {args.reps} repetitions, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
          f"{'gloo over loopback' if args.device == 'cpu' else 'NCCL, tensors on the GPUs'}, a cold copy per rank")
    print(table(results, size))


if __name__ == "__main__":
    main()
