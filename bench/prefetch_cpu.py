"""CPU prefetch through the engine: `safe_open(path).prefetch()` to the CPU (the C++ engine's readers writing
each tensor in place) against this package's `load_file(backend="pread")`, the reference's `load_file` with a
clone of every tensor, and one thread's pread of the whole file into fresh memory, all with the file in the
page cache.

    .venv/bin/python bench/prefetch_cpu.py --size 2G --reps 5 [--markdown OUT.md]
    .venv/bin/python bench/prefetch_cpu.py --size 64M --reps 1
    .venv/bin/python bench/run.py --cases none --sections prefetch-cpu  # runs it into BENCHMARKS.md

The checkpoint is Llama-shaped: bf16 tensors of seven shapes per layer (attention, MLP, norm), a few large and many
small, with random values. Every measurement is a new interpreter (what a user's program sees), torch and the
package imported before the clock starts; the rows take turns (round 1 of each, then round 2, ...); each row shows
min / median / max wall time. The prefetch row iterates the loader in the order the tensors land and takes every
tensor; its clock also records when the first tensor was handed out. The one-thread pread row reads the whole file
with `os.preadv` into an anonymous mapping that was not touched before (the kernel's copy and the page faults of
fresh memory, one thread): the engine reads with several threads, so this is what one reader can do, not a bound on
the others. "vs one-thread pread" divides its median by the row's. The engine's own micro-benchmark
(bench/engine_bench.cc) times its reads in C++ into memory faulted in beforehand: without Python and without the
cost of fresh memory.
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
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from suite import section  # noqa: E402
from suite.common import fmt_time, parse_size  # noqa: E402  (as the main report writes them)

TITLE = "CPU prefetch through the engine"

CHILD = r"""
import json, os, sys, time
mode, path = sys.argv[1], sys.argv[2]
import torch
import safetensors
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
out["version"] = safetensors.__version__
out["module"] = safetensors.__file__
print(json.dumps(out))
"""

MODES = ["ceiling", "prefetch", "pread", "reference"]


def size_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def label(mode: str, reference: str) -> str:
    return {"ceiling": "one-thread pread into fresh memory",
            "prefetch": "this package: `safe_open.prefetch()` to the CPU, every tensor iterated",
            "pread": 'this package: `load_file(backend="pread")`',
            "reference": f"reference {reference}: `load_file` + clone"}[mode]


def make_checkpoint(path: Path, nbytes: int) -> None:
    """Llama-shaped bf16 tensors (a few large, many small) filling about ``nbytes``."""
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


def run(mode: str, path: Path) -> Dict[str, Any]:
    env = dict(os.environ)
    if mode == "reference":
        env["PYTHONPATH"] = str(ROOT / ".ref")
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, env=env,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if mode == "reference" and str(ROOT / ".ref") not in out["module"]:
        raise RuntimeError(f"the reference row imported {out['module']}")
    return out


def report(samples: Dict[str, List[Dict[str, Any]]], size: int, meta: Dict[str, str], conditions: str) -> str:
    modes = [m for m in MODES if samples.get(m)]
    reference = samples["reference"][0]["version"] if samples.get("reference") else ""
    med = {m: statistics.median(s["seconds"] for s in samples[m]) for m in modes}
    lines = section.heading(TITLE, meta, conditions) + section.doc_paragraphs(__doc__, 0, 1) \
        + section.doc_paragraphs(__doc__, 2)
    lines += [f"| {size_text(size)} | min | median | max | GB/s (median) | vs one-thread pread |",
              "|---|---|---|---|---|---|"]
    for m in modes:
        t = [s["seconds"] for s in samples[m]]
        vs = f"{med['ceiling'] / med[m]:.0%}" if "ceiling" in med else ""
        lines.append(f"| {label(m, reference)} | {fmt_time(min(t))} | {fmt_time(med[m])} | {fmt_time(max(t))} | "
                     f"{size / med[m] / 1e9:.2f} | {vs} |")
    lines.append("")
    if "prefetch" in med:
        first = [s["first"] for s in samples["prefetch"]]
        last = [s["seconds"] for s in samples["prefetch"]]
        lines.append(f"- Prefetch hands out its first tensor after {fmt_time(statistics.median(first))} "
                     f"({fmt_time(min(first))} to {fmt_time(max(first))}) and its last after "
                     f"{fmt_time(med['prefetch'])} ({fmt_time(min(last))} to {fmt_time(max(last))}), "
                     f"{samples['prefetch'][0]['tensors']} tensors in all: the first arrives after "
                     f"{statistics.median(first) / med['prefetch']:.0%} of the load.")
        names = {"pread": 'this package\'s `load_file(backend="pread")`',
                 "reference": f"the reference's `load_file` + clone ({reference})"}
        for other in ("pread", "reference"):
            if other in med:
                ratio = med[other] / med["prefetch"]
                lines.append(f"- Against {names[other]}: prefetch is {ratio:.2f}x "
                             f"{'as fast' if ratio < 1 else 'faster'} ({fmt_time(med['prefetch'])} against "
                             f"{fmt_time(med[other])}, medians).")
    if "reference" not in med:
        lines.append("- No reference row: the reference is not installed in .ref (scripts/setup.sh installs it).")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="2G", help="checkpoint size (default 2G)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--markdown", type=Path, help="write the report section here (default: print it)")
    args = parser.parse_args()
    import torch  # (this package too, as the rows do: the venv's installed one, editable or not)

    (ROOT / "build").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT / "build") as tmp:
        path = Path(tmp) / "model.safetensors"
        make_checkpoint(path, parse_size(args.size))
        size = path.stat().st_size
        modes = [m for m in MODES if m != "reference" or (ROOT / ".ref").exists()]
        run("ceiling", path)  # warm the page cache
        meta = section.start()
        samples: Dict[str, List[Dict[str, Any]]] = {m: [] for m in modes}
        for rep in range(args.reps):
            for m in modes:
                samples[m].append(run(m, path))
                print(f"[prefetch-cpu] round {rep + 1}/{args.reps} {m}: {samples[m][-1]['seconds']:.3f} s",
                      file=sys.stderr)
    tensors: Optional[int] = samples["prefetch"][0]["tensors"] if samples.get("prefetch") else None
    conditions = (f"torch {torch.__version__}; {size_text(size)} in {tensors} bf16 tensors; page cache warm; "
                  f"{args.reps} round{'s' if args.reps != 1 else ''}")
    text = report(samples, size, meta, conditions)
    section.emit(text, args.markdown)


if __name__ == "__main__":
    main()
