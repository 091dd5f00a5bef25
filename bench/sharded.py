"""Loading and saving a sharded (DTensor) model on the CPU: this package against what users run today.

    .venv/bin/python bench/sharded.py                                        # 2 GiB, worlds 2,4, 3 repetitions
    .venv/bin/python bench/sharded.py --size-mib 64 --reps 1 --worlds 2      # smoke test
    .venv/bin/python bench/sharded.py --modes load --layouts tp --warm --out r.json --markdown r.md

The driver (this file) generates the checkpoint and the digests, starts `world` fresh processes per measurement
(bench/sharded_rank.py, which also holds the layouts and the implementations), checks saved files and writes
the report. See HOW_MEASURED for what a number means.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import sharded_rank as sr
from suite import section  # bench/ is this script's directory, so first on sys.path

MiB = sr.MiB
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharded_rank.py")

HOW_MEASURED = """\
The checkpoint is Llama-shaped, bf16, {size:.0f} MiB: {layers} layers, hidden {hidden}, intermediate \
{intermediate}, vocab {vocab}, in {nfiles} files (huggingface_hub's split at {shard:.0f} MiB, \
safetensors.torch.save_file) with model.safetensors.index.json, on {fs}. Every measurement starts `world` new \
processes (OMP_NUM_THREADS=1, as torchrun sets) joined over gloo by a TCPStore on 127.0.0.1, so the \
"network" is loopback: on one machine this measures storage traffic, copies and overheads, not an \
interconnect. Each rank builds its destination as a model's parameters would be (DTensor.from_local of \
torch.empty local shards on init_device_mesh("cpu", ...)). Layouts: {layouts}. Time is the slowest rank's, \
from a barrier to its state dict being filled (load), or to every file and folder written being fsynced by \
rank 0 behind a barrier (save); min / median / max over {reps} repetitions, implementations taking turns \
within each repetition. Cold: rank 0 fsyncs every file and drops it from the page cache \
(posix_fadvise(DONTNEED)) before the barrier; warm: rank 0 reads every file once before it. All ranks share \
one copy of the files and one page cache, as the GPUs of one host do, so the group's storage reads add up to \
what it read once. Bytes per rank are the kernel's counts for the process \
(/proc/self/io: read_bytes/write_bytes reach storage; rchar/wchar count every read/write call, gloo's socket \
traffic included; mmap'd reads count in read_bytes only): the mean over ranks and repetitions, the largest rank's in brackets. Peak RSS \
above shards: VmHWM (reset through /proc/self/clear_refs just before the barrier) minus RSS then, minus the \
local shards' bytes for a load (torch.empty leaves them unfaulted); the largest rank's, median over \
repetitions. Each load is checked on every rank (sha256 of each local shard against the generated tensor \
cut by the same box) and each save by the driver (every tensor's sha256 in the written files against the \
generated one; "same bytes" says whether each file equals save_file's); a wrong result is reported as such, \
never timed. "vs fastest other": this median over the smallest median of the other implementations \
(not the ceiling). The ceiling is this machine's, in the same run: each of `world` processes preads (load) \
or pwrites and fsyncs (save) 1/world of the checkpoint's bytes, 8 MiB at a time into one buffer.
"""


def sizes_for(size_mib: int) -> Dict[str, int]:
    """Llama proportions: intermediate 8/3 hidden, vocab 8 hidden, k/v a quarter of q (GQA); sizes multiples
    of 64 so every layout splits evenly. Bytes ~ (32 + 21 * layers) * hidden^2."""
    layers = max(2, min(16, size_mib // 128))
    hidden = max(256, round((size_mib * MiB / (32 + 21 * layers)) ** 0.5 / 64) * 64)
    return {"layers": layers, "hidden": hidden, "intermediate": round(hidden * 8 / 3 / 64) * 64,
            "vocab": 8 * hidden}


def llama_shapes(s: Dict[str, int]) -> Dict[str, List[int]]:
    h, i, kv = s["hidden"], s["intermediate"], s["hidden"] // 4
    shapes = {"model.embed_tokens.weight": [s["vocab"], h]}
    for n in range(s["layers"]):
        p = f"model.layers.{n}."
        shapes.update({p + "self_attn.q_proj.weight": [h, h], p + "self_attn.k_proj.weight": [kv, h],
                       p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, h],
                       p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                       p + "mlp.down_proj.weight": [h, i], p + "input_layernorm.weight": [h],
                       p + "post_attention_layernorm.weight": [h]})
    shapes.update({"model.norm.weight": [h], "lm_head.weight": [s["vocab"], h]})
    return shapes


def make_checkpoint(directory: str, args: argparse.Namespace, worlds: List[int]) -> dict:
    """Writes the checkpoint and expected.json (each rank's shard digests per layout and world); returns what
    the report and the save checks need: sizes, files and every tensor's digest."""
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards

    from safetensors.torch import save_file

    s = sizes_for(args.size_mib)
    g = torch.Generator().manual_seed(0)
    tensors = {n: (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
               for n, shape in llama_shapes(s).items()}
    total = sum(t.numel() * 2 for t in tensors.values())
    split = split_torch_state_dict_into_shards(tensors, max_shard_size=total // 4)
    for file, names in split.filename_to_tensors.items():
        save_file({n: tensors[n] for n in names}, os.path.join(directory, file), metadata={"format": "pt"})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": split.metadata, "weight_map": split.tensor_to_filename}, f, indent=2)
    expected = {}
    for layout in args.layouts:
        for world in (w for w in worlds if sr.layout_fits(layout, w)):
            mesh = sr.mesh_shape(layout, world)
            for rank in range(world):
                coord = sr.coordinate(rank, mesh)
                expected[f"{layout}/{world}/{rank}"] = {
                    n: sr.digest(sr.cut(t, *sr.box(t.shape, mesh, coord, sr.placements(layout, n, t.dim()))))
                    for n, t in tensors.items()}
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f)
    files = {file: os.path.getsize(os.path.join(directory, file)) for file in split.filename_to_tensors}
    return {**s, "bytes": sum(files.values()), "files": files, "max_shard": total // 4,
            "digests": {n: sr.digest(t) for n, t in tensors.items()},
            "file_sha256": {f: sha256_file(os.path.join(directory, f)) for f in files}}


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(sr.BLOCK):
            h.update(chunk)
    return h.hexdigest()


def check_save(out: str, info: dict) -> tuple:
    """(None or what is wrong, whether every file has save_file's bytes), from the top-level .safetensors files."""
    seen, wrong = {}, []
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    for file in files:
        header, data = sr.read_header(os.path.join(out, file))
        with open(os.path.join(out, file), "rb") as f:
            raw = memoryview(f.read())
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            seen[name] = hashlib.sha256(raw[data + begin:data + end]).hexdigest()
            if entry["dtype"] != "BF16" or name not in info["digests"] or seen[name] != info["digests"][name]:
                wrong.append(name)
    missing = sorted(set(info["digests"]) - set(seen))
    error = f"wrong: {wrong[:3]}, missing: {missing[:3]}" if wrong or missing else None
    same = files == sorted(info["files"]) and all(
        sha256_file(os.path.join(out, f)) == info["file_sha256"][f] for f in files)
    return error, same


def probe(args: argparse.Namespace) -> Dict[tuple, str]:
    """{(mode, impl): "ok" or why it is not available}, asked of one interpreter per sys.path (ours, reference)."""
    answers = {}
    for reference in (False, True):
        keys = [(m, k) for m in args.modes for k, impl in sr.IMPLS[m].items() if impl.reference == reference]
        if not keys:
            continue
        out = subprocess.run([sys.executable, RANK_SCRIPT, "--probe", *(f"{m}/{k}" for m, k in keys)],
                             env=rank_env(args, *keys[0]), capture_output=True, text=True, timeout=300)
        try:
            got = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            got = {}
        tail = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        answers.update({(m, k): got.get(f"{m}/{k}", f"probe failed: {tail}") for m, k in keys})
    return answers


def rank_env(args: argparse.Namespace, mode: str, key: str) -> Dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if sr.IMPLS[mode][key].reference:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.ref, os.environ.get("PYTHONPATH")) if p)
    return env


def measure(args: argparse.Namespace, info: dict, group: tuple, key: str, rep: int) -> dict:
    """One measurement: `world` fresh ranks; returns the sample, with an error or the ranks' results."""
    import torch.distributed as dist

    mode, layout, world, cache = group
    sample = {"mode": mode, "layout": layout, "world": world, "cache": cache, "impl": key, "rep": rep}
    out = os.path.join(args.tmp, f"out-{key}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    timeout = 120 + args.size_mib // 8
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    spec = {"mode": mode, "impl": key, "layout": layout, "cold": cache == "cold", "ckpt": args.ckpt, "out": out,
            "port": store.port, "timeout": timeout, "max_shard": info["max_shard"],
            "expected": os.path.join(args.ckpt, "expected.json"), "result": os.path.join(args.tmp, "result")}
    with open(os.path.join(args.tmp, "spec.json"), "w") as f:
        json.dump(spec, f)
    env = rank_env(args, mode, key)
    procs = [subprocess.Popen([sys.executable, RANK_SCRIPT, os.path.join(args.tmp, "spec.json")],
                              env=dict(env, RANK=str(r), WORLD_SIZE=str(world)), stderr=subprocess.PIPE,
                              text=True) for r in range(world)]
    deadline, stderr = time.monotonic() + timeout + 60, []
    try:
        for p in procs:
            stderr.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[1])
    except subprocess.TimeoutExpired:
        sample["error"] = f"timed out after {timeout + 60} s"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    ranks = []
    for r in range(world):
        path = f"{spec['result']}.{r}.json"
        if os.path.exists(path):
            with open(path) as f:
                ranks.append(json.load(f))
            os.remove(path)
    errors = [x["error"] for x in ranks if "error" in x]
    if errors or len(ranks) < world or any(p.returncode for p in procs):
        tail = (stderr[-1].strip().splitlines() or [""])[-1] if stderr else ""
        sample.setdefault("error", errors[0] if errors else f"a rank failed: {tail}")
    else:
        sample.update(seconds=max(x["seconds"] for x in ranks), ranks=ranks)
        wrong = sorted({n for x in ranks for n in x["wrong"]})
        if wrong:
            sample["wrong"] = f"wrong shards: {wrong[:3]}"
        elif mode == "save" and key != sr.CEILING:
            error, sample["same_bytes"] = check_save(out, info)
            if error:
                sample["wrong"] = error
    shutil.rmtree(out, ignore_errors=True)
    return sample


def run(args: argparse.Namespace, info: dict, worlds: List[int]) -> tuple:
    probes = probe(args)
    groups = [(m, layout, w, c) for m in args.modes for layout in args.layouts for w in worlds
              if sr.layout_fits(layout, w) for c in (args.caches if m == "load" else ["-"])]
    samples = []
    for rep in range(args.reps):
        for group in groups:
            keys = [k for k in sr.IMPLS[group[0]] if probes[group[0], k] == "ok"]
            for i in range(len(keys)):  # rotated each repetition so no implementation always goes first
                sample = measure(args, info, group, keys[(i + rep) % len(keys)], rep)
                print(json.dumps({k: v for k, v in sample.items() if k != "ranks"}), flush=True)
                samples.append(sample)
    return probes, samples


def mib(x: float) -> str:
    return f"{x / MiB:.1f}"


def row_cells(samples: List[dict], mode: str) -> Optional[dict]:
    good = [s for s in samples if "seconds" in s]
    if not good:
        return None
    secs = sorted(s["seconds"] for s in good)
    storage, calls = ("read_bytes", "rchar") if mode == "load" else ("write_bytes", "wchar")
    per_rank = [x for s in good for x in s["ranks"]]
    return {"min": secs[0], "median": statistics.median(secs), "max": secs[-1],
            "bytes": f"{mib(statistics.mean(x[storage] for x in per_rank))} "
                     f"({mib(max(x[storage] for x in per_rank))}) / "
                     f"{mib(statistics.mean(x[calls] for x in per_rank))}",
            "rss": mib(statistics.median(max(x["peak_above_shards"] for x in s["ranks"]) for s in good)),
            "same": "yes" if all(s.get("same_bytes") for s in good) else "no"}


def table(mode: str, group_samples: List[dict], probes: dict) -> List[str]:
    moved = "read" if mode == "load" else "written"
    extra = " same bytes as save_file |" if mode == "save" else ""
    lines = [f"| implementation | min s | median s | max s | vs fastest other | {moved} per rank MiB: storage "
             f"(largest rank) / {'rchar' if mode == 'load' else 'wchar'} | peak RSS above shards MiB |{extra}",
             "|---|---:|---:|---:|---:|---:|---:|" + ("---|" if extra else "")]
    cells = {}
    for key in sr.IMPLS[mode]:
        mine = [s for s in group_samples if s["impl"] == key]
        bad = next((s.get("wrong") or s.get("error") for s in mine if "wrong" in s or "error" in s), None)
        if probes[mode, key] != "ok":
            cells[key] = f"not available: {probes[mode, key]}"
        elif bad:
            cells[key] = ("wrong result, not timed: " if any("wrong" in s for s in mine) else "failed: ") + bad
        else:
            cells[key] = row_cells(mine, mode) or "no sample"
    medians = {k: c["median"] for k, c in cells.items() if isinstance(c, dict) and k != sr.CEILING}
    for key, impl in sr.IMPLS[mode].items():
        c = cells[key]
        if not isinstance(c, dict):
            lines.append(f"| {impl.label} | {c.replace('|', '/')} |  |  |  |  |  |" + (" |" if extra else ""))
            continue
        others = [m for k, m in medians.items() if k != key]
        ratio = "ceiling" if key == sr.CEILING else f"{c['median'] / min(others):.2f}x" if others else "-"
        same = (f" {'-' if key == sr.CEILING else c['same']} |" if extra else "")
        lines.append(f"| {impl.label} | {c['min']:.3f} | {c['median']:.3f} | {c['max']:.3f} | {ratio} | "
                     f"{c['bytes']} | {c['rss']} |{same}")
    return lines


def markdown(args: argparse.Namespace, info: dict, probes: dict, samples: List[dict], fs: str) -> str:
    import torch

    how = HOW_MEASURED.format(size=info["bytes"] / MiB, nfiles=len(info["files"]), shard=info["max_shard"] / MiB,
                              fs=fs, reps=args.reps, layouts="; ".join(f"{k}: {v}" for k, v in sr.LAYOUTS.items()
                                                                       if k in args.layouts), **info)
    lines = section.heading("Sharded (DTensor) checkpoints: load and save", args.meta,
                            f"torch {torch.__version__}, Python {platform.python_version()}, reference safetensors "
                            f"from {os.path.relpath(args.ref, ROOT)}") + [how]
    for group in sorted({(s["mode"], s["layout"], s["world"], s["cache"]) for s in samples},
                        key=lambda g: (args.modes.index(g[0]), args.layouts.index(g[1]), g[2], g[3])):
        mode, layout, world, cache = group
        mine = [s for s in samples if (s["mode"], s["layout"], s["world"], s["cache"]) == group]
        title = f"### {mode}, {layout}, world {world}" + ("" if cache == "-" else f", {cache}")
        lines += ["", title, "", *table(mode, mine, probes)]
    return "\n".join(lines) + "\n"


def filesystem(path: str) -> str:
    out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", path], capture_output=True, text=True)
    return " ".join(out.stdout.split()) or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--layouts", default="fsdp,tp,tp2d", help="fsdp, tp, tp2d (2x2 mesh, world 4 only)")
    parser.add_argument("--modes", default="load,save")
    parser.add_argument("--cold", action="store_true", help="loads cold only (default: cold and warm)")
    parser.add_argument("--warm", action="store_true", help="loads warm only (default: cold and warm)")
    parser.add_argument("--out", help="JSON file: the configuration, probes and every sample")
    parser.add_argument("--markdown", help="file to write the markdown section into (also printed)")
    parser.add_argument("--tmp", default=os.path.join(ROOT, "build", "bench-results", "tmp"),
                        help="where the checkpoint and the saves go (a disk, not tmpfs): ~3x --size-mib")
    parser.add_argument("--ref", default=os.path.join(ROOT, ".ref"), help="the reference safetensors 0.8.0")
    args = parser.parse_args()
    args.modes, args.layouts = args.modes.split(","), args.layouts.split(",")
    args.caches = ["cold", "warm"] if args.cold == args.warm else ["cold"] if args.cold else ["warm"]
    worlds = [int(w) for w in args.worlds.split(",")]
    os.makedirs(args.tmp, exist_ok=True)
    args.meta = section.start()
    with tempfile.TemporaryDirectory(prefix="st-sharded-", dir=args.tmp) as tmp:
        args.tmp, args.ckpt = tmp, os.path.join(tmp, "ckpt")
        os.makedirs(args.ckpt)
        info = make_checkpoint(args.ckpt, args, worlds)
        probes, samples = run(args, info, worlds)
        text = markdown(args, info, probes, samples, filesystem(tmp))
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()},
                       "checkpoint": {k: v for k, v in info.items() if k != "digests"},
                       "probes": {f"{m}/{k}": v for (m, k), v in probes.items()}, "samples": samples}, f, indent=1)


if __name__ == "__main__":
    main()
