"""The sections of BENCHMARKS.md that scripts of their own measure (remote loads, prefetch, the simulated NPU,
distributed and sharded loads, fresh memory, threads, strided slices): bench/run.py runs each script with the
arguments below and puts the section it writes (`--markdown FILE`) between `<!-- begin NAME -->` and
`<!-- end NAME -->` after the numbered cases, in the order of SECTIONS. A section a run does not measure keeps
the text of the last run that did; one whose script fails says so, with the end of its log.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence, Tuple

HERE = Path(__file__).resolve().parents[1]  # bench/

# The line after the numbered cases; the sections follow it.
MARKER = "<!-- kept by bench/run.py: the sections below come from their own scripts, each named with its command -->"
_BLOCK = re.compile(r"<!-- begin ([\w-]+) -->\n(.*?)\n<!-- end \1 -->", re.S)


class Section(NamedTuple):
    name: str  # its marker name
    script: str  # bench/SCRIPT, run with this venv's python
    full: Tuple[str, ...]  # the arguments of a full run (bench/run.py without --quick)
    quick: Tuple[str, ...]  # the arguments of --quick: a smoke test of a minute or two


SECTIONS: Tuple[Section, ...] = (
    Section("remote", "remote_load.py", ("--size", "2G", "--rounds", "5"),
            ("--size", "64M", "--tensors", "32", "--rounds", "1")),
    Section("prefetch-cpu", "prefetch_cpu.py", ("--size", "2G", "--reps", "5"), ("--size", "64M", "--reps", "1")),
    Section("npu-overlap", "npu_sim_overlap.py",
            ("--size", "512M", "--tensors", "320", "--reps", "5", "--delay-us", "200,2000,20000"),
            ("--size", "256M", "--tensors", "160", "--reps", "1", "--delay-us", "200,20000")),
    Section("distributed", "distributed_load.py", ("--reps", "5"),
            ("--size-mib", "32", "--reps", "1", "--worlds", "1,2")),
    Section("sharded", "sharded.py", ("--reps", "3"),
            ("--size-mib", "32", "--reps", "1", "--worlds", "2", "--layouts", "tp", "--warm")),
    Section("strided", "strided_crossover.py", ("--mib", "256", "--reps", "5"),
            ("--mib", "16", "--reps", "1", "--runs", "512,65536")),
    Section("fresh-memory", "fresh_memory.py", ("--sizes", "2G,6G", "--reps", "5"),
            ("--sizes", "64M", "--reps", "1", "--idle", "0")),
    Section("threads", "threads.py", ("--reps", "5"), ("--files", "2", "--tensors", "200", "--reps", "1")),
)
NAMES = tuple(s.name for s in SECTIONS)


def blocks(text: str) -> Dict[str, str]:
    """The generated sections in a report's text, by name."""
    return {m.group(1): m.group(2) for m in _BLOCK.finditer(text)}


def compose(head: str, kept: Dict[str, str]) -> str:
    """The whole report: `head` (the numbered cases, its trailing blank lines dropped), MARKER, then the sections
    `kept` in the order of SECTIONS (any other named block after them). bench/run.py's report and a section's
    `update` both write through it, so the file is laid out the same whichever wrote it last."""
    names = [n for n in NAMES if n in kept] + [n for n in kept if n not in NAMES]
    lines = [head.rstrip("\n"), "", MARKER]
    for n in names:
        lines += ["", f"<!-- begin {n} -->", kept[n].strip("\n"), f"<!-- end {n} -->"]
    return "\n".join(lines + [""])


def update(report: Path, name: str, body: str) -> None:
    """Puts section `name` into `report` (replacing the one it has), keeping the order of SECTIONS."""
    text = report.read_text() if report.exists() else ""
    kept = blocks(text)
    kept[name] = body
    report.write_text(compose(text.split(MARKER)[0] if MARKER in text else _BLOCK.sub("", text), kept))


def select(spec: str) -> List[Section]:
    """The sections a --sections value names: "all", "none" or a comma-separated list of NAMES."""
    if spec == "all":
        return list(SECTIONS)
    if spec in ("", "none"):
        return []
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [w for w in wanted if w not in NAMES]
    if bad:
        raise ValueError(f"unknown section(s) {', '.join(bad)}; sections are {', '.join(NAMES)}")
    return [s for s in SECTIONS if s.name in wanted]


class Outcome(NamedTuple):
    name: str
    ok: bool  # the script wrote its section (else the report holds the failure)
    line: str  # "NAME: written in N s", or why not


def run(chosen: Sequence[Section], quick: bool, report: Path, outdir: Path) -> List[Outcome]:
    """Runs each chosen section's script and puts what it wrote into `report`; a script that fails puts a
    section saying so."""
    outdir.mkdir(parents=True, exist_ok=True)
    done: List[Outcome] = []
    for s in chosen:
        md, log = outdir / f"{s.name}.md", outdir / f"{s.name}.log"
        md.unlink(missing_ok=True)
        args = s.quick if quick else s.full
        cmd = [sys.executable, str(HERE / s.script), *args, "--markdown", str(md)]
        shown = " ".join([f"bench/{s.script}", *args])
        print(f"bench: section {s.name}: {shown} (log: {log})", flush=True)
        t0 = time.monotonic()
        with open(log, "w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=HERE.parent).returncode
        took = time.monotonic() - t0
        ok = rc == 0 and md.exists() and bool(md.read_text().strip())
        if ok:
            body = md.read_text()
            outcome = "written"
        else:
            end = "\n".join(log.read_text(errors="replace").strip().split("\n")[-15:])
            body = (f"## Section `{s.name}`: not measured\n\n`{shown}` failed (exit status {rc}) in the run that "
                    f"wrote this report. The end of its output:\n\n```\n{end}\n```")
            outcome = f"FAILED (exit status {rc})"
        update(report, s.name, body)
        done.append(Outcome(s.name, ok, f"{s.name}: {outcome} in {took:.0f} s"))
        print(f"bench: section {done[-1].line}", flush=True)
    return done
