"""One invocation of bench/run.py after its options are read: measure() starts the measuring processes
(this package, the reference, and for case 8 the fresh-process servers and the peers), checks that each
imported what it should, runs the selected cases in their order, saves every sample and writes the report;
render() writes the report again from the samples of an earlier run."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from suite.case_fresh import fresh
from suite.case_model import model_file
from suite.case_small import small_files
from suite.ceilings import Ceilings, FreshCeiling, build_ceilings
from suite.common import HERE, PEERS_DIR, ROOT, GiB, Results, Server, size_name
from suite.machine import check_eviction, load_average, machine_info, snapshot_package
from suite.report import report
from suite.runner import Runner, Serve


def render(args: argparse.Namespace, out_md: Path) -> int:
    """The report and the plot from the samples in args.render: beside --out if given, else where that run
    wrote them."""
    data = json.loads(args.render.read_text())
    results = Results()
    results.rows, results.notes = data["rows"], data.get("notes", [])
    meta = dict(data["meta"], json=str(args.render.resolve()))
    quick = data["config"]["quick"]
    default_dir = ROOT / "build" / "bench-results" / "quick"
    md = out_md if args.out else Path(meta.get("out", default_dir / "BENCHMARKS.md" if quick else ROOT / "BENCHMARKS.md"))
    png = (md.parent / "results.png" if args.out else
           Path(meta.get("plot", default_dir / "results.png" if quick else HERE / "results.png")))
    report(md, png, data["config"], data["machine"], results, meta)
    return 0


def run_cases(run: Runner) -> None:
    """The selected cases, in the order that lets them share files: the small-tensor files (1, 7), one
    model file per size (2-6; the cold and slicing sizes when they are not among the sizes), then case 8."""
    cfg = run.cfg
    if run.want("1") or run.want("7"):
        small_files(run)
    if any(run.want(c) for c in "234567"):
        for size in cfg["sizes"]:
            model_file(run, size)
        # A case with a size of its own (cold loads, slicing) gets one more model file, measured for it alone.
        for case, key in (("4", "cold_size"), ("6", "slice_size")):
            if run.want(case) and cfg[key] not in cfg["sizes"]:
                saved = cfg["cases"]
                cfg["cases"] = [case]
                model_file(run, cfg[key])
                cfg["cases"] = saved
    if run.want("8"):
        if cfg["fresh_count"]:
            fresh(run, None)
        for size in cfg["fresh_sizes"]:
            fresh(run, size)


def measure(args: argparse.Namespace, cfg: Dict[str, Any], outdir: Path, out_md: Path, plot: Path,
            out_json: Path) -> int:
    """Measures the selected cases, writes every sample to out_json and the report to out_md and plot."""
    fs_dir = (args.tmpdir or ROOT / "build" / "bench-results" / "tmp").resolve()
    tmpdir = fs_dir / f"run-{os.getpid()}"  # this run's own files, removed at the end
    tmpdir.mkdir(parents=True, exist_ok=True)

    if not (args.reference / "safetensors" / "__init__.py").exists():
        print(f"the reference is not installed in {args.reference} (scripts/setup.sh installs it)", file=sys.stderr)
        return 1

    load_start = load_average()
    started = time.monotonic()
    info = machine_info(fs_dir)
    can_evict, eviction = check_eviction(tmpdir)
    print(f"bench: cases {','.join(args.cases)}, sizes {', '.join(map(size_name, cfg['sizes']))}, "
          f"{cfg['reps']} runs each, files in {tmpdir} ({shutil.disk_usage(tmpdir).free / GiB:.0f} GiB free)")
    print(f"bench: load average {load_start}; {eviction}")

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    ours_path = args.ours_path.resolve() if args.ours_path else snapshot_package(env, outdir / "package")
    ours_env = dict(env, PYTHONPATH=str(ours_path))
    results_notes: List[str] = []
    servers: Dict[str, Serve] = {
        "ours": Server("ours", ours_env, args.spawn),
        "ref": Server("reference", dict(env, PYTHONPATH=str(args.reference.resolve())), args.spawn)}
    if "3" in cfg["cases"] and Path("/sys/kernel/mm/transparent_hugepage/enabled").exists():
        # What torch's own huge-page allocation would give the materialized load (informational row).
        servers["ours_thp"] = Server("ours (THP)", dict(ours_env, THP_MEM_ALLOC_ENABLE="1"), args.spawn)
    if "8" in cfg["cases"]:
        # Case 8: a new interpreter per load, whatever --spawn says; the peers next to this package.
        servers["fresh_ours"] = Server("ours (fresh)", ours_env, True)
        servers["fresh_ref"] = Server("reference (fresh)", dict(env, PYTHONPATH=str(args.reference.resolve())), True)
        missing = [m for m in ("runai_model_streamer", "fastsafetensors") if not (PEERS_DIR / m).is_dir()]
        if missing:
            what = "case 8 ran without them" if len(missing) == 2 else "their rows are errors"
            results_notes.append(f"peers not installed in {os.path.relpath(PEERS_DIR, ROOT)} ({', '.join(missing)}): "
                                 f"scripts/bench.sh installs them from requirements-bench.txt; {what}")
        if len(missing) < 2:
            servers["fresh_peers"] = Server("peers (fresh)", dict(ours_env, PYTHONPATH=f"{ours_path}:{PEERS_DIR}"), True)
    ours_id, ref_id = servers["ours"]({"op": "identify"}), servers["ref"]({"op": "identify"})
    if ref_id["safetensors"] != "0.8.0" or not ref_id["file"].startswith(str(args.reference.resolve())):
        print(f"the reference worker imported {ref_id}, not the reference 0.8.0 from {args.reference}", file=sys.stderr)
        return 1
    if ours_id["file"].startswith(str(args.reference.resolve())):
        print(f"this package's worker imported the reference ({ours_id['file']})", file=sys.stderr)
        return 1
    source = (ours_path / "SOURCE").read_text().strip() if (ours_path / "SOURCE").exists() else ours_id["file"]
    versions = {"this package": f"safetensors {ours_id['safetensors']} ({source}, copied for the run)"
                                if (ours_path / "SOURCE").exists() else f"safetensors {ours_id['safetensors']} ({source})",
                "reference": f"safetensors {ref_id['safetensors']} ({os.path.relpath(ref_id['file'], ROOT)})",
                "Python / torch / numpy": f"{ours_id['python']} / {ours_id['torch']} ({ours_id['torch_threads']} "
                                          f"intra-op threads) / {ours_id['numpy']}"}

    results = Results()
    results.notes.extend(results_notes)
    ceilings = Ceilings(build_ceilings(outdir), results, cfg["reps"])
    if "8" in cfg["cases"]:
        servers["fresh_ceiling"] = FreshCeiling(ceilings)
    try:
        run_cases(Runner(cfg, tmpdir, servers, ceilings, results, can_evict))
    finally:
        for s in servers.values():
            s.close()
        shutil.rmtree(tmpdir, ignore_errors=True)

    duration = time.monotonic() - started
    load_end = load_average()
    busy = max(float(load_start.split()[0]), float(load_end.split()[0])) > 0.25 * (os.cpu_count() or 1)
    meta = {"argv": " ".join(sys.argv[1:]), "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "duration": duration, "load_start": load_start, "load_end": load_end, "busy": busy,
            "eviction": eviction, "versions": versions, "json": str(out_json), "out": str(out_md),
            "plot": str(plot)}
    out_json.write_text(json.dumps({"config": cfg, "machine": info, "meta": meta, "notes": results.notes,
                                    "rows": results.rows}, indent=1, default=str))
    report(out_md, plot, cfg, info, results, meta)
    return 0
