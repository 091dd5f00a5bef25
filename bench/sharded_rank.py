"""One rank of one measurement of bench/sharded.py, and what the driver shares with its ranks: the layouts, the
implementations and the digests.

    python bench/sharded_rank.py SPEC.json          # one rank (RANK, WORLD_SIZE in the environment)
    python bench/sharded_rank.py --probe MODE/IMPL...  # JSON: "ok" or why each implementation is not available

A rank joins the gloo group (the driver's TCPStore), builds its destination state dict as a model's parameters
would be (``DTensor.from_local`` of ``torch.empty`` local shards, shapes from
``compute_local_shape_and_global_offset``), prepares the page cache (rank 0: dropped for cold, read once for
warm) or, for a save, fills its shards from the checkpoint with plain preads, then times the implementation from
a barrier. A load ends when the rank's state dict is filled; a save ends after a barrier behind every rank's
save and rank 0's fsync of every file and folder written. After a load each rank checks the sha256 of every local
shard against the driver's digests of the generated tensors cut by the same box. It writes one JSON result.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import struct
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker import evict  # noqa: E402  (bench/worker.py: the page-cache helpers every benchmark uses)

MiB = 1 << 20
BLOCK = 8 * MiB
COLWISE = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head"}
ROWWISE = {"o_proj", "down_proj"}
LAYOUTS = {
    "fsdp": "every parameter Shard(0), as FSDP2's fully_shard",
    "tp": "q/k/v/gate/up/embed/lm_head Shard(0) (colwise), o/down Shard(1) (rowwise), norms Replicate()",
    "tp2d": "2x2 mesh (dp_shard, tp): Shard(0) on dp, then tp's placement (FSDP2 over TP, without _StridedShard)",
}


def mesh_shape(layout: str, world: int) -> Tuple[int, ...]:
    return (2, world // 2) if layout == "tp2d" else (world,)


def layout_fits(layout: str, world: int) -> bool:
    return layout != "tp2d" or world == 4


def placements(layout: str, name: str, ndim: int) -> tuple:
    from torch.distributed.tensor import Replicate, Shard

    if layout == "fsdp":
        return (Shard(0),)
    module = name.split(".")[-2]
    tp = Replicate() if ndim == 1 else Shard(1) if module in ROWWISE else Shard(0)
    return (tp,) if layout == "tp" else (Shard(0), tp)


def coordinate(rank: int, shape: Tuple[int, ...]) -> List[int]:
    coord = []
    for n in reversed(shape):
        coord.append(rank % n)
        rank //= n
    return coord[::-1]


def box(shape, mesh: Tuple[int, ...], coord, places) -> Tuple[List[int], List[int]]:
    """(offsets, lengths) of the block a mesh coordinate holds. Even splits only: the checkpoint's sizes are
    multiples of 64, and the rank checks this against torch's compute_local_shape_and_global_offset."""
    offsets, lengths = [0] * len(shape), list(shape)
    for n, c, p in zip(mesh, coord, places):
        if p.is_shard():
            if lengths[p.dim] % n:
                raise ValueError(f"{shape} does not split evenly over {mesh}")
            lengths[p.dim] //= n
            offsets[p.dim] += c * lengths[p.dim]
    return offsets, lengths


def cut(tensor, offsets, lengths):
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        tensor = tensor.narrow(dim, offset, length)
    return tensor


def digest(tensor) -> str:
    import torch

    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy()).hexdigest()


def read_header(path: str) -> Tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def checkpoint_files(directory: str) -> Dict[str, List[str]]:
    """{file name: tensor names} from model.safetensors.index.json, files in index order."""
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    files: Dict[str, List[str]] = {}
    for name, file in sorted(weight_map.items(), key=lambda item: item[1]):
        files.setdefault(file, []).append(name)
    return files


def proc_io() -> Dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def pread_range(path: str, begin: int, end: int, into: memoryview) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        while begin < end:
            n = os.preadv(fd, [into[: min(len(into), end - begin)]], begin)
            if n <= 0:
                raise OSError(f"short read of {path} at {begin}")
            begin += n
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    for folder, _, names in os.walk(root):
        for name in names + ["."]:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


@dataclass
class Context:
    rank: int
    world: int
    ckpt: str
    out: str
    files: Dict[str, List[str]]
    sd: dict
    max_shard: int


def my_range(ctx: Context) -> List[Tuple[str, int, int]]:
    """The (path, begin, end) pieces of this rank's 1/world of the checkpoint's bytes, 4 KiB aligned."""
    sizes = [(os.path.join(ctx.ckpt, f), os.path.getsize(os.path.join(ctx.ckpt, f))) for f in ctx.files]
    total = sum(s for _, s in sizes)
    lo, hi = (total * ctx.rank // ctx.world) & ~4095, (total * (ctx.rank + 1) // ctx.world) & ~4095
    hi = total if ctx.rank == ctx.world - 1 else hi
    pieces, start = [], 0
    for path, size in sizes:
        if start < hi and lo < start + size:
            pieces.append((path, max(lo, start) - start, min(hi, start + size) - start))
        start += size
    return pieces


def load_dcp_torch(ctx: Context) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.load(ctx.sd, storage_reader=dcp.HuggingFaceStorageReader(ctx.ckpt))


def load_dcp_ours(ctx: Context) -> None:
    import torch.distributed.checkpoint as dcp

    from safetensors import dcp as ours

    dcp.load(ctx.sd, storage_reader=ours.HuggingFaceStorageReader(ctx.ckpt))


def load_ours(ctx: Context) -> None:
    from safetensors.distributed import load_state_dict

    missing, unexpected = load_state_dict(ctx.sd, ctx.ckpt)
    if missing or unexpected:
        raise RuntimeError(f"missing {missing}, unexpected {unexpected}")


def load_broadcast(ctx: Context) -> None:
    """accelerate's FSDP2 way: rank 0 holds the full state dict, broadcasts each tensor, every rank keeps its part."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import distribute_tensor

    from safetensors.torch import load_file

    full = {}
    if ctx.rank == 0:
        for file in ctx.files:
            full.update(load_file(os.path.join(ctx.ckpt, file)))
    for name in sorted(ctx.sd):
        param = ctx.sd[name]
        tensor = full.pop(name) if ctx.rank == 0 else torch.empty(param.shape, dtype=param.dtype)
        dist.broadcast(tensor, src=0)
        part = distribute_tensor(tensor, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(part.to_local())


def load_ceiling(ctx: Context) -> None:
    buffer = memoryview(bytearray(BLOCK))
    for path, begin, end in my_range(ctx):
        pread_range(path, begin, end, buffer)


def save_ours(ctx: Context) -> None:
    from safetensors.distributed import save_state_dict

    save_state_dict(ctx.sd, ctx.out, max_shard_size=ctx.max_shard)


def _fqn_to_index(ctx: Context) -> Dict[str, int]:
    return {name: i for i, names in enumerate(ctx.files.values(), start=1) for name in names}


def save_dcp_torch(ctx: Context) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(ctx.sd, storage_writer=dcp.HuggingFaceStorageWriter(
        ctx.out, fqn_to_index_mapping=_fqn_to_index(ctx), save_distributed=True, enable_consolidation=True))


def save_dcp_ours(ctx: Context) -> None:
    import torch.distributed.checkpoint as dcp

    from safetensors import dcp as ours

    dcp.save(ctx.sd, storage_writer=ours.HuggingFaceStorageWriter(
        ctx.out, fqn_to_index_mapping=_fqn_to_index(ctx), save_distributed=True, enable_consolidation=True))


def save_gather(ctx: Context) -> None:
    """Every rank all-gathers each tensor (DTensor.full_tensor), rank 0 keeps them and writes the files."""
    from safetensors.torch import save_file

    full = {}
    for name in sorted(ctx.sd):
        tensor = ctx.sd[name].full_tensor()
        if ctx.rank == 0:
            full[name] = tensor
    if ctx.rank == 0:
        for file, names in ctx.files.items():
            save_file({n: full.pop(n) for n in names}, os.path.join(ctx.out, file), metadata={"format": "pt"})
        write_index(ctx.out, ctx.files, ctx.ckpt)


def write_index(out: str, files: Dict[str, List[str]], like: str) -> None:
    with open(os.path.join(like, "model.safetensors.index.json")) as f:
        index = json.load(f)
    index["weight_map"] = {n: file for file, names in files.items() for n in names}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


def save_ceiling(ctx: Context) -> None:
    buffer = memoryview(bytes(range(256)) * (BLOCK // 256))
    left = sum(end - begin for _, begin, end in my_range(ctx))
    fd = os.open(os.path.join(ctx.out, f"ceiling-{ctx.rank}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        offset = 0
        while offset < left:
            offset += os.pwrite(fd, buffer[: min(BLOCK, left - offset)], offset)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Impl:
    label: str
    run: Callable[[Context], None]
    reference: bool = False  # runs with the reference safetensors 0.8.0 first on sys.path
    needs: str = ""  # "module:attribute" that must exist for the implementation to be available


CEILING = "ceiling"
IMPLS: Dict[str, Dict[str, Impl]] = {
    "load": {
        "dcp-torch-ref": Impl("dcp.load + torch HuggingFaceStorageReader, safetensors 0.8.0", load_dcp_torch, True),
        "dcp-torch": Impl("dcp.load + torch HuggingFaceStorageReader, this package", load_dcp_torch),
        "broadcast-ref": Impl("rank 0 load_file + broadcast (accelerate), safetensors 0.8.0", load_broadcast, True),
        "ours": Impl("ours: safetensors.distributed.load_state_dict", load_ours,
                     needs="safetensors.distributed:load_state_dict"),
        "dcp-ours": Impl("ours: dcp.load + safetensors.dcp.HuggingFaceStorageReader", load_dcp_ours,
                         needs="safetensors.dcp:HuggingFaceStorageReader"),
        CEILING: Impl("machine ceiling: plain preads, 1/world of the bytes per process", load_ceiling),
    },
    "save": {
        "ours": Impl("ours: safetensors.distributed.save_state_dict", save_ours,
                     needs="safetensors.distributed:save_state_dict"),
        "dcp-ours": Impl("ours: dcp.save + safetensors.dcp.HuggingFaceStorageWriter", save_dcp_ours,
                         needs="safetensors.dcp:HuggingFaceStorageWriter"),
        "dcp-torch": Impl("dcp.save + torch HuggingFaceStorageWriter, this package", save_dcp_torch),
        "dcp-torch-ref": Impl("dcp.save + torch HuggingFaceStorageWriter, safetensors 0.8.0", save_dcp_torch, True),
        "gather": Impl("full_tensor() to rank 0 + save_file, this package", save_gather),
        CEILING: Impl("machine ceiling: pwrite + fsync, 1/world of the bytes per process", save_ceiling),
    },
}


def probe(mode: str, key: str) -> str:
    """'ok', or why the implementation cannot run in this interpreter."""
    import importlib

    try:
        import torch.distributed.checkpoint  # noqa: F401

        import safetensors.torch  # noqa: F401

        if IMPLS[mode][key].needs:
            module, attribute = IMPLS[mode][key].needs.split(":")
            getattr(importlib.import_module(module), attribute)
        return "ok"
    except Exception as e:  # noqa: BLE001 - any failure to import is the row's text
        return f"{type(e).__name__}: {e}"


def fill_from_checkpoint(sd: dict, ckpt: str, files: Dict[str, List[str]], boxes: dict) -> None:
    """Each local shard from the checkpoint with plain preads of its rows (setup of a save, not timed)."""
    import torch

    for file, names in files.items():
        path = os.path.join(ckpt, file)
        header, data = read_header(path)
        for name in names:
            shape, (begin, _) = header[name]["shape"], header[name]["data_offsets"]
            offsets, lengths = boxes[name]
            row = 2 * (shape[1] if len(shape) > 1 else 1)
            raw = bytearray(row * lengths[0])
            pread_range(path, data + begin + row * offsets[0], data + begin + row * (offsets[0] + lengths[0]),
                        memoryview(raw))
            rows = torch.frombuffer(raw, dtype=torch.bfloat16).reshape([lengths[0]] + shape[1:])
            sd[name].to_local().copy_(cut(rows, [0] + offsets[1:], lengths))


def rank_main(spec: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    import safetensors

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=spec["timeout"])
    store = dist.TCPStore("127.0.0.1", spec["port"], world + 1, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    shape = mesh_shape(spec["layout"], world)
    mesh = init_device_mesh("cpu", shape)
    files = checkpoint_files(spec["ckpt"])
    ctx = Context(rank, world, spec["ckpt"], spec["out"], files, {}, spec["max_shard"])
    boxes, local_bytes = {}, 0
    for file, names in files.items():
        header, _ = read_header(os.path.join(spec["ckpt"], file))
        for name in names:
            full = header[name]["shape"]
            places = placements(spec["layout"], name, len(full))
            local_shape, offset = compute_local_shape_and_global_offset(full, mesh, places)
            boxes[name] = box(full, shape, mesh.get_coordinate(), places)
            if boxes[name] != (list(offset), list(local_shape)):
                raise AssertionError(f"{name}: box {boxes[name]} but torch says {offset}, {local_shape}")
            local = torch.empty(local_shape, dtype=torch.bfloat16)
            local_bytes += local.numel() * 2
            ctx.sd[name] = DTensor.from_local(local, mesh, places, run_check=False, shape=torch.Size(full),
                                              stride=torch.empty(full, device="meta").stride())
    if spec["mode"] == "save" or spec["impl"] == CEILING:
        local_bytes = 0  # resident already (save) or never touched (ceiling): the peak is above RSS before
    if spec["mode"] == "save":
        fill_from_checkpoint(ctx.sd, spec["ckpt"], files, boxes)
    elif rank == 0:
        for file in files:
            path = os.path.join(spec["ckpt"], file)
            if spec["cold"]:
                evict(path)
            else:
                pread_range(path, 0, os.path.getsize(path), memoryview(bytearray(BLOCK)))
    impl = IMPLS[spec["mode"]][spec["impl"]]
    rss_before = vm("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        peak_reset = True
    except OSError:  # VmHWM stays the peak since the start (getrusage's ru_maxrss): an upper bound
        peak_reset = False
    io_before = proc_io()
    dist.barrier()
    start = time.perf_counter()
    impl.run(ctx)
    if spec["mode"] == "save":
        dist.barrier()
        if rank == 0:
            fsync_tree(spec["out"])
        dist.barrier()
    seconds = time.perf_counter() - start
    io_after, peak = proc_io(), vm("VmHWM")
    wrong = []
    if spec["mode"] == "load" and spec["impl"] != CEILING:
        with open(spec["expected"]) as f:
            expected = json.load(f)[f"{spec['layout']}/{world}/{rank}"]
        wrong = sorted(n for n, t in ctx.sd.items() if digest(t.to_local()) != expected[n])
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "seconds": seconds, "peak_above_shards": peak - rss_before - local_bytes,
            "local_bytes": local_bytes, "peak_reset": peak_reset, "wrong": wrong, "safetensors": safetensors.__file__,
            **{k: io_after[k] - io_before[k] for k in ("read_bytes", "rchar", "write_bytes", "wchar")}}


def main() -> None:
    if sys.argv[1] == "--probe":  # --probe MODE/IMPL...: one JSON object of probe() answers
        print(json.dumps({arg: probe(*arg.split("/")) for arg in sys.argv[2:]}))
        return
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    try:
        result = rank_main(spec)
    except BaseException as e:
        result = {"rank": int(os.environ["RANK"]), "error": f"{type(e).__name__}: {e}"}
        raise
    finally:
        with open(f"{spec['result']}.{os.environ['RANK']}.json", "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
