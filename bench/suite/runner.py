"""How the cases measure: the Runner holds a run's configuration, temp dir, servers, ceilings and results,
and runs measurements either as single shots, each in a fresh child and taking turns with the others of an
`interleaved()` block (repeat), or as one child that repeats the operation itself (inner). The cases
(suite/case_*.py) are functions of a Runner."""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from suite.ceilings import Ceilings, FreshCeiling, settle_and_start
from suite.common import MeasurementError, Results, Server
from suite.pagecache import LATE_SECONDS, setup_of

# What a server is called with: a worker.py process, or bench/ceilings.c for case 8's ceiling.
Serve = Union[Server, FreshCeiling]


class Runner:
    """One run's measuring state; `servers` maps a name ("ours", "ref", "fresh_peers", ...) to what measures."""

    def __init__(self, cfg: Dict[str, Any], tmpdir: Path, servers: Dict[str, Serve], ceilings: Ceilings,
                 results: Results, can_evict: bool) -> None:
        self.cfg, self.tmp, self.servers, self.ceil, self.res = cfg, tmpdir, servers, ceilings, results
        self.can_evict = can_evict
        self._batch: Optional[List[Tuple[Any, ...]]] = None
        # Each server's latest rss_before (its process's RSS when a load's clock started), for a request that
        # asks to hold as much (hold_like: the server's name) as the C ceiling does (CEILINGS_HOLD_BYTES).
        self.rss_before: Dict[str, int] = {}

    def want(self, case: str) -> bool:
        """Whether the run measures `case` (a number of CASES)."""
        return case in self.cfg["cases"]

    def repeat(self, key: str, case: str, group: str, label: str, server: str, request: Dict[str, Any],
               vary: Optional[str] = None) -> None:
        """Single-shot measurements, each in a fresh child, cfg["reps"] of them; `vary` names a request field
        set to the repetition number (the tensor-parallel rank). Inside `with self.interleaved()` they are
        queued and run round-robin with the others of the block."""
        item = (key, case, group, label, server, request, vary)
        if self._batch is not None:
            self._batch.append(item)
        else:
            self._run_batch([item])

    @contextlib.contextmanager
    def interleaved(self) -> Iterator[None]:
        """Runs the measurements queued in the block round-robin (repetition 1 of each, then 2, ...), so that
        a machine whose load drifts during the run does not favour whichever implementation came first."""
        self._batch = []
        try:
            yield
            batch = self._batch
        finally:
            self._batch = None
        self._run_batch(batch)

    def _run_batch(self, items: List[Tuple[Any, ...]]) -> None:
        samples: List[List[Dict[str, Any]]] = [[] for _ in items]
        errors: List[Optional[str]] = [None] * len(items)
        reps = self.cfg["reps"]
        for i in range(reps):
            if len(items) > 1:
                print(f"[{time.monotonic() - self.res.t0:6.0f}s] {items[0][1]:>2} {items[0][2]:<28} "
                      f"round {i + 1} of {reps} over {len(items)} measurements", flush=True)
            for j, (_key, _case, _group, _label, server, request, vary) in enumerate(items):
                if errors[j]:
                    continue
                sent = dict(request, **({vary: i % 8} if vary else {}))
                if "hold_like" in sent:
                    sent["hold"] = self.rss_before.get(sent.pop("hold_like"), 0)
                if sent.get("idle"):
                    # The previous measured process has just ended. A fresh-process row (settle) meets the page
                    # cache set up here, before the common predecessor: what evicting the previous row's files
                    # frees (6 GiB after a cold pread row) is then freed before it, not inside this row's pause,
                    # where it made the next row's fill measurably cheaper. Then the same predecessor for every
                    # row, and this one's clock starts idle s from now.
                    setup = None
                    if "settle" in sent:
                        setup = setup_of(sent)
                        sent["warm"] = False
                    sent["start_at"] = settle_and_start(self.ceil.exe, sent.pop("settle", None), sent["idle"], setup)
                try:
                    samples[j].append(self.servers[server](sent))
                except MeasurementError as e:
                    errors[j] = str(e)
                    continue
                if "rss_before" in samples[j][-1]:
                    self.rss_before[server] = samples[j][-1]["rss_before"]
        for j, (key, case, group, label, _server, _request, _vary) in enumerate(items):
            if errors[j]:
                self.res.fail(key, case, group, label, errors[j])
                continue
            got = samples[j]
            extra: Dict[str, Any] = {"bytes": int(statistics.median(s["bytes"] for s in got))}
            for field in ("rss_delta", "peak_delta", "resident_before", "late_seconds", "held_bytes"):
                if field in got[0]:
                    extra[field] = max(s[field] for s in got)
            if extra.get("late_seconds", 0) > LATE_SECONDS:
                self.res.notes.append(f"{group}, {label}: a repetition's clock started {extra['late_seconds']:.2f} s "
                                      "after the moment its idle ended (its process took longer to start)")
            if "minor_faults" in got[0]:
                extra["minor_faults"] = int(statistics.median(s["minor_faults"] for s in got))
            self.res.add(key, case, group, label, [s["seconds"] for s in got], **extra)

    def inner(self, key: str, case: str, group: str, label: str, server: str, request: Dict[str, Any]) -> None:
        """One child that repeats the operation itself (state does not matter: open, get_tensor, reads into
        a buffer that stays faulted)."""
        try:
            r = self.servers[server](dict(request, reps=self.cfg["inner_reps"]))
        except MeasurementError as e:
            self.res.fail(key, case, group, label, str(e))
            return
        self.res.add(key, case, group, label, r["seconds"], **({"bytes": r["bytes"]} if "bytes" in r else {}))
