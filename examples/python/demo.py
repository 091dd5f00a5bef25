"""The demo behind `bash scripts/demo.sh`: generate a GPT-2-sized checkpoint, save it, inspect it, load it back
on every available device, and compare speed with the reference safetensors and torch.save/torch.load."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import safetensors
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("SAFETENSORS_DEMO_OUT", ROOT / "build" / "demo"))
REFERENCE = Path(os.environ.get("SAFETENSORS_REFERENCE_PATH", ROOT / ".ref"))
# The interpreter that runs the reference (its wheel does not import on a free-threaded Python).
REFERENCE_PYTHON = os.environ.get("SAFETENSORS_REFERENCE_PYTHON", sys.executable)
# Timed runs per row (SAFETENSORS_DEMO_REPEAT; the test of the demo runs each once).
REPEAT = int(os.environ.get("SAFETENSORS_DEMO_REPEAT", "3"))


def gpt2_small() -> dict:
    """The tensors of GPT-2 small (124M parameters) with random float32 values."""
    g = torch.Generator().manual_seed(0)
    d, layers = 768, 12
    shapes = {"wte.weight": (50257, d), "wpe.weight": (1024, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(layers):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, 4 * d), p + "mlp.c_fc.bias": (4 * d,),
            p + "mlp.c_proj.weight": (4 * d, d), p + "mlp.c_proj.bias": (d,),
        })
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def best_of(fn, repeat: int = REPEAT, fresh: "Path | None" = None) -> float:
    """The best time of `repeat` calls; with `fresh`, that file is removed before each (untimed), so a save
    is not timed freeing the blocks of the file it replaces."""
    times = []
    for _ in range(repeat):
        if fresh is not None and fresh.exists():
            fresh.unlink()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def touch_all(tensors: dict) -> float:
    """Reads one value per 4 KiB page of every tensor, so lazily mapped tensors are really brought in."""
    return float(sum(t.reshape(-1)[::1024].double().sum() for t in tensors.values() if t.is_floating_point()))


def checksum(tensors: dict) -> float:
    """The sum of every value, over the tensors in name order (float sums depend on the order)."""
    return float(sum(tensors[name].double().sum() for name in sorted(tensors)))


def available_devices() -> list:
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    for kind in ("npu", "xpu", "mlu", "musa"):
        module = getattr(torch, kind, None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            devices += [f"{kind}:{i}" for i in range(module.device_count())]
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices


REFERENCE_BENCH = r"""
import os, sys, time, torch
from safetensors.torch import save_file, load_file
path, repeat = sys.argv[1], int(sys.argv[2])
state = torch.load(path + ".pt", weights_only=True)
def best(fn, fresh=None):
    out = []
    for _ in range(repeat):
        if fresh and os.path.exists(fresh):
            os.unlink(fresh)
        t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
    return min(out)
def load_touch():
    d = load_file(path)
    return sum(float(t.reshape(-1)[::1024].double().sum()) for t in d.values())
print(best(lambda: save_file(state, path + ".ref"), path + ".ref"), best(lambda: load_file(path)), best(load_touch),
      best(lambda: load_file(path, backend="pread")))
"""

# One load in a new interpreter, as a user's program does it (sys.argv: method, path); prints the seconds.
FRESH_LOAD = r"""
import os, sys, time, torch
method, path = sys.argv[1], sys.argv[2]
if method == "runai_io_uring":
    os.environ["RUNAI_STREAMER_FS_STRATEGY"] = "io_uring_buffered"
if method.startswith("runai"):
    from runai_model_streamer import SafetensorsStreamer
elif method == "fst":
    os.environ["FASTSAFETENSORS_ODIRECT"] = "0"
    from fastsafetensors import fastsafe_open
else:
    from safetensors.torch import load_file
t0 = time.perf_counter()
if method == "pread":
    d = load_file(path, backend="pread")
elif method == "mmap":
    d = load_file(path)
elif method == "clone":
    d = {k: v.clone() for k, v in load_file(path).items()}
elif method == "torch":
    d = torch.load(path + ".pt", weights_only=True)
elif method.startswith("runai"):
    with SafetensorsStreamer() as s:
        s.stream_file(path)
        d = dict(s.get_tensors())
elif method == "fst":
    with fastsafe_open(path, framework="pt", device="cpu", nogds=True) as f:
        d = {k: f.get_tensor(k) for k in f.keys()}
print(time.perf_counter() - t0)
"""
PEERS = ROOT / "build" / "bench-peers"  # scripts/bench.sh installs the peers there (requirements-bench.txt)


def fresh_process(method: str, path: Path, pythonpath: "str | None" = None,
                  python: str = sys.executable) -> "float | None":
    """The median of REPEAT loads, each in a new interpreter; None if that implementation did not run."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    times = []
    for _ in range(REPEAT):
        out = subprocess.run([python, "-c", FRESH_LOAD, method, str(path)], env=env,
                             capture_output=True, text=True)
        if out.returncode != 0:
            return None
        times.append(float(out.stdout.split()[-1]))
    return statistics.median(times)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "gpt2.safetensors"
    print(f"safetensors {safetensors.__version__} (C++ core), torch {torch.__version__}")

    print("\n1. Generating a GPT-2-sized checkpoint")
    state = gpt2_small()
    params = sum(t.numel() for t in state.values())
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    print(f"   {len(state)} tensors, {params / 1e6:.1f}M parameters, {nbytes / 2**20:.0f} MiB (float32)")

    print("\n2. Saving")
    t_save = best_of(lambda: save_file(state, path, metadata={"format": "pt", "model": "gpt2-small (random)"}),
                     fresh=path)
    print(f"   save_file  -> {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {t_save:.3f} s ({nbytes / t_save / 1e9:.2f} GB/s)")
    t_torch_save = best_of(lambda: torch.save(state, str(path) + ".pt"), fresh=Path(str(path) + ".pt"))

    print("\n3. Inspecting")
    with safe_open(path, "pt") as f:
        keys = f.keys()
        meta = f.metadata()
        by_dtype: dict = {}
        largest = []
        for name in keys:
            sl = f.get_slice(name)
            count = 1
            for d in sl.get_shape():
                count *= d
            by_dtype[sl.get_dtype()] = by_dtype.get(sl.get_dtype(), 0) + count
            largest.append((count, name, sl.get_shape()))
        print(f"   metadata: {meta}")
        print(f"   {len(keys)} tensors; parameters by dtype: " + ", ".join(f"{k} {v:,}" for k, v in by_dtype.items()))
        for count, name, shape in sorted(largest, reverse=True)[:3]:
            print(f"   {name:<28} {str(shape):<14} {count:>12,} parameters")
        row = f.get_slice("wte.weight")[1000:1002, ::256]
        print(f"   slice wte.weight[1000:1002, ::256] -> shape {tuple(row.shape)}, reads only those bytes")

    print("\n4. Loading back on every available device")
    reference_sum = checksum(state)
    for device in available_devices():
        t0 = time.perf_counter()
        loaded = load_file(path, device=device)
        elapsed = time.perf_counter() - t0
        ok = all(torch.equal(loaded[k].cpu(), state[k]) for k in state)
        where = {t.device for t in loaded.values()}
        print(f"   {device:<8} {elapsed:.3f} s  tensors on {sorted(map(str, where))}  identical to the saved ones: {ok}")
        assert ok

    print("\n5. Speed (best of %d, warm page cache; this machine has %d CPUs)" % (REPEAT, os.cpu_count() or 1))
    ours = {
        "save": t_save,
        "load, lazy (mmap)": best_of(lambda: load_file(path)),
        "load + touch every page (mmap)": best_of(lambda: touch_all(load_file(path))),
        "load, materialized (pread)": best_of(lambda: load_file(path, backend="pread")),
    }
    theirs = {}
    if (REFERENCE / "safetensors" / "__init__.py").exists():
        env = dict(os.environ, PYTHONPATH=str(REFERENCE))
        out = subprocess.run([REFERENCE_PYTHON, "-c", REFERENCE_BENCH, str(path), str(REPEAT)], env=env,
                             capture_output=True, text=True)
        if out.returncode == 0:
            theirs = dict(zip(ours, map(float, out.stdout.split())))
        else:
            print(f"   (the reference did not run on {REFERENCE_PYTHON}: {out.stderr.strip().splitlines()[-1:]})")
    pt = str(path) + ".pt"
    torch_times = {
        "save": t_torch_save,
        "load, lazy (mmap)": best_of(lambda: torch.load(pt, weights_only=True, mmap=True)),
        "load + touch every page (mmap)": best_of(lambda: touch_all(torch.load(pt, weights_only=True, mmap=True))),
        "load, materialized (pread)": best_of(lambda: torch.load(pt, weights_only=True)),
    }
    header = f"   {'operation':<34}{'this package':>14}{'reference 0.8.0':>17}{'torch.save/load':>17}"
    print(header)
    print("   " + "-" * (len(header) - 3))
    for op, t in ours.items():
        ref = f"{theirs[op]:.3f} s" if op in theirs else "n/a"
        tt = f"{torch_times[op]:.3f} s" if op in torch_times else "n/a"
        speedup = f"  ({theirs[op] / t:.1f}x ref)" if op in theirs else ""
        print(f"   {op:<34}{t:>12.3f} s{ref:>17}{tt:>17}{speedup}")
    print("\n   torch: torch.save, torch.load(weights_only=True, mmap=True) for the mmap rows, torch.load(weights_only=True)"
          " for the materialized row.")
    if not theirs and not (REFERENCE / "safetensors" / "__init__.py").exists():
        print("   (the reference is not installed in .ref; run scripts/setup.sh for the comparison)")

    print("\n6. What a user sees: each load in a new Python process that loads once (median of %d, warm cache)"
          % REPEAT)
    ours_path = os.environ.get("PYTHONPATH")
    rows = [("this package: load_file(backend=\"pread\")", "pread", ours_path),
            ("this package: load_file() (lazy, mmap)", "mmap", ours_path)]
    if (REFERENCE / "safetensors" / "__init__.py").exists():
        rows += [("reference 0.8.0: load_file() + .clone()", "clone", str(REFERENCE), REFERENCE_PYTHON),
                 ("reference 0.8.0: load_file() (lazy, mmap)", "mmap", str(REFERENCE), REFERENCE_PYTHON)]
    rows.append(("torch.load(weights_only=True)", "torch", ours_path))
    peers = os.pathsep.join(p for p in (ours_path, str(PEERS)) if p)
    if (PEERS / "runai_model_streamer").is_dir():
        rows += [("Run:ai model streamer 0.17.0", "runai", peers),
                 ("Run:ai model streamer, io_uring_buffered", "runai_io_uring", peers)]
    if (PEERS / "fastsafetensors").is_dir():
        rows.append(("fastsafetensors 0.5.0 (nogds, buffered)", "fst", peers))
    print(f"   {'implementation':<48}{'median':>10}{'GB/s':>8}")
    print("   " + "-" * 66)
    for label, method, pythonpath, *python in rows:
        t = fresh_process(method, path, pythonpath, *python)
        shown = f"{t:>8.3f} s{nbytes / t / 1e9:>8.2f}" if t is not None else f"{'did not run':>18}"
        print(f"   {label:<48}{shown}")
    if not PEERS.is_dir():
        print("   (peers: `bash scripts/bench.sh` installs Run:ai model streamer and fastsafetensors in build/bench-peers)")
    assert checksum(load_file(path)) == reference_sum


if __name__ == "__main__":
    main()
