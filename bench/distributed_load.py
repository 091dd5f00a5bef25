"""Distributed loading: `safetensors.distributed.load_file` on a group of ranks, where each rank reads about
1/world of the checkpoint from storage and receives the rest by broadcast, against every rank loading the whole
file alone; wall time and bytes read from storage per rank, for several world sizes.

    .venv/bin/python bench/distributed_load.py --reps 5 [--markdown OUT.md]    # 256 MiB, worlds 1,2,4
    .venv/bin/python bench/distributed_load.py --size-mib 32 --reps 1 --worlds 1,2
    .venv/bin/python bench/run.py --cases none --sections distributed  # runs it into BENCHMARKS.md

Each rank is a process and reads its own copy of the checkpoint (as ranks on separate hosts do: a page cache
each), dropped from the page cache before every measurement (fsync + posix_fadvise(DONTNEED)). Ranks join by
a TCPStore on 127.0.0.1; on the CPU they exchange bytes through gloo, so the "network" is loopback. The
checkpoint is bf16 tensors of 8 MiB with random values and one small float32 tensor.

Modes: "distributed" is `safetensors.distributed.load_file` (each rank reads its share, the rest arrives by
broadcast, in chunks of the given size); "every rank alone" is `safetensors.torch.load_file(backend="pread")` on
every rank (each reads it all). The modes take turns in every repetition. Wall time is the slowest rank's, from
a barrier to its tensors being complete; min / median / max over the repetitions; GB/s is the file's size over
the median. Bytes read from storage are the kernel's count (/proc/self/io read_bytes), per rank; the loader's
own count of bytes read and received is beside it.

All ranks share this one machine's CPUs and disk, and the loopback "network" costs CPU time instead of a link:
what a single machine measures is the storage traffic and the overheads, not the wall time a group of hosts
gains; that gain needs storage to be the bottleneck (network file systems, several hosts).
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
from pathlib import Path
from typing import Dict, List

from suite import section  # bench/ is this script's directory, so first on sys.path
from suite.common import fmt_time
from suite.machine import sh
from suite.pagecache import evict

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


def wall_times(rows: List[dict], mode: str) -> List[float]:
    """Per repetition, the slowest rank's seconds."""
    mine = [r for r in rows if r["mode"] == mode]
    return [max(r["seconds"] for r in mine if r["rep"] == rep) for rep in sorted({r["rep"] for r in mine})]


def per_rank(rows: List[dict], mode: str, field: str) -> List[float]:
    return [r[field] / MiB for r in rows if r["mode"] == mode]


MODES = {"distributed": "distributed", "alone": "every rank alone"}


def table(results: Dict[int, List[dict]], size: int) -> List[str]:
    lines = ["| world | mode | min | median | max | GB/s (median) | storage MiB read per rank (mean / max) "
             "| loader MiB read per rank (mean) | MiB received per rank (mean) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for world, rows in results.items():
        for mode, name in MODES.items():
            wall = wall_times(rows, mode)
            storage = per_rank(rows, mode, "storage_read")
            loader = f"{statistics.mean(per_rank(rows, mode, 'loader_read')):.1f}" if mode == "distributed" else "-"
            received = statistics.mean(per_rank(rows, mode, "received"))
            med = statistics.median(wall)
            lines.append(f"| {world} | {name} | {fmt_time(min(wall))} | {fmt_time(med)} | {fmt_time(max(wall))} | "
                         f"{size / med / 1e9:.2f} | {statistics.mean(storage):.1f} / {max(storage):.1f} | {loader} | "
                         f"{received:.1f} |")
    return lines


def observations(results: Dict[int, List[dict]], size: int) -> List[str]:
    file_mib = size / MiB
    worlds = list(results)
    out = []
    dist = {w: statistics.mean(per_rank(results[w], "distributed", "storage_read")) for w in worlds}
    received = {w: statistics.mean(per_rank(results[w], "distributed", "received")) for w in worlds}
    out.append("- Storage reads per rank, distributed, against the file / world: "
               + "; ".join(f"world {w}: {dist[w]:.1f} MiB against {file_mib / w:.1f} MiB" for w in worlds)
               + "; the rest arrived by broadcast (" + ", ".join(f"{received[w]:.1f}" for w in worlds)
               + " MiB per rank).")
    for w in worlds:
        if w > 1:
            group = sum(per_rank(results[w], "distributed", "storage_read")) / len({r["rep"] for r in results[w]})
            alone = sum(per_rank(results[w], "alone", "storage_read")) / len({r["rep"] for r in results[w]})
            out.append(f"- World {w}: storage served {group:.1f} MiB to the group per distributed load "
                       f"({group / file_mib:.2f}x the file) against {alone:.1f} MiB when every rank loads alone "
                       f"({alone / file_mib:.2f}x).")
    walls = []
    for w in worlds:
        dist_s = statistics.median(wall_times(results[w], "distributed"))
        alone_s = statistics.median(wall_times(results[w], "alone"))
        walls.append(f"world {w}: {fmt_time(dist_s)} against {fmt_time(alone_s)}, {alone_s / dist_s:.2f}x the speed")
    out.append("- Wall time, distributed against every rank alone (medians): " + "; ".join(walls) + ".")
    alone_min = min(min(per_rank(results[w], "alone", "storage_read")) for w in worlds)
    if alone_min < 0.9 * file_mib:
        out.append(f"- The kernel counted as little as {alone_min:.1f} MiB of storage reads for a rank's whole-file "
                   "load: some copies were served from memory (the page cache not dropped, or a file system "
                   "without block-I/O accounting), so the storage columns undercount.")
    return out


def report(results: Dict[int, List[dict]], size: int, meta: Dict[str, str], conditions: str, device: str) -> str:
    title = "Distributed loading (gloo on CPU)" if device == "cpu" else "Distributed loading (NCCL on GPUs)"
    lines = section.heading(title, meta, conditions) + section.doc_paragraphs(__doc__, 0, 1) \
        + section.doc_paragraphs(__doc__, 2)
    return "\n".join(lines + table(results, size) + [""] + observations(results, size)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--chunk-mib", type=int, default=4, help="safetensors.distributed.DEFAULT_CHUNK_BYTES")
    parser.add_argument("--tmpdir", default=None, help="where the copies go (a disk, not tmpfs)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cpu: gloo; cuda: NCCL with one GPU per rank (worlds up to the GPU count)")
    parser.add_argument("--markdown", type=Path, help="write the report section here (default: print it)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    worlds = [int(w) for w in args.worlds.split(",")]
    with tempfile.TemporaryDirectory(prefix="st-dist-bench-", dir=args.tmpdir) as directory:
        args.dir = directory
        make_checkpoint(directory, args.size_mib, max(worlds))
        size = os.path.getsize(os.path.join(directory, "copy0.safetensors"))
        fs = sh("findmnt", "-n", "-o", "FSTYPE", "-T", directory) or "unknown file system"
        meta = section.start()
        results = {}
        for w in worlds:
            results[w] = run_world(args, w)
            print(f"[distributed-load] world {w}: done", file=sys.stderr)
    link = "gloo over loopback" if args.device == "cpu" else "NCCL, tensors on the GPUs"
    conditions = (f"torch {torch.__version__}; {size / MiB:.1f} MiB checkpoint, chunks of {args.chunk_mib} MiB; "
                  f"{link}; a copy per rank on {fs}, dropped from the page cache before each load; {args.reps} "
                  f"repetition{'s' if args.reps != 1 else ''}")
    text = report(results, size, meta, conditions, args.device)
    section.emit(text, args.markdown)


if __name__ == "__main__":
    main()
