"""Every single-shot load of the benchmarks starts its clock at one moment the harness chose (start_at: the
previous measured process's end plus the idle), whatever its process did first: a Python load after its
imports, bench/ceilings.c at once. Memory freed longer before is dearer on a VM that hands it back to its host,
so a row that started later than the others would read as a slower fill than it is; and a C ceiling holds the
memory a Python load's process holds when its clock starts (CEILINGS_HOLD_BYTES)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

from suite import pagecache  # noqa: E402
from suite.ceilings import Ceilings, FreshCeiling, build_ceilings  # noqa: E402
from suite.common import Results  # noqa: E402
from suite.runner import Runner  # noqa: E402

WAIT = 0.6


@pytest.fixture(scope="module")
def ceilings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = build_ceilings(tmp_path_factory.mktemp("ceilings"))
    if exe is None:
        pytest.skip("no C compiler for bench/ceilings.c")
    return exe


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    return path


def run_c(ceilings: Path, data: Path, start_at: float) -> Dict[str, Any]:
    out = subprocess.run([str(ceilings), "pread", str(data), "1", "1", "3"], capture_output=True, text=True,
                         env={**os.environ, "CEILINGS_START_AT": repr(start_at)}, check=True)
    return json.loads(out.stdout)


def test_the_c_ceiling_waits_for_its_start_before_its_clock(ceilings: Path, data: Path) -> None:
    t0 = time.monotonic()
    got = run_c(ceilings, data, t0 + WAIT)
    assert time.monotonic() - t0 >= WAIT
    assert got["late_seconds"] == 0
    assert got["seconds"][0] < WAIT  # the wait is not timed: 1 MiB from the page cache


def test_the_c_ceiling_says_how_late_it_started(ceilings: Path, data: Path) -> None:
    got = run_c(ceilings, data, time.monotonic() - 2)
    assert got["late_seconds"] >= 2


def test_a_requests_start_is_its_stamp_else_its_idle_from_now_else_none() -> None:
    assert pagecache.start_of({"start_at": 12.5, "idle": 100}) == 12.5
    t0 = time.monotonic()
    got = pagecache.start_of({"idle": 3.0})
    assert got is not None and t0 + 3.0 <= got <= time.monotonic() + 3.0
    assert pagecache.start_of({"idle": 0}) is None
    assert pagecache.start_of({}) is None


def test_a_requests_page_cache_setup_names_the_file_it_reads_and_the_others() -> None:
    assert pagecache.setup_of({"path": "a", "pt": "b", "method": "st_auto"}) == ("a", False, ("a", "b"), True)
    assert pagecache.setup_of({"path": "a", "pt": "b", "method": "torch_load", "evict": True, "warm": False}) == (
        "b", True, ("a", "b"), False)
    assert pagecache.setup_of({"path": "a", "others": ["c"], "evict": True}) == ("a", True, ("a", "", "c"), True)


def test_prepare_waits_after_warming_and_reports_lateness(data: Path) -> None:
    t0 = time.monotonic()
    assert pagecache.prepare(str(data), False, start_at=t0 + WAIT) == {"late_seconds": 0.0}
    assert time.monotonic() - t0 >= WAIT
    assert pagecache.resident_fraction(str(data)) == 1.0
    assert pagecache.prepare(str(data), False, start_at=time.monotonic() - 1)["late_seconds"] >= 1
    assert pagecache.prepare(str(data), False) == {}  # no start: no wait


def test_the_runner_starts_each_clock_idle_seconds_after_the_previous_measurement_ended(tmp_path: Path) -> None:
    sent: List[Dict[str, Any]] = []
    ends: List[float] = []

    def server(request: Dict[str, Any]) -> Dict[str, Any]:
        sent.append(request)
        ends.append(time.monotonic())
        return {"seconds": 0.001, "bytes": 1, "late_seconds": 0.0}

    res = Results()
    run = Runner({"reps": 3, "cases": ["8"]}, tmp_path, {"a": server, "b": server},  # type: ignore[dict-item]
                 Ceilings(None, res, 1), res, False)
    with run.interleaved():
        run.repeat("a", "8", "g", "a", "a", {"op": "load", "idle": 5.0})
        run.repeat("b", "8", "g", "b", "b", {"op": "load"})
    assert [("start_at" in r) for r in sent] == [True, False] * 3
    t = time.monotonic()
    for i in (0, 2, 4):
        before = ends[i - 1] if i else 0.0
        assert before + 5.0 <= sent[i]["start_at"] <= ends[i] + 5.0 <= t + 5.0


def test_the_fresh_ceiling_passes_its_start_to_the_c_process(ceilings: Path, data: Path) -> None:
    res = Results()
    c = Ceilings(ceilings, res, 1)
    t0 = time.monotonic()
    got = FreshCeiling(c)({"path": str(data), "evict": False, "threads": 1, "memory": 3, "start_at": t0 + WAIT})
    assert time.monotonic() - t0 >= WAIT
    assert got["late_seconds"] == 0 and got["seconds"] < WAIT
    late = FreshCeiling(c)({"path": str(data), "evict": False, "threads": 1, "memory": 3,
                            "start_at": time.monotonic() - 2})
    assert late["late_seconds"] >= 2


def test_the_c_ceiling_holds_the_memory_it_is_asked_to_before_its_fill(ceilings: Path, data: Path) -> None:
    hold = 96 << 20
    proc = subprocess.Popen([str(ceilings), "pread", str(data), "1", "1", "3"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CEILINGS_HOLD_BYTES": str(hold)})
    assert proc.stdout is not None
    got = json.loads(proc.stdout.read())
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    assert got["held_bytes"] == hold
    assert usage.ru_maxrss * 1024 >= hold  # written, not only mapped
    assert got["minor_faults"] < 1024  # and outside the measured fill


def test_the_runner_passes_a_servers_latest_rss_on_as_the_memory_to_hold(tmp_path: Path) -> None:
    sent: List[Dict[str, Any]] = []

    def ours(request: Dict[str, Any]) -> Dict[str, Any]:
        return {"seconds": 0.001, "bytes": 1, "rss_before": 1000 + len(sent)}

    def ceiling(request: Dict[str, Any]) -> Dict[str, Any]:
        sent.append(request)
        return {"seconds": 0.001, "bytes": 1, "held_bytes": request["hold"]}

    res = Results()
    run = Runner({"reps": 2, "cases": ["8"]}, tmp_path, {"ours": ours, "c": ceiling},  # type: ignore[dict-item]
                 Ceilings(None, res, 1), res, False)
    with run.interleaved():
        run.repeat("c0", "C", "g", "c0", "c", {"hold_like": "ours"})  # before any load: nothing to hold
        run.repeat("o", "8", "g", "o", "ours", {"op": "load"})
        run.repeat("c1", "C", "g", "c1", "c", {"hold_like": "ours"})
    assert [r["hold"] for r in sent] == [0, 1001, 1001, 1003]
    assert all("hold_like" not in r for r in sent)
    assert res.get("c1")["held_bytes"] == 1003


def test_the_runner_sets_the_page_cache_up_then_settles_memory_then_stamps_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import suite.ceilings
    import suite.runner

    events: List[Any] = []
    monkeypatch.setattr(suite.ceilings, "settle", lambda exe, n: events.append(("settle", n, time.monotonic())))
    monkeypatch.setattr(suite.ceilings.pagecache, "prepare", lambda *args: events.append(("prepare", args)))

    def server(request: Dict[str, Any]) -> Dict[str, Any]:
        events.append(("load", request))
        return {"seconds": 0.001, "bytes": 1}

    res = Results()
    run = Runner({"reps": 2, "cases": ["8"]}, tmp_path, {"a": server}, Ceilings(None, res, 1), res,  # type: ignore[dict-item]
                 False)
    with run.interleaved():
        run.repeat("a", "8", "g", "a", "a", {"op": "load", "method": "torch_load", "path": "st", "pt": "pt",
                                             "evict": True, "idle": 2.0, "settle": 4096})
        run.repeat("b", "8", "g", "b", "a", {"op": "load", "path": "st"})  # no idle: nothing set up, nothing settled
    assert [e[0] for e in events] == ["prepare", "settle", "load", "load"] * 2
    for i in (0, 4):
        assert events[i][1] == ("pt", True, ("st", "pt"), True)  # torch's file read, cold, the other evicted
        _, n, settled_at = events[i + 1]
        request = events[i + 2][1]
        assert n == 4096 and "settle" not in request
        assert request["start_at"] >= settled_at + 2.0
        assert request["warm"] is False  # the load's own prepare does not read the file again
        assert "warm" not in events[i + 3][1]


def test_a_cold_rows_file_is_evicted_before_the_common_predecessor(tmp_path: Path, data: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # What evicting the previous row's page cache frees must be freed before settle, not in the row's pause.
    import suite.ceilings

    other = tmp_path / "other.bin"
    other.write_bytes(bytes(1 << 20))
    seen: List[Any] = []

    def settle(exe: Any, n: int) -> None:
        seen.append((pagecache.resident_fraction(str(data)), pagecache.resident_fraction(str(other))))

    monkeypatch.setattr(suite.ceilings, "settle", settle)
    res = Results()
    run = Runner({"reps": 1, "cases": ["8"]}, tmp_path, {"a": lambda r: {"seconds": 0.001, "bytes": 1}},  # type: ignore[dict-item]
                 Ceilings(None, res, 1), res, False)
    for cold, want in ((True, (0.0, 0.0)), (False, (1.0, 0.0))):
        pagecache.warm(str(data))
        pagecache.warm(str(other))
        with run.interleaved():
            run.repeat("a", "8", "g", "a", "a", {"op": "load", "method": "st_auto", "path": str(data),
                                                 "pt": str(other), "evict": cold, "idle": 0.01, "settle": 1})
        assert seen.pop() == want


def test_settle_writes_that_much_fresh_memory_in_a_process_of_its_own(ceilings: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import suite.ceilings

    peaks: List[int] = []

    def run(cmd: List[str], **kwargs: Any) -> subprocess.CompletedProcess:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        peaks.append(usage.ru_maxrss * 1024)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    monkeypatch.setattr(suite.ceilings.subprocess, "run", run)
    suite.ceilings.settle(ceilings, 64 << 20)
    assert len(peaks) == 1 and peaks[0] >= 64 << 20
