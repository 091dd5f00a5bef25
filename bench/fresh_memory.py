"""Warm owned loads into fresh memory: where the time of a load whose tensors own their bytes goes, against the
peers that also hand out owned tensors and this machine's own ways of filling fresh memory from the page cache.

    .venv/bin/python bench/fresh_memory.py --sizes 2G,6G --reps 5 [--markdown OUT.md]
    .venv/bin/python bench/run.py --cases none --sections fresh-memory  # runs it into BENCHMARKS.md

Every row is one load in a new process, with the file in the page cache (read just before), its clock
started 5 s (--idle) after the previous row's process ended, whatever its own process does first (an interpreter's
start-up and imports fall inside that pause: bench/suite/pagecache.py, start_after), so that every row meets
memory freed equally long before, and each after the same predecessor: just before that pause a C process writes
as many bytes of fresh memory as the file holds and exits (bench/suite/ceilings.py, settle); the rows take turns
(round 1 of each, then round 2, ...). Python rows are `bench/worker.py once load` (imports and a warm-up on a
tiny file before the clock starts); the C rows are `bench/ceilings.c`, one repetition per process. Each row
shows min / median / max wall time, and the median of the process's minor page faults and of its system and user
CPU time during the load (getrusage, every thread included): how its destination met fresh memory.

The C rows are the machine's ceilings for the same job, each a way to fill fresh anonymous memory with the
file's bytes on this machine's CPUs: pread from two threads into 4 KiB pages, with or without each 512 KiB
step faulted in first (MADV_POPULATE_WRITE), into MADV_HUGEPAGE memory (2 MiB pages: 512x fewer faults), and
one thread keeping 8 reads queued on an io_uring (buffered, as Run:ai's io_uring_buffered reader), into 4 KiB
and into huge pages; and pread into memory faulted in before the clock starts (the copy alone, no fresh
memory: the bound no load into new memory reaches). "vs ceiling" divides the fastest fresh-memory C row's
median by the row's.

Why the counts differ: Run:ai reads into buffers of its own of about 120 MiB, each advised MADV_HUGEPAGE (as
`strace -f -e trace=madvise` of its load shows), so a fault brings in 2 MiB; io_uring does not change the count
(the C io_uring rows take as many faults as pread into the same kind of memory: the kernel's copy still meets
the pages one at a time). Whether 2 MiB pages are cheaper depends on the host, not on the reader: on a VM that
hands free memory back to its host (virtio free page reporting, this one), a huge page made of memory that has
been free for a few seconds is faulted in again by the host, 4 KiB at a time, and costs several times what the
same bytes on 4 KiB pages cost; memory another process freed a moment ago is cheaper on huge pages. This
package keeps fresh destinations on 4 KiB pages and faults each 512 KiB step in just before reading it
(README, "Backends"), the fastest of these fills on this machine after idle.

When the memory was freed matters as much as how it is filled: the host takes freed memory back over tens of
seconds, and on this VM the same C fill of 6 GiB into 4 KiB pages took about 3x longer into memory freed 20 s
before than into memory freed 0.3 s before. A row whose clock started a second or two later than another's (a
Python interpreter's start-up against a C program's) met dearer memory, and read as a slower fill than it was:
hence one start for every row, counted from the end of the previous row's process. For the same reason the C
rows hold, written before their clocks start, as much memory as this package's load process had resident when
its clock started (its interpreter, torch and the warm-up): memory a process takes after the previous one ended
is memory freed a moment ago, the cheapest there is, which its fill then does not get. On this VM, a C fill of
6 GiB that held 600 MiB written first took about 1.7x as long as one that held nothing, both started 3 s after
the previous fill's process ended. And what the previous process was matters: rows taking turns each follow a
different row, and in a run without the common predecessor every Python row of 6 GiB (this package, the
reference, Run:ai, fastsafetensors) took 4.5-5.6 s and the C fill 3.7 s, while this package's load and the same
C fill, each after a C process that filled and freed 6 GiB, took 3.3-3.9 s and 3.2-4.8 s (6 pairs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from suite.ceilings import build_ceilings, settle_and_start  # noqa: E402
from suite.common import PEERS_DIR, fmt_time, parse_size, size_name  # noqa: E402  (as the main report writes them)
from suite import section  # noqa: E402
from suite.machine import load_average  # noqa: E402
from suite.pagecache import LATE_SECONDS  # noqa: E402

IDLE = 5.0


class Row(NamedTuple):
    key: str
    label: str
    kind: str  # "py": worker.py once load METHOD; "c": ceilings ARGS
    spec: str  # the load method, or the ceilings arguments after FILE
    env: str = ""  # "ref": the reference on PYTHONPATH; "peers": build/bench-peers on PYTHONPATH
    fresh: bool = True  # False: the C row that reads into memory faulted in before the clock (not a ceiling)


ROWS = [
    Row("ours_auto", 'this package: load_file(backend="auto")', "py", "st_auto"),
    Row("ours_pread", 'this package: load_file(backend="pread")', "py", "st_pread"),
    Row("ref", "reference 0.8.0: load_file + clone()", "py", "st_mmap_clone", "ref"),
    Row("runai_uring", "Run:ai model streamer 0.17.0, RUNAI_STREAMER_FS_STRATEGY=io_uring_buffered", "py",
        "runai_io_uring", "peers"),
    Row("runai", "Run:ai model streamer 0.17.0, default reader", "py", "runai", "peers"),
    Row("fst", "fastsafetensors 0.5.0, CPU, buffered (nogds)", "py", "fst", "peers"),
    Row("c_populate", "C: pread, 2 threads, 4 KiB pages, each 512 KiB step faulted in first", "c", "pread 2 1 3"),
    Row("c_pread", "C: pread, 2 threads, 4 KiB pages", "c", "pread 2 1 1"),
    Row("c_pread_huge", "C: pread, 2 threads, MADV_HUGEPAGE memory", "c", "pread 2 1 2"),
    Row("c_uring", "C: io_uring, 1 thread, 8 reads queued, 4 KiB pages", "c", "uring 8 1 1"),
    Row("c_uring_huge", "C: io_uring, 1 thread, 8 reads queued, MADV_HUGEPAGE memory", "c", "uring 8 1 2"),
    Row("c_copy", "C: pread, 2 threads, memory faulted in before the clock (the copy alone)", "c", "pread 2 1 0",
        fresh=False),
]


def run_row(row: Row, path: Path, ceilings: Path, start_at: float, hold: int) -> Dict[str, Any]:
    """One measurement of `row` in a new process, its clock started at `start_at` (a C row holding `hold`
    bytes from its start); seconds, minor_faults, sys_seconds, user_seconds, late_seconds, and rss_before (a
    Python row: its process's RSS when its clock started) or held_bytes (a C row)."""
    env = dict(os.environ)
    if row.kind == "c":
        cmd = [str(ceilings), row.spec.split()[0], str(path), *row.spec.split()[1:]]
        env["CEILINGS_START_AT"] = repr(start_at)
        env["CEILINGS_HOLD_BYTES"] = str(hold)
    else:
        paths = {"ref": [ROOT / ".ref"], "peers": [PEERS_DIR]}.get(row.env, [])
        # This package: the venv's installed one (editable or not), which the reference in .ref shadows.
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
        request = {"op": "load", "method": row.spec, "path": str(path), "warm": False, "start_at": start_at}
        cmd = [sys.executable, str(HERE / "worker.py"), "once", json.dumps(request)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{row.key}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    if row.kind == "c":
        return {"seconds": answer["seconds"][0], "minor_faults": answer["minor_faults"],
                "sys_seconds": answer["sys_seconds"], "user_seconds": answer["user_seconds"],
                "late_seconds": answer["late_seconds"], "held_bytes": answer["held_bytes"]}
    if not answer.get("ok"):
        raise RuntimeError(f"{row.key}: {answer.get('error')}")
    return answer["result"]


def measure(path: Path, rows: List[Row], reps: int, ceilings: Path, idle: float) -> Dict[str, Any]:
    samples: Dict[str, List[Dict[str, Any]]] = {r.key: [] for r in rows}
    errors: Dict[str, str] = {}
    for rep in range(reps):
        for row in rows:
            if row.key in errors:
                continue
            # The previous row's process has just ended: the file read into the page cache (from the disk
            # where the page cache no longer held all of it, as before a size's first round: not in the
            # pause), the same predecessor for every row (settle), then this row's clock starts idle s from
            # now, whatever its process does first (an interpreter's start-up and imports).
            start_at = settle_and_start(ceilings, path.stat().st_size, idle, (str(path), False))
            # A C row holds what this package's load process last had resident when its clock started.
            hold = next((x["rss_before"] for r in rows if r.key.startswith("ours") for x in samples[r.key][-1:]), 0)
            try:
                samples[row.key].append(run_row(row, path, ceilings, start_at, hold))
            except Exception as e:  # a peer that does not run is reported, not fatal
                errors[row.key] = str(e).splitlines()[0][:300]
            print(f"[fresh-memory] {path.name} round {rep + 1}/{reps} {row.key}: "
                  f"{samples[row.key][-1]['seconds'] if samples[row.key] and row.key not in errors else 'error'}",
                  file=sys.stderr)
    return {"samples": samples, "errors": errors}


def median_of(samples: Dict[str, List[Dict[str, Any]]], key: str, field: str) -> Optional[float]:
    """The median of `field` over the row's samples; None for a row without any."""
    s = samples.get(key) or []
    return statistics.median(x[field] for x in s) if s else None


def table(size: int, rows: List[Row], got: Dict[str, Any]) -> List[str]:
    samples, errors = got["samples"], got["errors"]

    def med(key: str, field: str = "seconds") -> Optional[float]:
        return median_of(samples, key, field)

    ceiling_key = min((r.key for r in rows if r.kind == "c" and r.fresh and med(r.key, "seconds")),
                      key=lambda k: med(k, "seconds") or float("inf"), default=None)
    ceiling = med(ceiling_key, "seconds") if ceiling_key else None
    out = [f"| {size_name(size)} | min | median | max | GB/s | minor faults | sys CPU | user CPU | "
           "vs ceiling |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.key not in samples:
            continue
        if r.key in errors or not samples[r.key]:
            out.append(f"| {r.label} | error: {errors.get(r.key, 'not measured')} | | | | | | | |")
            continue
        t = [x["seconds"] for x in samples[r.key]]
        m = statistics.median(t)
        vs = "ceiling" if r.key == ceiling_key else (f"{ceiling / m:.0%}" if ceiling and r.fresh else "")
        out.append(f"| {r.label} | {fmt_time(min(t))} | {fmt_time(m)} | {fmt_time(max(t))} | "
                   f"{size / m / 1e9:.2f} | {med(r.key, 'minor_faults'):,.0f} | {med(r.key, 'sys_seconds'):.2f} s | "
                   f"{med(r.key, 'user_seconds'):.2f} s | {vs} |")
    ours, runai = med("ours_auto", "seconds"), med("runai_uring", "seconds")
    out.append("")
    if ours and runai:
        verdict = "met" if runai / ours >= 1.1 else "not met"
        out.append(f"- Target: this package (auto) at least 1.1x Run:ai io_uring_buffered: {runai / ours:.2f}x, "
                   f"**{verdict}**.")
    if ours and ceiling:
        verdict = "met" if ceiling / ours >= 0.9 else "not met"
        out.append(f"- Target: at least 90% of the fastest way to fill fresh memory here ({ceiling_key}): "
                   f"{ceiling / ours:.0%}, **{verdict}**.")
    return out


def reading(size: int, got: Dict[str, Any]) -> List[str]:
    """What the rows of one size say, in the run's own numbers."""
    samples = got["samples"]

    def med(key: str, field: str = "seconds") -> Optional[float]:
        return median_of(samples, key, field)

    out = []
    if med("ours_auto") and med("runai_uring"):
        out.append(f"- Page faults: this package {med('ours_auto', 'minor_faults'):,.0f} (one per 4 KiB page), Run:ai "
                   f"io_uring_buffered {med('runai_uring', 'minor_faults'):,.0f} (one per 2 MiB page), with "
                   f"{med('ours_auto', 'sys_seconds'):.2f} s and {med('runai_uring', 'sys_seconds'):.2f} s of system "
                   f"time: {fmt_time(med('ours_auto'))} against {fmt_time(med('runai_uring'))}.")
    if med("c_pread") and med("c_pread_huge"):
        out.append(f"- Huge pages: the same pread into fresh MADV_HUGEPAGE memory takes "
                   f"{med('c_pread_huge', 'minor_faults'):,.0f} faults instead of {med('c_pread', 'minor_faults'):,.0f}"
                   f" and {fmt_time(med('c_pread_huge'))} instead of {fmt_time(med('c_pread'))} "
                   f"({med('c_pread') / med('c_pread_huge'):.2f}x).")
    if med("c_pread") and med("c_uring"):
        out.append(f"- io_uring: buffered reads queued on an io_uring into fresh 4 KiB pages take "
                   f"{med('c_uring', 'minor_faults'):,.0f} faults (pread: {med('c_pread', 'minor_faults'):,.0f}) and "
                   f"{fmt_time(med('c_uring'))} (pread from two threads: {fmt_time(med('c_pread'))}).")
    if med("c_pread") and med("c_populate"):
        out.append(f"- Faulting each 512 KiB step in before reading it: {fmt_time(med('c_populate'))} against "
                   f"{fmt_time(med('c_pread'))} for faults taken inside the copy.")
    held = [x["held_bytes"] for rows in samples.values() for x in rows if "held_bytes" in x]
    if held:
        out.append(f"- The C rows held {statistics.median(held) / 2**20:.0f} MiB (median) written before their clocks "
                   "started: this package's load process's RSS when its clock started.")
    late = max((x.get("late_seconds", 0.0) for rows in samples.values() for x in rows), default=0.0)
    if late <= LATE_SECONDS:
        out.append("- Every clock started on time, --idle after the previous row's process ended" +
                   (f" (the latest {fmt_time(late)} after)." if late else "."))
    else:
        out.append(f"- A clock started {fmt_time(late)} late: its process took longer than --idle to start, and "
                   "met memory freed longer before than the others'.")
    if med("c_copy") and med("c_populate"):
        out.append(f"- The copy alone (memory faulted in before the clock) takes {fmt_time(med('c_copy'))}: "
                   f"fresh memory is {1 - med('c_copy') / med('c_populate'):.0%} of the fastest fill's time.")
    return out


def report(results: Dict[int, Dict[str, Any]], rows: List[Row], meta: Dict[str, str]) -> str:
    lines = section.heading("Warm owned loads into fresh memory", meta,
                            f"{meta.get('kernel', '')}; transparent huge pages {meta['thp']}")
    lines += section.doc_paragraphs(__doc__, 0, 1) + section.doc_paragraphs(__doc__, 2)
    for size, got in results.items():
        lines += table(size, rows, got) + reading(size, got) + [""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2G,6G", help="checkpoint sizes (default 2G,6G)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--idle", type=float, default=IDLE, help=f"seconds of idle before each load (default {IDLE:g})")
    ap.add_argument("--rows", help="comma-separated row keys (default: all): " + ",".join(r.key for r in ROWS))
    ap.add_argument("--markdown", type=Path, help="write the report section here (default: print it)")
    ap.add_argument("--tmpdir", type=Path, default=ROOT / "build" / "bench-results" / "fresh-memory")
    ap.add_argument("--render", type=Path, metavar="JSON", help="measure nothing: write the section from the "
                    "samples a run saved (its --tmpdir/results.json)")
    args = ap.parse_args()
    rows = [r for r in ROWS if not args.rows or r.key in args.rows.split(",")]
    if args.render:
        saved = json.loads(args.render.read_text())
        section.emit(report({int(k): v for k, v in saved["results"].items()}, rows, saved["meta"]), args.markdown)
        return
    args.tmpdir.mkdir(parents=True, exist_ok=True)
    ceilings = build_ceilings(args.tmpdir)
    if ceilings is None:
        sys.exit("bench/ceilings.c did not build")
    thp = Path("/sys/kernel/mm/transparent_hugepage")
    meta = {**section.start(), "kernel": platform.release(),
            "thp": ", ".join(f"{f} {(thp / f).read_text().strip()}" for f in ("enabled", "defrag")
                             if (thp / f).exists()) or "absent"}
    results: Dict[int, Dict[str, Any]] = {}
    for size in sorted(parse_size(s) for s in args.sizes.split(",")):
        path = args.tmpdir / f"model-{size_name(size).replace(' ', '')}.safetensors"
        if not path.exists():
            made = subprocess.run([sys.executable, str(HERE / "worker.py"), "once", json.dumps(
                {"op": "make", "path": str(path), "bytes": size, "hidden": 2048})],
                capture_output=True, text=True)
            if made.returncode != 0 or not json.loads(made.stdout.strip().splitlines()[-1]).get("ok"):
                sys.exit(f"could not write {path}: {made.stderr[-2000:]}{made.stdout[-2000:]}")
        results[size] = measure(path, rows, args.reps, ceilings, args.idle)
    meta["load_end"] = load_average()
    (args.tmpdir / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    section.emit(report(results, rows, meta), args.markdown)


if __name__ == "__main__":
    main()
