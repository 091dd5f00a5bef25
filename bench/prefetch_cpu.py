"""CPU prefetch benchmark: safe_open.prefetch to the CPU (the C++ engine's direct mode) against our
``load_file(backend="pread")``, the reference's ``load_file`` + clone, and the machine's warm pread ceiling
(one thread's preadv of the whole file into fresh memory), in fresh processes, warm page cache.

For prefetch it reports the time to the first tensor and to the last (iterating the loader in landing order).
Each measurement is its own interpreter (what a user's program sees); implementations take turns; medians.

    .venv/bin/python bench/prefetch_cpu.py --size 2G --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
mode, path = sys.argv[1], sys.argv[2]
import torch
import safetensors.torch
from safetensors import safe_open
from safetensors.torch import load_file
t0 = time.perf_counter()
if mode == "prefetch":
    first = None
    n = 0
    with safe_open(path, "pt", backend="pread") as f, f.prefetch() as loader:
        for name, t in loader:
            if first is None:
                first = time.perf_counter() - t0
            n += 1
    out = {"seconds": time.perf_counter() - t0, "first": first, "tensors": n}
elif mode == "pread":
    d = load_file(path, backend="pread")
    out = {"seconds": time.perf_counter() - t0, "tensors": len(d)}
elif mode == "reference":
    d = {k: v.clone() for k, v in load_file(path).items()}
    out = {"seconds": time.perf_counter() - t0, "tensors": len(d)}
elif mode == "ceiling":
    import mmap
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    buf = mmap.mmap(-1, size)
    t0 = time.perf_counter()
    done = 0
    while done < size:
        done += os.preadv(fd, [memoryview(buf)[done:]], done)
    out = {"seconds": time.perf_counter() - t0}
print(json.dumps(out))
"""


def parse_size(text: str) -> int:
    units = {"M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def make_checkpoint(path: Path, nbytes: int) -> None:
    """Llama-shaped bf16 tensors (a few large, many small) filling about ``nbytes``."""
    sys.path.insert(0, str(ROOT / "python"))
    import torch

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    state = {}
    layer = 0
    total = 0
    while total < nbytes:
        for name, shape in (("q", (2048, 2048)), ("k", (512, 2048)), ("v", (512, 2048)), ("o", (2048, 2048)),
                            ("up", (5632, 2048)), ("down", (2048, 5632)), ("norm", (2048,))):
            t = torch.randint(-2**15, 2**15, shape, dtype=torch.int16, generator=g).view(torch.bfloat16)
            state[f"layers.{layer}.{name}"] = t
            total += t.numel() * 2
        layer += 1
    save_file(state, path)


def run(mode: str, path: Path) -> dict:
    env = dict(os.environ)
    if mode == "reference":
        env["PYTHONPATH"] = str(ROOT / ".ref")
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, env=env,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="2G")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=ROOT / "build") as tmp:
        path = Path(tmp) / "model.safetensors"
        make_checkpoint(path, parse_size(args.size))
        size = path.stat().st_size
        modes = ["ceiling", "prefetch", "pread"] + (["reference"] if (ROOT / ".ref").exists() else [])
        run("ceiling", path)  # warm the page cache
        samples = {m: [] for m in modes}
        for _ in range(args.reps):
            for m in modes:
                samples[m].append(run(m, path))
    med = {m: statistics.median(s["seconds"] for s in samples[m]) for m in modes}
    first = statistics.median(s["first"] for s in samples["prefetch"])
    print(f"CPU prefetch, {size / 2**30:.2f} GiB, {samples['prefetch'][0]['tensors']} tensors, warm, "
          f"median of {args.reps} fresh processes, load average {os.getloadavg()[0]:.1f}")
    print("| implementation | seconds | GB/s | vs warm pread ceiling |")
    print("|---|---|---|---|")
    for m in modes:
        print(f"| {m} | {med[m]:.3f} | {size / med[m] / 1e9:.2f} | {med['ceiling'] / med[m]:.0%} |")
    print(f"prefetch: first tensor after {first * 1e3:.1f} ms, last after {med['prefetch'] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
