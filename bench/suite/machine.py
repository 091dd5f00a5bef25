"""The machine a run measures: its description for the report (CPU, memory, kernel, file system, huge pages,
compiler, source tree), load average and available memory, whether the page cache can be emptied here, and
the copy of this package that one run measures."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

from suite import pagecache
from suite.common import MiB, ROOT

def sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, text=True, capture_output=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info(tmpdir: Path) -> Dict[str, str]:
    cpu = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    mem = re.search(r"^MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M)
    os_name = re.search(r'^PRETTY_NAME="?(.*?)"?$', Path("/etc/os-release").read_text(), re.M) \
        if Path("/etc/os-release").exists() else None
    fs = " ".join((sh("findmnt", "-n", "-o", "FSTYPE,SOURCE,OPTIONS", "-T", str(tmpdir))
                   or sh("stat", "-f", "-c", "%T", str(tmpdir))).split())
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    defrag = Path("/sys/kernel/mm/transparent_hugepage/defrag")
    hyper = re.search(r"Hypervisor vendor:\s*(\S+)", sh("lscpu"))
    container = sh("systemd-detect-virt", "--container")
    virt = ", ".join(x for x in (f"hypervisor {hyper.group(1)}" if hyper else "",
                                 f"container {container}" if container and container != "none" else "") if x)
    commit = sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD")
    dirty = sh("git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no")
    return {
        "CPU": f"{cpu.group(1) if cpu else platform.processor()} ({os.cpu_count()} logical CPUs"
               + (f", {virt}" if virt else "") + ")",
        "memory": f"{int(mem.group(1)) / (1 << 20):.1f} GiB" if mem else "?",
        "OS / kernel": f"{os_name.group(1) if os_name else platform.system()} / Linux {platform.release()}",
        "temp dir": f"{tmpdir} ({fs})",
        "transparent huge pages": (f"enabled {thp.read_text().strip()}, defrag {defrag.read_text().strip()}"
                                   if thp.exists() and defrag.exists() else "n/a"),
        "C compiler": sh(os.environ.get("CC", "cc"), "--version").splitlines()[0] if sh(os.environ.get("CC", "cc"), "--version") else "none",
        "source tree": f"{commit}{' + uncommitted changes' if dirty else ''}",
    }


def snapshot_package(env: Dict[str, str], dest: Path) -> Path:
    """Copies the installed `safetensors` package (Python files and native module) to dest/safetensors and
    returns dest, for this package's workers: the whole run measures one build, and a rebuild during the run
    (which rewrites the native module in place) cannot crash the workers that have it mapped."""
    src = subprocess.run([sys.executable, "-c", "import os, safetensors; print(os.path.dirname(safetensors.__file__))"],
                         env=env, text=True, capture_output=True, check=True).stdout.strip()
    target = dest / "safetensors"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "SOURCE").write_text(src + "\n")
    return dest


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def mem_available() -> int:
    m = re.search(r"^MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M)
    return int(m.group(1)) * 1024 if m else 1 << 62


def check_eviction(tmpdir: Path) -> Tuple[bool, str]:
    """Whether posix_fadvise(DONTNEED) really empties the page cache of a file here (checked with mincore)."""
    probe = tmpdir / "evict-probe.bin"
    try:
        with open(probe, "wb") as f:
            f.write(os.urandom(8 * MiB))
        pagecache.warm(str(probe))
        before = pagecache.resident_fraction(str(probe))
        after = pagecache.evict(str(probe))
        ok = after < 0.02
        return ok, (f"posix_fadvise(DONTNEED) works here: a cached 8 MiB file went from {before:.0%} to "
                    f"{after:.0%} resident (mincore)" if ok else
                    f"posix_fadvise(DONTNEED) does NOT evict here ({before:.0%} -> {after:.0%} resident, mincore): "
                    "cold-cache numbers are not measured")
    except OSError as e:
        return False, f"page-cache eviction is not possible here ({e}): cold-cache numbers are not measured"
    finally:
        probe.unlink(missing_ok=True)
