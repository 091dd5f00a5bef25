"""Threads on a free-threaded interpreter: whether threads that load through this package run in parallel or
serialize, on CPython 3.14t (scripts/python-ft.sh) with the GIL off (PYTHON_GIL=0) and forced on (PYTHON_GIL=1),
beside the reference 0.9.0rc1's cp314t wheel.

    .venv/bin/python bench/threads.py --reps 5 [--markdown OUT.md]
    .venv/bin/python bench/run.py --cases none --sections threads  # runs it into BENCHMARKS.md

The workload is the per-tensor work a loader does in Python: `safe_open(path, "pt")` (the default backend, as
the reference's) and `get_tensor` of every tensor, over FILES files of TENSORS small tensors each (page cache
warm). Three ways, the same work in each: FILES threads each reading its own file; FILES threads sharing the
handles of every file (opened once, each thread takes every FILES-th name of each); and one thread reading every
file in turn.
Threads start together behind a barrier; wall time runs from its release to the last join, CPU time is the
process's user + system time over the same span (getrusage, every thread). Every measurement is a new process;
the rows take turns; min / median / max of the runs. "vs 1 thread" divides the serial row's median wall time
(same implementation and GIL setting) by the row's: above 1 the threads ran in parallel, at or below 1 they
took turns.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from suite.common import fmt_time  # noqa: E402  (times as the main report writes them)
from suite import section  # noqa: E402

REFERENCE_RC = "0.9.0rc1"
# The tensors' side: small, as the work measured is per tensor (a view of the mapping costs the same at any
# size); 20,000 of them per file give each of 8 threads about 20 ms of this package's work, against the few
# milliseconds threads take to start and meet at the barrier (at 2,000 that start was most of the wall time).
SIDE = 16

CHILD = r"""
import json, os, resource, sys, threading, time
mode, paths = sys.argv[1], sys.argv[2:]
import torch
import safetensors
from safetensors import safe_open
for p in paths:  # warm the page cache and every lazy import before the clock
    with safe_open(p, "pt") as f:
        f.get_tensor(next(iter(f.keys())))
count = len(paths)

def read_file(path):
    with safe_open(path, "pt") as f:
        for k in f.keys():
            f.get_tensor(k)

if mode == "files":
    jobs = [lambda p=p: read_file(p) for p in paths]
elif mode == "handle":
    shared = []  # (handle, names) of every file, opened once the clock runs
    def part(i):
        for handle, names in shared:
            for k in names[i::count]:
                handle.get_tensor(k)
    jobs = [lambda i=i: part(i) for i in range(count)]
else:
    jobs = [lambda: [read_file(p) for p in paths]]
barrier = threading.Barrier(len(jobs) + 1)
errors = []

def run(job):
    barrier.wait()
    try:
        job()
    except BaseException as e:
        errors.append(repr(e))

threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
for t in threads:
    t.start()
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
if mode == "handle":
    for p in paths:
        handle = safe_open(p, "pt")
        shared.append((handle, list(handle.keys())))
barrier.wait()
for t in threads:
    t.join()
t = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
print(json.dumps({"seconds": t, "cpu": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), "gil": gil,
                  "errors": errors, "module": safetensors.__file__}))
"""


class Row(NamedTuple):
    impl: str  # "ours" | "ref"
    gil: int  # the PYTHON_GIL value
    mode: str  # "files" | "handle" | "serial"


def label(row: Row, files: int) -> str:
    impl = "this package" if row.impl == "ours" else f"reference {REFERENCE_RC} (cp314t wheel)"
    what = {"files": f"{files} threads, a file each", "handle": f"{files} threads sharing each file's handle",
            "serial": "1 thread, every file in turn"}[row.mode]
    return f"{impl}, {what}, PYTHON_GIL={row.gil}"


def ft_venv() -> Path:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "python-ft.sh")], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"scripts/python-ft.sh failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def install_reference(py: Path, target: Path) -> Optional[str]:
    """The reference's release candidate for this interpreter in `target`; None, or why it is not there."""
    stamp = target / ".installed"
    if stamp.exists():
        return None
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--pre",
                        "--target", str(target), f"safetensors=={REFERENCE_RC}"], capture_output=True, text=True)
    if r.returncode != 0:
        return r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"pip exited {r.returncode}"
    stamp.touch()
    return None


def make_files(py: Path, folder: Path, files: int, tensors: int) -> List[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"part-{i}-of-{files}-{tensors}.safetensors" for i in range(files)]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        script = ("import sys, torch\nfrom safetensors.torch import save_file\n"
                  f"for i, p in enumerate(sys.argv[1:]):\n"
                  f"    save_file({{f'layers.{{j}}.weight': torch.full(({SIDE}, {SIDE}), i * {tensors} + j, "
                  f"dtype=torch.float32) for j in range({tensors})}}, p)\n")
        subprocess.run([str(py), "-c", script, *missing], check=True, env={**os.environ, "PYTHON_GIL": "0"})
    return paths


def measure(py: Path, row: Row, paths: List[Path], ref_dir: Path) -> Dict[str, Any]:
    env = {**os.environ, "PYTHON_GIL": str(row.gil)}
    env.pop("PYTHONPATH", None)
    if row.impl == "ref":
        env["PYTHONPATH"] = str(ref_dir)
    p = subprocess.run([str(py), "-c", CHILD, row.mode, *map(str, paths)], capture_output=True, text=True, env=env,
                       timeout=600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-2000:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if out["errors"]:
        raise RuntimeError(f"{label(row, len(paths))}: {out['errors'][0]}")
    expect = "site-packages" if row.impl == "ours" else str(ref_dir)
    if expect not in out["module"]:
        raise RuntimeError(f"{row.impl} imported {out['module']}")
    if out["gil"] != bool(row.gil):
        raise RuntimeError(f"PYTHON_GIL={row.gil} but the GIL is {'on' if out['gil'] else 'off'}")
    return out


def report(samples: Dict[Row, List[Dict[str, Any]]], errors: Dict[Row, str], meta: Dict[str, Any]) -> str:
    files = meta["files"]
    lines = section.heading("Threads on free-threaded Python (3.14t)", meta, meta["python"])
    lines += section.doc_paragraphs(__doc__, 0, 1) + section.doc_paragraphs(__doc__, 2)
    lines += [f"{files} files of {meta['tensors']} float32 tensors of {SIDE}x{SIDE} ({SIDE * SIDE * 4} bytes) each.", "",
              "| | min | median | max | CPU time (median) | vs 1 thread |", "|---|---|---|---|---|---|"]

    def med(row: Row, field: str = "seconds") -> Optional[float]:
        s = samples.get(row) or []
        return statistics.median(x[field] for x in s) if s else None

    for row in samples:
        if row in errors or not samples[row]:
            lines.append(f"| {label(row, files)} | error: {errors.get(row, 'not measured')} | | | | |")
            continue
        t = [x["seconds"] for x in samples[row]]
        serial = med(Row(row.impl, row.gil, "serial"))
        vs = f"{serial / med(row):.2f}x" if serial and row.mode != "serial" else ""
        lines.append(f"| {label(row, files)} | {fmt_time(min(t))} | {fmt_time(med(row))} | "
                     f"{fmt_time(max(t))} | {fmt_time(med(row, 'cpu'))} | {vs} |")
    lines.append("")
    for mode in ("files", "handle"):
        what = label(Row("ours", 0, mode), files).split(", ", 1)[1].rsplit(",", 1)[0]
        free, held, serial = med(Row("ours", 0, mode)), med(Row("ours", 1, mode)), med(Row("ours", 0, "serial"))
        ref = med(Row("ref", 0, mode))
        if free and held and serial:
            lines.append(f"- This package, {what}, GIL off: {serial / free:.2f}x the speed of one thread doing the "
                         f"same work, {held / free:.2f}x the speed of the same threads with the GIL on"
                         + (f", {ref / free:.1f}x the speed of the reference's threads." if ref else "."))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=8, help="files, and threads (default 8)")
    ap.add_argument("--tensors", type=int, default=20000, help="tensors per file (default 20000)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--markdown", type=Path, help="write the report section here (default: print it)")
    ap.add_argument("--tmpdir", type=Path, default=ROOT / "build" / "bench-results" / "threads")
    args = ap.parse_args()
    venv = ft_venv()
    py = venv / "bin" / "python"
    ref_dir = args.tmpdir / f"reference-{REFERENCE_RC}"
    why_not = install_reference(py, ref_dir)
    paths = make_files(py, args.tmpdir, args.files, args.tensors)
    python = subprocess.run([str(py), "-c", "import sys; print(sys.version.split()[0] + ' ' + sys.abiflags)"],
                            capture_output=True, text=True).stdout.strip()
    meta = {**section.start(), "files": args.files, "tensors": args.tensors, "python": f"CPython {python}"}
    rows = [Row(impl, gil, mode) for impl in ("ours", "ref") for mode in ("files", "handle", "serial")
            for gil in (0, 1)]
    samples: Dict[Row, List[Dict[str, Any]]] = {r: [] for r in rows}
    errors: Dict[Row, str] = {r: f"not installed: {why_not}" for r in rows if r.impl == "ref" and why_not}
    for rep in range(args.reps):
        for row in rows:
            if row in errors:
                continue
            try:
                samples[row].append(measure(py, row, paths, ref_dir))
            except Exception as e:  # reported in its row
                errors[row] = str(e).strip().splitlines()[-1][:300]
            print(f"[threads] round {rep + 1}/{args.reps} {label(row, args.files)}: "
                  f"{samples[row][-1]['seconds'] if samples[row] and row not in errors else errors.get(row)}",
                  file=sys.stderr)
    text = report(samples, errors, meta)
    section.emit(text, args.markdown)


if __name__ == "__main__":
    main()
