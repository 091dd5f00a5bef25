"""The plot of a run (bench/results.png): bandwidth bars of cases 3 to 6 against their ceilings, get_tensor's
time per tensor (case 7) and open + keys against the number of tensors (case 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from suite import keys
from suite.common import IMPL, Results, count_name, gbps, median, size_name

def write_plot(path: Path, cfg: Dict[str, Any], res: Results) -> Optional[str]:
    """Draws the plot into `path`; returns why there is none (matplotlib missing), or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (scripts/setup.sh installs it)"

    colors = {"this package": "#1f77b4", "reference": "#ff7f0e", "torch": "#2ca02c", "numpy": "#9467bd"}

    def color(label: str) -> str:
        for k, c in colors.items():
            if label.startswith(k):
                return c
        return "#7f7f7f"

    def bars(ax: Any, title: str, rows: List[Tuple[str, str]], lines: List[Tuple[str, str]],
             unit: str = "GB/s") -> None:
        labels, values, cols = [], [], []
        for key, label in rows:
            r = res.get(key)
            if r is None:
                continue
            labels.append(label)
            values.append(gbps(r) if unit == "GB/s" else median(r) * 1e6)
            cols.append(color(label))
        if not values:
            ax.set_visible(False)
            return
        y = range(len(values))
        ax.barh(list(y), values, color=cols)
        ax.set_yticks(list(y), labels, fontsize=7)
        ax.invert_yaxis()
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.2f}", va="center", fontsize=7)
        styles = [("#d62728", "--"), ("#000000", ":"), ("#8c564b", "-."), ("#17becf", "--"), ("#bcbd22", ":")]
        for j, (key, label) in enumerate(lines):
            r = res.get(key)
            if r is not None and gbps(r):
                c, ls = styles[j % len(styles)]
                ax.axvline(gbps(r), color=c, linestyle=ls, linewidth=1.2, label=f"{label}: {gbps(r):.2f} GB/s")
        if lines:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        ax.set_xlabel(unit, fontsize=8)
        ax.set_title(title, fontsize=9)

    big = cfg["sizes"][-1]
    s = size_name(big)
    fig, axes = plt.subplots(3, 2, figsize=(15, 16))
    # (mmap + touch is left out here: the tensors stay views of the page cache, tens of GB/s off the scale)
    warm_keys = [(keys.warm(big, impl, m), f"{IMPL[impl]}: {lbl}") for impl in ("ours", "ref")
                 for m, lbl in (("st_pread", "pread"), ("st_mmap_clone", "mmap + clone"))]
    warm_keys += [(keys.warm(big, "torch"), "torch.load"), (keys.warm(big, "numpy"), "numpy fromfile"),
                  (keys.prealloc(big, "read_many", "pread"), "this package: read_many, pre-faulted"),
                  (keys.prealloc(big, "read_range", "pread"), "this package: read_range, pre-faulted"),
                  (keys.warm(big, "ours_thp", "st_pread"), "this package: pread, torch THP allocation")]
    bars(axes[0, 0], f"3. Load {s}, warm cache", warm_keys,
         [(keys.ceiling("touch", big), "first touch"), (keys.ceiling("touch_thp", big), "first touch, huge pages"),
          (keys.ceiling("pread_warm", big), "warm pread, pre-faulted"),
          (keys.ceiling("pread_fresh", big), "warm pread, fresh memory"),
          (keys.ceiling("pread_fresh_thp", big), "warm pread, fresh huge pages")])
    c = cfg["cold_size"]
    cold_keys = [(keys.cold(c, impl, m), f"{IMPL[impl]}: {lbl}") for impl in keys.IMPLS
                 for m, lbl in (("st_pread", "pread"), ("st_mmap_clone", "mmap + clone"),
                                ("st_mmap_touch", "mmap + touch"))]
    cold_keys += [(keys.cold(c, "torch"), "torch.load"), (keys.cold(c, "numpy"), "numpy fromfile")]
    bars(axes[0, 1], f"4. Load {size_name(c)}, cold cache", cold_keys,
         [(keys.ceiling("pread_cold", c), "cold pread")])
    save_keys = [(keys.save(big, impl, sync), f"{IMPL[impl]}{' + fsync' if sync == 'fsync' else ''}")
                 for sync in ("nofsync", "fsync") for impl in ("ours", "ref", "torch", "numpy")
                 if not (sync == "fsync" and impl == "torch")]
    bars(axes[1, 0], f"5. Save {s}", save_keys, [(keys.ceiling("write", big), "pwrite ceiling"),
                                                  (keys.ceiling("write_fsync", big), "pwrite + fsync ceiling")])
    sl = cfg["slice_size"]
    bars(axes[1, 1], f"6. Slicing 1/8 of the columns, {size_name(sl)} file",
         [(keys.slicing(sl, b, impl), f"{IMPL[impl]}: {b}") for b in keys.BACKENDS for impl in keys.IMPLS], [])
    bars(axes[2, 1], f"7. get_tensor, {count_name(cfg['get_tensor_count'])}-tensor file (µs per tensor)",
         [(keys.get_tensor(fw, b, impl), f"{IMPL[impl]}: {fw}, {b}") for fw in keys.FRAMEWORKS
          for b in keys.BACKENDS for impl in keys.IMPLS], [], unit="µs per tensor")
    ax = axes[2, 0]
    plotted = False
    for what, style in (("open+keys", "--"), ("open+keys+shapes", "-")):
        for impl in ("ours", "ref"):
            pts = [(n, median(r)) for n in cfg["counts"] if (r := res.get(keys.open_keys(what, n, impl)))]
            if pts:
                ax.loglog([p[0] for p in pts], [p[1] * 1e3 for p in pts], style, marker="o",
                          color=color(IMPL[impl]), label=f"{IMPL[impl]}: {what}")
                plotted = True
    if plotted:
        ax.set_xlabel("tensors in the file", fontsize=8)
        ax.set_ylabel("ms", fontsize=8)
        ax.legend(fontsize=7)
        ax.set_title("1. open + keys (+ shapes)", fontsize=9)
    else:
        ax.set_visible(False)
    fig.suptitle(f"safetensors (C++) vs reference 0.8.0, torch, numpy; median of {cfg['reps']}"
                 + (" (--quick)" if cfg["quick"] else ""), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None
