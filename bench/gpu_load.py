"""GPU load benchmark (run by scripts/gpu-check.sh on a machine with an NVIDIA GPU).

Loads a ~16 GiB bf16 checkpoint and a 20k-tensor checkpoint to cuda:0 with this package and with the
reference `safetensors` (the one installed on that machine, run in a subprocess without this package on the
path), next to the machine's pinned host-to-device ceiling measured in the same run. Warm page cache; best of
--repeat. Prints a table and writes gpu_load.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

PREFETCH_TIMER = r"""
import sys, time, json, torch
from safetensors import safe_open
path, repeat = sys.argv[1], int(sys.argv[2])
best = 1e9
for _ in range(repeat):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    with safe_open(path, "pt", device="cuda:0") as f, f.prefetch(device="cuda:0") as loader:
        d = dict(loader)
    torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t0)
    checksum = float(sum(d[k].float().sum() for k in sorted(d)[:8]))
    del d
import safetensors
print(json.dumps({"seconds": best, "checksum": checksum, "version": safetensors.__version__, "file": safetensors.__file__}))
"""

LOAD_TIMER = r"""
import sys, time, json, torch
from safetensors.torch import load_file
path, repeat = sys.argv[1], int(sys.argv[2])
best = 1e9
for _ in range(repeat):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    d = load_file(path, device="cuda:0"); torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t0)
    checksum = float(sum(d[k].float().sum() for k in sorted(d)[:8]))
    del d
import safetensors
print(json.dumps({"seconds": best, "checksum": checksum, "version": safetensors.__version__, "file": safetensors.__file__}))
"""


def pinned_ceiling(nbytes: int = 1 << 30, repeat: int = 5) -> float:
    """Host-to-device bandwidth from pinned memory, bytes per second (best of `repeat`)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
        torch.cuda.synchronize()
        best = max(best, nbytes / (start.elapsed_time(end) / 1e3))
    del host, dev
    return best


def make_checkpoint(path: Path, tensors: int, shape: tuple) -> int:
    from safetensors.torch import save_file

    state = {}
    for i in range(tensors):
        t = torch.empty(shape, dtype=torch.bfloat16)
        t.view(torch.int16).fill_(i % 30000)  # cheap, distinct per tensor
        state[f"model.layers.{i}.weight"] = t
    save_file(state, path)
    return sum(t.numel() * 2 for t in state.values())


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 26):
            pass


def time_load(python: str, path: Path, repeat: int, env: dict, timer: str = LOAD_TIMER) -> dict:
    out = subprocess.run([python, "-c", timer, str(path), str(repeat)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--big-gib", type=float, default=16.0)
    parser.add_argument("--many", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", default="/tmp/gpu_bench")
    parser.add_argument("--out", default="build/gpu")
    parser.add_argument("--reference-rc", default=".gpu/ref-rc",
                        help="a --target directory holding the reference 0.9.0rc1 (its CUDA prefetch), if present")
    args = parser.parse_args()
    work, out = Path(args.dir), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    ceiling = pinned_ceiling()
    print(f"GPU: {torch.cuda.get_device_name(0)}; pinned host-to-device ceiling {ceiling / 1e9:.1f} GB/s", flush=True)

    ours_env = dict(os.environ)
    ref_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the machine's own safetensors
    cases = {
        "16GiB bf16": (work / "big.safetensors", int(args.big_gib * 8), (8192, 8192)),  # 128 MiB tensors
        f"{args.many} tensors": (work / "many.safetensors", args.many, (128, 128)),
    }
    results = {"ceiling_GBps": ceiling / 1e9, "cases": {}}
    for label, (path, count, shape) in cases.items():
        t0 = time.perf_counter()
        nbytes = make_checkpoint(path, count, shape)
        warm(path)
        made = time.perf_counter() - t0
        ours = time_load(sys.executable, path, args.repeat, ours_env)
        ref = time_load(sys.executable, path, args.repeat, ref_env)
        assert "+cpp" in ours["version"] and "+cpp" not in ref["version"], (ours, ref)
        assert ours["checksum"] == ref["checksum"], (ours, ref)
        prefetch = time_load(sys.executable, path, args.repeat, ours_env, PREFETCH_TIMER)
        assert prefetch["checksum"] == ours["checksum"], (prefetch, ours)
        ref_prefetch = None
        if Path(args.reference_rc, "safetensors").exists():
            rc_env = dict(ref_env, PYTHONPATH=str(Path(args.reference_rc).resolve()))
            ref_prefetch = time_load(sys.executable, path, args.repeat, rc_env, PREFETCH_TIMER)
        row = {
            "bytes": nbytes, "tensors": count, "prepare_s": made,
            "ours_s": ours["seconds"], "ours_GBps": nbytes / ours["seconds"] / 1e9,
            "reference_s": ref["seconds"], "reference_GBps": nbytes / ref["seconds"] / 1e9,
            "fraction_of_ceiling": nbytes / ours["seconds"] / ceiling,
            "speedup_vs_reference": ref["seconds"] / ours["seconds"],
            "ours_prefetch_s": prefetch["seconds"], "ours_prefetch_GBps": nbytes / prefetch["seconds"] / 1e9,
            "reference_prefetch_s": ref_prefetch["seconds"] if ref_prefetch else None,
        }
        results["cases"][label] = row
        print(f"{label:>16}: {nbytes / 2**30:6.2f} GiB  ours {row['ours_s']:7.3f} s ({row['ours_GBps']:5.1f} GB/s, "
              f"{100 * row['fraction_of_ceiling']:5.1f}% of ceiling)  reference {row['reference_s']:7.3f} s "
              f"({row['reference_GBps']:5.1f} GB/s)  speedup {row['speedup_vs_reference']:5.1f}x", flush=True)
        rp = row["reference_prefetch_s"]
        print(f"{'':>16}  prefetch: ours {row['ours_prefetch_s']:7.3f} s ({row['ours_prefetch_GBps']:5.1f} GB/s, "
              f"{100 * nbytes / row['ours_prefetch_s'] / ceiling:5.1f}% of ceiling)  reference 0.9.0rc1 "
              + (f"{rp:7.3f} s" if rp else "not installed"), flush=True)
        path.unlink()
    big = results["cases"]["16GiB bf16"]
    print(f"targets: >= 80% of the pinned ceiling: {100 * big['fraction_of_ceiling']:.1f}% "
          f"({'met' if big['fraction_of_ceiling'] >= 0.8 else 'NOT met'}); >= 5x the reference: "
          f"{big['speedup_vs_reference']:.1f}x ({'met' if big['speedup_vs_reference'] >= 5 else 'NOT met'})")
    (out / "gpu_load.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
