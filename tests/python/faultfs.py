"""A read-only passthrough FUSE filesystem (mfusepy over libfuse3) whose reads fail on demand.

    python faultfs.py BACKING MOUNTPOINT RULES

Serves the files of BACKING at MOUNTPOINT, in the foreground, until it is unmounted. RULES is a JSON file,
read again whenever it changes, of ``{file name: {"eio": [[lo, hi], ...], "stall": [[lo, hi, seconds],
...], "refuse_direct": true}}``: a read request that overlaps [lo, hi) of that file fails with EIO, or -- once
per stall rule -- sleeps that long before it is served; with ``refuse_direct`` an open with O_DIRECT fails with
EINVAL, as filesystems without direct I/O refuse it. A file that shrinks is made by truncating it in BACKING: the kernel
still believes the old size, as an NFS client does, and reads past the new end come back short.

The kernel reads whole pages (and reads ahead), so the ranges are best page aligned; requests arrive from
several libfuse threads.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import mfusepy as fuse


class FaultFS(fuse.Operations):
    use_ns = True

    def __init__(self, backing: str, rules: str) -> None:
        self.backing = backing
        self.rules_path = rules
        self.rules: Dict[str, Any] = {}
        self.rules_mtime: Optional[int] = None
        self.stalled: set = set()
        self.lock = threading.Lock()

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _rules_for(self, path: str) -> Dict[str, Any]:
        with self.lock:
            try:
                mtime = os.stat(self.rules_path).st_mtime_ns
            except FileNotFoundError:
                return {}
            if mtime != self.rules_mtime:
                with open(self.rules_path) as f:
                    self.rules = json.load(f)
                self.rules_mtime = mtime
            return self.rules.get(os.path.basename(path), {})

    def getattr(self, path: str, fh: Optional[int] = None) -> Dict[str, Any]:
        st = os.lstat(self._real(path))
        attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid")}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def readdir(self, path: str, fh: int) -> List[str]:
        return [".", ".."] + os.listdir(self._real(path))

    def open(self, path: str, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise fuse.FuseOSError(errno.EROFS)
        if flags & os.O_DIRECT and self._rules_for(path).get("refuse_direct"):
            raise fuse.FuseOSError(errno.EINVAL)
        return os.open(self._real(path), os.O_RDONLY)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        rules = self._rules_for(path)
        end = offset + size
        for lo, hi in rules.get("eio", []):
            if offset < hi and end > lo:
                raise fuse.FuseOSError(errno.EIO)
        for i, (lo, hi, seconds) in enumerate(rules.get("stall", [])):
            key = (path, i)
            if offset < hi and end > lo and key not in self.stalled:
                self.stalled.add(key)
                time.sleep(seconds)
        return os.pread(fh, size, offset)

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0


def main() -> None:
    backing, mountpoint, rules = sys.argv[1:4]
    fuse.FUSE(FaultFS(backing, rules), mountpoint, foreground=True, ro=True, fsname="faultfs")


if __name__ == "__main__":
    main()
