"""The report's opening table, "What to expect": for each common job, this package's median beside the fastest
other way measured in the same run, read from the rows of the cases (the keys of suite/keys.py). README links
here instead of quoting figures of its own. A job whose rows the run did not measure is left out."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from suite import keys
from suite.common import Results, count_name, fmt_time, median, size_name
from suite.targets import fastest_peer

Row = Dict[str, Any]


def _best(res: Results, wanted: Sequence[str]) -> Optional[Row]:
    rows = [r for r in (res.get(k) for k in wanted) if r]
    return min(rows, key=median) if rows else None


def _line(job: str, ours: Optional[Row], other: Optional[Row]) -> Optional[str]:
    if ours is None or other is None:
        return None
    ratio = median(other) / median(ours)
    verdict = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    return (f"| {job} | {fmt_time(median(ours))} ({ours['label'].split(': ', 1)[-1]}) | "
            f"{fmt_time(median(other))} ({other['label']}) | {verdict} |")


def expect(cfg: Dict[str, Any], res: Results) -> List[str]:
    """The section's lines (none when the run measured none of its jobs)."""
    lines: List[Optional[str]] = []
    n = 20000 if 20000 in cfg["counts"] else max(cfg["counts"], default=0)
    lines.append(_line(f"open a file of {count_name(n)} tensors, list names and shapes",
                       res.get(keys.open_keys("open+keys+shapes", n, "ours")),
                       res.get(keys.open_keys("open+keys+shapes", n, "ref"))))
    fresh = list(cfg.get("fresh_sizes", [])) if "8" in cfg["cases"] else []
    for temp, how in (("warm", "file in the page cache"), ("cold", "file not cached")):
        for size in fresh:
            ours = _best(res, [keys.fresh(temp, size, r) for r in ("ours_auto", "ours")])
            lines.append(_line(f"load {size_name(size)} into tensors of their own, new process, {how}", ours,
                               fastest_peer(res, temp, size)))
    for size in fresh[:1]:
        lines.append(_line(f"open {size_name(size)} lazily (mmap views), new process",
                           res.get(keys.fresh("warm", size, "ours_lazy")),
                           res.get(keys.fresh("warm", size, "ref_lazy"))))
    for size in cfg["sizes"][-1:]:
        lines.append(_line(f"save {size_name(size)}", res.get(keys.save(size, "ours", "nofsync")),
                           res.get(keys.save(size, "ref", "nofsync"))))
        lines.append(_line(f"save {size_name(size)} and fsync", res.get(keys.save(size, "ours", "fsync")),
                           res.get(keys.save(size, "ref", "fsync"))))
    size = cfg["slice_size"]
    lines.append(_line(f"read 1/8 of the columns of every matrix of {size_name(size)} (tensor parallel)",
                       res.get(keys.slicing(size, "mmap", "ours")), res.get(keys.slicing(size, "mmap", "ref"))))
    lines.append(_line("get_tensor, per tensor", res.get(keys.get_tensor("pt", "mmap", "ours")),
                       res.get(keys.get_tensor("pt", "mmap", "ref"))))
    rows = [line for line in lines if line]
    if not rows:
        return []
    return ["## What to expect", "",
            "Medians of this run, each beside the fastest other way measured in it (the reference, torch.load, "
            "the peers of case 8); min, max, ceilings and the method are in the cases below, loads from S3, "
            "prefetch, distributed and sharded checkpoints and threads in the sections after them.", "",
            "| job | this package | the fastest other | |", "|---|---|---|---|", *rows, ""]
