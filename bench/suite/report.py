"""The report: BENCHMARKS.md from one run's rows and targets (write_markdown), and report(), which evaluates
the targets, draws the plot and writes the Markdown, from a run or from its saved samples.

The prose of the report is in bench/suite/text/*.md, one file per block, word for word, with `{name}` where
a figure goes in (str.format; a literal brace is written `{{`). A file's final newline is not part of its
text. The sections that scripts of their own write (suite/sections.py) are kept from the file being replaced.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from suite import sections
from suite.common import ROOT, MiB, Results, count_name, fmt_time, gbps, median
from suite.expect import expect
from suite.plot import write_plot
from suite.targets import observations, targets

TEXT = Path(__file__).resolve().parent / "text"

Row = Dict[str, Any]
Column = Tuple[str, Callable[[Row], str]]


def text(name: str, **fields: Any) -> List[str]:
    """The lines of the template bench/suite/text/{name}.md with `fields` filled in."""
    return (TEXT / f"{name}.md").read_text().rstrip("\n").format(**fields).split("\n")


def mark(t: Dict[str, Any]) -> str:
    """A target's verdict as the tables show it: met, not met, not measured, restated, or nothing (information)."""
    if t.get("info"):
        return ""
    if t.get("restated"):
        return "restated"
    if t["met"] is None:
        return "not measured"
    return "**met**" if t["met"] else "**not met**"


def col_gbps(r: Row) -> str:
    v = gbps(r)
    return f"{v:.2f}" if v is not None else ""


def col_mib(field: str) -> Callable[[Row], str]:
    return lambda r: f"{r[field] / MiB:+.1f}" if r.get(field) is not None else ""


def col_cached(r: Row) -> str:
    return f"{r['resident_before']:.1%}" if r.get("resident_before") is not None else ""


def col_faults(r: Row) -> str:
    return f"{r['minor_faults'] / 1000:.0f}k" if r.get("minor_faults") is not None else ""


def table(res: Results, by_key: Dict[str, List[Dict[str, Any]]], case: str, title: str, extra_cols: List[Column],
          intro: Optional[List[str]] = None) -> List[str]:
    """One case's table (nothing when the case has no rows): every row with its targets in the last column."""
    rows = [r for r in res.rows.values() if r["case"] == case]
    if not rows:
        return []
    L = [f"## {title}", ""]
    if intro:
        L += [*intro, ""]
    head = ["", "implementation", "median", "min", "max"] + [c for c, _ in extra_cols] + ["target"]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    for r in rows:
        if r.get("error"):
            L.append(f"| {r['group']} | {r['label']} | error: {r['error'].splitlines()[0][:160]} |"
                     + " |" * (len(head) - 3))
            continue
        cells = [r["group"], r["label"], fmt_time(median(r)), fmt_time(min(r["seconds"])),
                 fmt_time(max(r["seconds"]))]
        cells += [f(r) for _, f in extra_cols]
        ts = by_key.get(r["key"], [])
        cells.append("<br>".join(f"{t.get('wanted', '')} ({t['what'].split(' vs ')[-1]}): {t['text']} "
                                 f"{mark(t)}" for t in ts))
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    return L


def write_markdown(path: Path, plot: Optional[Path], cfg: Dict[str, Any], info: Dict[str, str],
                   res: Results, tgts: List[Dict[str, Any]], meta: Dict[str, Any]) -> None:
    """Writes the report to `path`: header, machine, targets, notes, plot, methodology, one table per case in
    number order, then the sections of their own scripts kept from the file it replaces."""
    by_key: Dict[str, List[Dict[str, Any]]] = {}
    for t in tgts:
        by_key.setdefault(t["key"], []).append(t)

    L: List[str] = []
    L += text("header", args=f" {meta['argv']}" if meta["argv"] else "", date=meta["date"],
              minutes=meta["duration"] / 60, samples=os.path.relpath(meta["json"], path.parent)) + [""]
    if cfg["quick"]:
        L += text("quick") + [""]
    if meta["busy"]:
        L += text("busy", load_start=meta["load_start"], load_end=meta["load_end"], cpus=os.cpu_count()) + [""]
    L += expect(cfg, res)
    L += ["## Machine", "", "| | |", "|---|---|"]
    L += [f"| {k} | {v} |" for k, v in info.items()]
    L += [f"| {k} | {v} |" for k, v in meta["versions"].items()]
    L += [f"| load average (start / end) | {meta['load_start']} / {meta['load_end']} |",
          f"| page-cache eviction | {meta['eviction']} |", ""]

    L += text("targets") + ["", "| target | wanted | measured | |", "|---|---|---|---|"]
    for t in tgts:
        L.append(f"| {t['what']} | {t.get('wanted', '')} | {t['text']} | {mark(t)} |")
    met = sum(1 for t in tgts if t["met"])
    real = [t for t in tgts if not t.get("info") and not t.get("restated")]
    restated = len([t for t in tgts if t.get("restated")])
    L += ["", f"{met} of {len(real)} met, {sum(1 for t in real if t['met'] is False)} not met, "
          f"{sum(1 for t in real if t['met'] is None)} not measured"
          f"{f'; {restated} restated as a fraction of a ceiling (counted there)' if restated else ''}.", ""]
    if res.notes:
        L += ["Notes from this run:", ""] + [f"- {n}" for n in res.notes] + [""]
    if plot is not None:
        L += [f"![benchmark plot]({os.path.relpath(plot, path.parent)})", ""]

    L += text("how_measured", reps=cfg["reps"], inner_reps=cfg["inner_reps"], hidden=cfg["hidden"],
              fresh_idle=cfg.get("fresh_idle", 0)) + [""]

    L += table(res, by_key, "C", "Machine ceilings", [("GB/s", col_gbps), ("cached", col_cached)])
    L += table(res, by_key, "1", "1. open + keys (+ shapes)", [], text("case1"))
    L += table(res, by_key, "2", "2. Lazy load_file (mmap)", [("RSS after, MiB", col_mib("rss_delta"))],
               text("case2"))
    L += table(res, by_key, "3", "3. Materialized load, warm page cache",
               [("GB/s", col_gbps), ("RSS after, MiB", col_mib("rss_delta")), ("peak, MiB", col_mib("peak_delta"))])
    L += table(res, by_key, "4", "4. Load, cold page cache", [("GB/s", col_gbps), ("cached", col_cached)])
    L += table(res, by_key, "5", "5. Save", [("GB/s", col_gbps), ("peak above tensors, MiB", col_mib("peak_delta"))])
    L += table(res, by_key, "6", "6. Tensor-parallel slicing (1/8 of the columns of every 2-D tensor)",
               [("GB/s", col_gbps), ("peak, MiB", col_mib("peak_delta"))])
    L += table(res, by_key, "7", "7. get_tensor, per tensor", [],
               text("case7", count=count_name(cfg["get_tensor_count"])))
    L += table(res, by_key, "8", "8. What a user sees: one load per new interpreter, against the peers",
               [("GB/s", col_gbps), ("RSS after, MiB", col_mib("rss_delta")), ("page faults", col_faults),
                ("cached", col_cached)], text("case8"))
    path.write_text(sections.compose("\n".join(L), sections.blocks(path.read_text() if path.exists() else "")))


def report(out_md: Path, plot: Path, cfg: Dict[str, Any], info: Dict[str, str], results: Results,
           meta: Dict[str, Any]) -> None:
    """Evaluates the targets and writes the Markdown report and the plot (from a run, or from its JSON)."""
    tgts = targets(cfg, results)
    results.notes += observations(cfg, results)
    plot_error = write_plot(plot, cfg, results)
    if plot_error:
        results.notes.append(plot_error)
    write_markdown(out_md, None if plot_error else plot, cfg, info, results, tgts, meta)
    print(f"\nTargets ({meta['duration'] / 60:.1f} min, load average {meta['load_start']} -> {meta['load_end']}"
          f"{', BUSY MACHINE: noisy' if meta['busy'] else ''}):")
    for t in tgts:
        print(f"  {mark(t).replace('**', '') or 'info':<12} {t['what']}: {t['text']}"
              + ("" if t.get("info") else f" (wanted {t.get('wanted', '?')})"))
    print(f"\nwrote {os.path.relpath(out_md, ROOT)}" + ("" if plot_error else f", {os.path.relpath(plot, ROOT)}")
          + f", from {os.path.relpath(meta['json'], ROOT)}")
    errors = [r for r in results.rows.values() if r.get("error")]
    if errors:
        print(f"{len(errors)} measurement(s) failed (see the tables)", file=sys.stderr)
