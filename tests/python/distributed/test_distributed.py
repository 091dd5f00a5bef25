"""safetensors.distributed: loads shared by the ranks of a torch.distributed group (gloo, on the CPU).

Ranks are spawned processes (tests/python/distributed/worker.py) joined through a TCPStore this process hosts
(race-free: the store picks its port), world sizes 2 and 4; one spawn runs many scenarios in one process
group (plan and read errors leave the group usable). Every result is compared byte for byte with a
single-process ``safetensors.torch.load_file`` of the same file. Every process has a deadline: a hang fails the
test. The two-host test joins two network namespaces by a veth pair (root only; skipped with the reason
otherwise) and runs one rank in each, gloo over TCP between 10.200.0.1 and 10.200.0.2.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch

import safetensors.distributed as sdist
from safetensors.distributed import _group, _opening
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORKER = Path(__file__).parent / "worker.py"
PG_TIMEOUT = 20  # seconds: the process group's timeout in the workers
SPAWN_DEADLINE = 240  # seconds: a whole spawn (a few dozen loads on 2 shared cores)
CHUNK = 256 << 10


# -- the checkpoint --------------------------------------------------------------------------------------------

def _bytes(g: torch.Generator, n: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def model_state() -> Dict[str, torch.Tensor]:
    """Every dtype torch can hold, a 3 MiB tensor (chunks land in it directly), small tensors sharing chunks
    (staged), matrices for tensor-parallel plans, a scalar, empty tensors: about 5 MiB."""
    g = torch.Generator().manual_seed(18)
    out: Dict[str, torch.Tensor] = {
        "big": _bytes(g, 3 << 20).view(torch.float32).reshape(768, 1024),
        "tp.col": _bytes(g, 64 * 2048 * 2).view(torch.bfloat16).reshape(64, 2048),
        "tp.row": _bytes(g, 96 * 1000 * 4).view(torch.float32).reshape(96, 1000),
        "unused": _bytes(g, 300_000).reshape(300, 1000),
        "flags": torch.randint(0, 2, (1000,), generator=g).bool(),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 7),
        "packed": _bytes(g, 64).view(torch.float4_e2m1fn_x2).reshape(8, 8),
    }
    for dtype in (torch.uint8, torch.int8, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e8m0fnu,
                  torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.int16, torch.uint16, torch.float16,
                  torch.bfloat16, torch.int32, torch.uint32, torch.float32, torch.complex64, torch.float64,
                  torch.int64, torch.uint64):
        size = torch.empty(0, dtype=dtype).element_size()
        out[f"d.{str(dtype).split('.')[-1]}"] = _bytes(g, 37 * 5 * size).view(dtype).reshape(37, 5)
    return out


def digest(t: torch.Tensor) -> List[Any]:
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return [str(t.dtype), list(t.shape), str(t.device), hashlib.sha256(data).hexdigest()]


def durable(path: Path) -> None:
    """Flushes a new file to disk, so that dropping it from the page cache works (dirty pages stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    path = root / "model.safetensors"
    save_file(model_state(), path)
    durable(path)
    for r in range(4):  # a copy per rank, as on separate hosts: each has a page cache of its own
        shutil.copyfile(path, root / f"copy{r}.safetensors")
        durable(root / f"copy{r}.safetensors")
    # For storage counts: 16 MiB, large against the readahead the kernel adds at the start of a file.
    g = torch.Generator().manual_seed(19)
    cold_state = {f"layer{i}": _bytes(g, 4 << 20).view(torch.bfloat16).reshape(1024, 2048) for i in range(4)}
    save_file(cold_state, root / "cold.safetensors")
    for r in range(4):
        shutil.copyfile(root / "cold.safetensors", root / f"cold{r}.safetensors")
        durable(root / f"cold{r}.safetensors")
    other = root / "other.safetensors"  # same names, one shape differs
    state = model_state()
    state["flags"] = state["flags"][:999]
    save_file(state, other)
    # A sharded checkpoint of the same tensors (transformers' layout).
    names = list(model_state())
    shards = {"model-00001-of-00003.safetensors": names[:3], "model-00002-of-00003.safetensors": names[3:12],
              "model-00003-of-00003.safetensors": names[12:]}
    sharded = root / "sharded"
    sharded.mkdir()
    full = model_state()
    weight_map = {}
    for file, members in shards.items():
        save_file({n: full[n] for n in members}, sharded / file)
        weight_map.update({n: file for n in members})
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
    expected = {name: digest(t) for name, t in load_file(path).items()}
    cold_expected = {name: digest(t) for name, t in load_file(root / "cold.safetensors").items()}
    return {"root": root, "path": path, "other": other, "sharded": sharded, "expected": expected,
            "order": list(load_file(path)), "cold_expected": cold_expected}


# -- plans and what they should read ---------------------------------------------------------------------------

def tp_plan(rank: int, world: int) -> Dict[str, Any]:
    """Tensor parallel: column shards (disjoint rows), row shards overlapping their neighbours by 2 rows,
    replicated small tensors, "unused" in nobody's plan."""
    col = 64 // world
    row = 96 // world
    plan: Dict[str, Any] = {
        "tp.col": [rank * col, (rank + 1) * col],
        "tp.row": [max(0, rank * row - 2), min(96, (rank + 1) * row + 2)],
        "flags": None,
        "scalar": None,
        "packed": [2, 6] if rank % 2 else None,
        "d.bfloat16": [rank, rank + 30],
    }
    if rank == 0:
        plan["big"] = None  # one rank alone needs it: it reads it, nobody receives it
    return plan


def planned_bytes(path: Path, plans: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Expected tensors per rank (slices of the single-process load) and the bytes of the union of the plans."""
    full = load_file(path)
    intervals = []
    per_rank = []
    with safe_open(path, "pt") as f:
        for plan in plans:
            mine = {}
            for name, rows in plan.items():
                meta = f.get_tensor_meta(name)
                begin, end = meta.data_offsets
                if rows is None:
                    mine[name] = digest(full[name])
                    intervals.append((begin, end))
                else:
                    row_bytes = (end - begin) // meta.shape[0]
                    mine[name] = digest(full[name][rows[0]:rows[1]])
                    intervals.append((begin + rows[0] * row_bytes, begin + rows[1] * row_bytes))
            per_rank.append(mine)
    union = 0
    last = -1
    for begin, end in sorted(intervals):
        begin = max(begin, last)
        if end > begin:
            union += end - begin
            last = end
    return {"per_rank": per_rank, "union": union}


# -- spawning ranks --------------------------------------------------------------------------------------------

class Ranks:
    """The outcome of one spawn: each rank's JSON results, exit code and output."""

    def __init__(self, results: List[Optional[Dict[str, Any]]], codes: List[Optional[int]], logs: List[str]):
        self.results, self.codes, self.logs = results, codes, logs

    def __getitem__(self, scenario: str) -> List[Dict[str, Any]]:
        out = []
        for rank, results in enumerate(self.results):
            got = (results or {}).get(scenario)
            assert got is not None, f"rank {rank} has no result for {scenario}:\n{self.logs[rank][-3000:]}"
            assert "crash" not in got, f"rank {rank} crashed in {scenario}:\n{got['crash']}"
            out.append(got)
        return out


def spawn(tmp: Path, world: int, scenarios: List[Dict[str, Any]], *, prefix=None, env=None, store=True,
          deadline: float = SPAWN_DEADLINE, expect_exit: Optional[Dict[int, int]] = None,
          pg_timeout: float = PG_TIMEOUT, worker: Path = WORKER, spec_extra: Optional[Dict[str, Any]] = None
          ) -> Ranks:
    """Runs ``world`` workers (``worker``: a script taking SPEC.json OUT_DIR, as distributed/worker.py; the spec
    is ``{"scenarios": scenarios, **spec_extra}``) over ``scenarios``; every process is killed at ``deadline``
    (the test fails). The workers write their results to OUT_DIR (``tmp / "out"``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"scenarios": scenarios, **(spec_extra or {})}))
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    master = None
    base_env = dict(os.environ, WORLD_SIZE=str(world), ST_DIST_TIMEOUT=str(pg_timeout), OMP_NUM_THREADS="1")
    if store:
        master = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=PG_TIMEOUT))
        base_env["ST_DIST_STORE"] = f"127.0.0.1:{master.port}"
    procs, logs = [], []
    try:
        for rank in range(world):
            log = open(tmp / f"rank{rank}.log", "w")
            logs.append(log)
            cmd = (prefix[rank] if prefix else []) + [sys.executable, str(worker), str(spec), str(out)]
            procs.append(subprocess.Popen(cmd, env=dict(base_env, RANK=str(rank), **((env or [{}] * world)[rank])),
                                          stdout=log, stderr=subprocess.STDOUT))
        end = time.monotonic() + deadline
        for p in procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        hung = [r for r, p in enumerate(procs) if p.poll() is None]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
        del master
    texts = [(tmp / f"rank{r}.log").read_text() for r in range(world)]
    assert not hung, f"ranks {hung} still running after {deadline} s:\n" + "\n".join(t[-3000:] for t in texts)
    codes = [p.returncode for p in procs]
    for r, code in enumerate(codes):
        want = (expect_exit or {}).get(r, 0)
        assert code == want, f"rank {r} exited with {code}, expected {want}:\n{texts[r][-3000:]}"
    results = []
    for r in range(world):
        f = out / f"rank{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else None)
    return Ranks(results, codes, texts)


def main_scenarios(c: Dict[str, Any], world: int) -> List[Dict[str, Any]]:
    root, path = c["root"], str(c["path"])
    plans = [tp_plan(r, world) for r in range(world)]
    bad_slice = [dict(p) for p in plans]
    bad_slice[0]["tp.col"] = [0, 65]
    missing = [dict(p) for p in plans]
    missing[world - 1]["nope"] = None
    sharded_plans = [dict(p) for p in plans]
    colds = [str(root / f"cold{r}.safetensors") for r in range(world)]
    no_file = [path] * world
    no_file[1] = str(root / "absent.safetensors")
    different = [path] * world
    different[world - 1] = str(c["other"])
    return [
        {"name": "replicated", "path": path, "chunk_bytes": CHUNK},
        {"name": "replicated_mmap", "path": path, "chunk_bytes": 64 << 10, "backend": "mmap"},
        {"name": "planned", "path": path, "chunk_bytes": CHUNK, "plan": {"per_rank": plans}},
        {"name": "sharded", "path": str(c["sharded"]), "sharded": True, "chunk_bytes": CHUNK},
        {"name": "sharded_index_planned", "path": str(c["sharded"] / "model.safetensors.index.json"),
         "sharded": True, "chunk_bytes": CHUNK, "plan": {"per_rank": sharded_plans}},
        {"name": "bad_slice", "path": path, "plan": {"per_rank": bad_slice}},
        {"name": "missing_tensor", "path": path, "plan": {"per_rank": missing}},
        {"name": "missing_sharded", "path": str(c["sharded"]), "sharded": True, "plan": {"per_rank": missing}},
        {"name": "file_missing", "path": {"per_rank": no_file}},
        {"name": "different_files", "path": {"per_rank": different}},
        {"name": "chunk_mismatch", "path": path, "chunk_bytes": {"per_rank": [CHUNK] * (world - 1) + [2 * CHUNK]}},
        {"name": "bad_chunk", "path": path, "chunk_bytes": {"per_rank": [CHUNK, 1000] + [CHUNK] * (world - 2)}},
        {"name": "sharded_files", "path": [str(p) for p in sorted(c["sharded"].glob("*.safetensors"))],
         "sharded": True, "chunk_bytes": CHUNK},
        {"name": "meta", "path": path, "device": "meta"},
        {"name": "read_error", "path": path, "chunk_bytes": CHUNK, "fault": {"rank": world - 1, "at": 2,
                                                                              "kind": "raise"}},
        {"name": "after_errors", "path": path, "chunk_bytes": CHUNK},
        {"name": "alone", "alone": True, "path": {"per_rank": colds}},
        {"name": "cold", "path": {"per_rank": colds}, "cold": True, "chunk_bytes": 1 << 20},
    ]


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def run(request, ckpt, tmp_path_factory):
    world = request.param
    ranks = spawn(tmp_path_factory.mktemp(f"world{world}"), world, main_scenarios(ckpt, world))
    return world, ranks


# -- replicated loads ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", ["replicated", "replicated_mmap", "after_errors"])
def test_replicated_every_rank_gets_load_file(run, ckpt, scenario):
    world, ranks = run
    data_bytes = os.path.getsize(ckpt["path"]) - safe_open(ckpt["path"], "pt")._open().file.data_offset
    got = ranks[scenario]
    for rank, result in enumerate(got):
        assert "error" not in result, result
        assert result["tensors"] == ckpt["expected"], f"rank {rank}"
        assert result["order"] == ckpt["order"]
        # The load returned with no tensor it gave the process group still held by gloo's threads.
        assert result["lent"] > 0 and result["held"] == 0, result
    stats = [r["stats"] for r in got]
    # Storage serves each byte once per group, each rank about 1/world of them (within one chunk).
    assert sum(s["bytes_read"] for s in stats) == data_bytes
    chunk = CHUNK if scenario != "replicated_mmap" else 64 << 10
    for s in stats:
        assert s["bytes_needed"] == data_bytes
        assert abs(s["bytes_read"] - data_bytes / world) <= 1.5 * chunk, stats
        assert s["bytes_received"] == data_bytes - s["bytes_read"]


def test_cold_storage_reads_per_rank(run, ckpt):
    """Bytes fetched from storage (/proc/self/io read_bytes) after dropping each rank's copy from the page
    cache: about 1/world of the file per rank, against the whole file per rank loading alone."""
    world, ranks = run
    size = os.path.getsize(ckpt["root"] / "cold.safetensors")
    alone = ranks["alone"]
    for result in alone:
        assert result["tensors"] == ckpt["cold_expected"]
    if min(r["storage_read_bytes"] for r in alone) < size // 2:
        pytest.skip("dropping a file from the page cache (posix_fadvise DONTNEED) does not make later reads hit "
                    f"storage here: a cold load_file read {[r['storage_read_bytes'] for r in alone]} bytes")
    cold = ranks["cold"]
    for rank, result in enumerate(cold):
        assert result["tensors"] == ckpt["cold_expected"], f"rank {rank}"
        read = result["storage_read_bytes"]
        own = result["stats"]["bytes_read"]
        # Kernel readahead may fetch up to about a chunk past a rank's chunks; the header is read too.
        assert own * 0.9 <= read <= own + 3 * (1 << 20), (rank, read, own)
        assert read < alone[rank]["storage_read_bytes"] * (1 / world + 0.2), (rank, read, alone[rank])
    print(f"world {world}: storage bytes per rank, distributed {[r['storage_read_bytes'] for r in cold]}, "
          f"alone {[r['storage_read_bytes'] for r in alone]}")


def test_meta_device_reads_nothing(run, ckpt):
    world, ranks = run
    for result in ranks["meta"]:
        assert {n: d[:2] for n, d in result["tensors"].items()} == {n: d[:2] for n, d in ckpt["expected"].items()}
        assert {d[2] for d in result["tensors"].values()} == {"meta"}
        assert result["stats"]["bytes_read"] == 0 and result["stats"]["bytes_received"] == 0


# -- planned loads ---------------------------------------------------------------------------------------------

def test_planned_each_rank_gets_its_plan_bytes_no_rank_needs_are_not_read(run, ckpt):
    world, ranks = run
    plans = [tp_plan(r, world) for r in range(world)]
    want = planned_bytes(ckpt["path"], plans)
    got = ranks["planned"]
    for rank, result in enumerate(got):
        assert "error" not in result, result
        assert result["tensors"] == want["per_rank"][rank], f"rank {rank}"
    stats = [r["stats"] for r in got]
    assert sum(s["bytes_read"] for s in stats) == want["union"]  # shared bytes once, unplanned bytes never
    assert all(s["bytes_scheduled"] == want["union"] for s in stats)
    # "big" is needed by rank 0 alone: it reads it and nobody receives it.
    assert stats[0]["bytes_read"] >= 3 << 20
    for s in stats[1:]:
        assert s["bytes_received"] + s["bytes_read"] == s["bytes_needed"]


def test_sharded_checkpoint(run, ckpt):
    world, ranks = run
    data = 0
    for shard in sorted(ckpt["sharded"].glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            data += os.path.getsize(shard) - f._open().file.data_offset
    got = ranks["sharded"]
    for rank, result in enumerate(got):
        assert "error" not in result, result
        assert result["tensors"] == ckpt["expected"], f"rank {rank}"
    assert sum(r["stats"]["bytes_read"] for r in got) == data
    for rank, result in enumerate(ranks["sharded_files"]):  # a list of files, no index
        assert result["tensors"] == ckpt["expected"], f"rank {rank}"
    want = planned_bytes(ckpt["path"], [tp_plan(r, world) for r in range(world)])
    for rank, result in enumerate(ranks["sharded_index_planned"]):
        assert result["tensors"] == want["per_rank"][rank], f"rank {rank}"
    assert sum(r["stats"]["bytes_read"] for r in ranks["sharded_index_planned"]) == want["union"]


# -- what a rank opens ------------------------------------------------------------------------------------------

def test_an_index_limits_each_shard_to_what_it_assigns_through_shard_index(tmp_path):
    """The shard-holds-what-the-index-assigns check is the library's (ShardIndex.select): a shard lacking an
    assigned tensor is refused with its one message, naming the shard; unassigned tensors are left out."""
    save_file({"a": torch.zeros(2)}, tmp_path / "s1.safetensors")
    save_file({"b": torch.zeros(2), "stale": torch.ones(1, dtype=torch.int8)}, tmp_path / "s2.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    opened = _opening.open_checkpoint(str(tmp_path), "pread").shards
    assert [(o.label, o.names) for o in opened] == [("s1.safetensors", ["a"]), ("s2.safetensors", ["b"])]
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"}}))
    with pytest.raises(SafetensorError) as e:
        _opening.open_checkpoint(str(index), "pread")
    assert str(e.value) == f'File does not contain tensor c (TensorNotFound) in "{tmp_path / "s2.safetensors"}"'


# -- errors: the same text on every rank -----------------------------------------------------------------------

@pytest.mark.parametrize("scenario, rank_of, words", [
    ("bad_slice", lambda w: 0, "prefetch plan slice bounds for tp.col are out of range (0..64)"),
    ("missing_tensor", lambda w: w - 1, "File does not contain tensor nope"),
    ("missing_sharded", lambda w: w - 1, "does not contain tensor nope"),
    ("file_missing", lambda w: 1, "absent.safetensors"),
    ("read_error", lambda w: w - 1, "Input/output error (injected)"),
    ("bad_chunk", lambda w: 1, "chunk_bytes must be a positive multiple of the page size"),
])
def test_an_error_on_one_rank_is_raised_on_every_rank(run, scenario, rank_of, words):
    world, ranks = run
    got = ranks[scenario]
    texts = {r["error"] for r in got if "error" in r}
    assert len(texts) == 1 and all("error" in r for r in got), got
    text = texts.pop()
    assert words in text
    assert f"rank {rank_of(world)} of {world}" in text
    assert all(r["error_type"] == "SafetensorError" for r in got)


@pytest.mark.parametrize("scenario, words", [("different_files", "different checkpoints"),
                                             ("chunk_mismatch", "different chunk sizes")])
def test_ranks_that_disagree_all_refuse(run, scenario, words):
    world, ranks = run
    texts = {r.get("error") for r in ranks[scenario]}
    assert len(texts) == 1, texts
    text = texts.pop()
    assert text is not None and words in text and f"rank {world - 1}" in text


# -- a rank that dies ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", [2, 4])
def test_a_rank_killed_mid_load_fails_the_others_in_bounded_time(ckpt, tmp_path, world):
    scenario = {"name": "killed", "path": str(ckpt["path"]), "chunk_bytes": 64 << 10,
                "fault": {"rank": 1, "at": 3, "kind": "kill"}}
    started = time.monotonic()
    ranks = spawn(tmp_path, world, [scenario], expect_exit={1: -9})
    for rank, results in enumerate(ranks.results):
        if rank == 1:
            assert results is None  # it died before writing anything
            continue
        got = results["killed"]
        assert "crash" not in got, got
        assert got["error_type"] == "SafetensorError"
        assert "a collective failed" in got["error"] and "process group cannot be used" in got["error"]
        assert got["seconds"] < PG_TIMEOUT + 10
    assert time.monotonic() - started < SPAWN_DEADLINE


SHORT_TIMEOUT = 5  # seconds: the process group's timeout where a rank stays alive but does not take part


@pytest.mark.parametrize("fault", ["absent", "stall"])
def test_a_rank_that_stops_taking_part_fails_the_others_after_the_group_timeout(ckpt, tmp_path, fault):
    """A rank that never calls the load, or whose read hangs mid-load: the others raise once the process
    group's timeout has passed (the stalled rank too, once its read returns)."""
    scenario = {"name": fault, "path": str(ckpt["path"]), "chunk_bytes": 64 << 10}
    if fault == "absent":
        scenario["absent"] = {"rank": 1, "seconds": SHORT_TIMEOUT + 3}
    else:
        scenario["fault"] = {"rank": 1, "at": 3, "kind": "stall", "seconds": SHORT_TIMEOUT + 3}
    ranks = spawn(tmp_path, 2, [scenario], pg_timeout=SHORT_TIMEOUT, deadline=90)
    got = ranks.results[0][fault]
    assert "crash" not in got, got
    assert got["error_type"] == "SafetensorError" and "a collective failed on rank 0 of 2" in got["error"], got
    assert SHORT_TIMEOUT - 1 <= got["seconds"] < SHORT_TIMEOUT + 10, got
    if fault == "stall":
        stalled = ranks.results[1][fault]
        assert stalled.get("error_type") == "SafetensorError", stalled


# -- the schedule (no processes) -------------------------------------------------------------------------------

def test_schedule_covers_the_union_once_by_needers_page_aligned():
    needs = [[[(0, 100_000)], [(5, 9000)]], [[(50_000, 300_000)], []], [[], [(0, 10)]]]
    chunks = sdist.schedule(needs, [120, 4000], 16384)
    covered = {0: [], 1: []}
    for c in chunks:
        assert c.owner in c.needers
        for r in range(3):
            inside = any(b <= c.begin and c.end <= e for b, e in needs[r][c.file])
            assert (r in c.needers) == inside
        covered[c.file].append((c.begin, c.end))
        base = [120, 4000][c.file]
        assert (base + c.end) % 16384 == 0 or any(c.end in (b, e) for r in needs for b, e in r[c.file])
    assert sorted(covered[0]) == covered[0] and covered[0][0][0] == 0 and covered[0][-1][1] == 300_000
    assert all(a[1] == b[0] for a, b in zip(covered[0], covered[0][1:]))
    assert covered[1][0] == (0, 5) and covered[1][-1][1] == 9000


def test_schedule_spreads_a_replicated_load_evenly():
    world, size = 4, 10 * (1 << 20) + 12345
    chunks = sdist.schedule([[[(0, size)]]] * world, [4096], 1 << 20)
    per = [sum(c.end - c.begin for c in chunks if c.owner == r) for r in range(world)]
    assert sum(per) == size and max(per) - min(per) <= 1.5 * (1 << 20)  # one chunk, a tail joined


def test_schedule_gives_large_tensors_chunks_of_their_own_and_groups_small_ones():
    chunk = 1 << 16
    sizes = [100, 200, 3 * chunk + 5, 50, chunk // 4, 70, 80] + [chunk // 8] * 20
    bounds, pos = [], 0
    for n in sizes:
        bounds.append((pos, pos + n))
        pos += n
    chunks = sdist.schedule([[[(0, pos)]], [[(0, pos)]]], [8], chunk, [[x for b in bounds for x in b]])
    assert [(c.begin, c.end) for c in chunks][0] == (0, 300)  # the two small ones share a chunk
    for c in chunks:
        assert c.end - c.begin < 1.5 * chunk  # a sliver of a large tensor joins its neighbour
        inside = [b for b in bounds if b[0] < c.end and c.begin < b[1]]
        if len(inside) > 1:  # a shared chunk holds small tensors only, whole, up to one chunk
            assert c.end - c.begin <= chunk
            assert all(e - b < chunk // 4 and c.begin <= b and e <= c.end for b, e in inside), (c, inside)
    assert sum(c.end - c.begin for c in chunks) == pos
    assert {c.owner for c in chunks} == {0, 1}


@pytest.mark.parametrize("backend, target, moves_on", [
    ("gloo", "cpu", "cpu"),
    ("gloo", "cuda:1", "cpu"),  # gloo moves CPU tensors; they are copied to the device at the end
    ("nccl", "cuda:1", "cuda:1"),
    ("hccl", "privateuseone:0", "privateuseone:0"),  # npu, once torch_npu has renamed PrivateUse1
    ("cpu:gloo,cuda:nccl", "cuda:0", "cuda:0"),
    ("cpu:gloo,cuda:nccl", "cpu", "cpu"),
    ("nccl", "cpu", None),
    ("gloo", "meta", "meta"),
])
def test_bytes_travel_on_the_destination_device_unless_the_backend_is_a_cpu_one(backend, target, moves_on):
    grp = object.__new__(_group.Group)
    grp.backend = backend
    if moves_on is None:
        with pytest.raises(sdist.SafetensorError, match="cannot move tensors for device cpu"):
            grp.comm_device(torch.device(target))
    else:
        assert grp.comm_device(torch.device(target)) == torch.device(moves_on)


def test_outside_a_process_group_it_says_what_to_do(ckpt):
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(sdist.SafetensorError, match="init_process_group"):
        sdist.load_file(ckpt["path"])


# -- two hosts: two network namespaces joined by a veth pair ---------------------------------------------------

NETNS = [f"st-dist-{os.getpid()}-a", f"st-dist-{os.getpid()}-b"]
VETH = [f"stv{os.getpid() % 100000}a", f"stv{os.getpid() % 100000}b"]
ADDRS = ["10.200.0.1", "10.200.0.2"]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    made = []
    try:
        for ns in NETNS:
            r = _ip("netns", "add", ns)
            if r.returncode:
                pytest.skip(f"cannot create a network namespace here: {r.stderr.strip()}")
            made.append(ns)
        steps = [("link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])]
        for ns, veth in zip(NETNS, VETH):
            steps.append(("link", "set", veth, "netns", ns))
        for ns, veth, addr in zip(NETNS, VETH, ADDRS):
            steps += [("-n", ns, "addr", "add", f"{addr}/24", "dev", veth), ("-n", ns, "link", "set", veth, "up"),
                      ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            r = _ip(*step)
            if r.returncode:
                pytest.skip(f"cannot set up the veth pair (ip {' '.join(step)}): {r.stderr.strip()}")
        ping = subprocess.run(["ip", "netns", "exec", NETNS[0], sys.executable, "-c",
                               "import socket; s = socket.create_connection(('10.200.0.2', 9), 5)"],
                              capture_output=True, text=True, timeout=30)
        if "Network is unreachable" in ping.stderr or "timed out" in ping.stderr:
            pytest.skip(f"the veth pair does not carry traffic: {ping.stderr.strip()[-200:]}")
        yield
    finally:
        for ns in made:  # deleting a namespace deletes the veth end inside it, and so the pair
            _ip("netns", "del", ns)


def test_two_hosts_over_a_veth_pair(two_hosts, ckpt, tmp_path):
    world = 2
    path = str(ckpt["path"])
    copies = [str(ckpt["root"] / f"copy{r}.safetensors") for r in range(world)]
    plans = [tp_plan(r, world) for r in range(world)]
    missing = [dict(p) for p in plans]
    missing[1]["nope"] = None
    scenarios = [
        {"name": "replicated", "path": {"per_rank": copies}, "chunk_bytes": CHUNK},
        {"name": "planned", "path": path, "chunk_bytes": CHUNK, "plan": {"per_rank": plans}},
        {"name": "missing_tensor", "path": path, "plan": {"per_rank": missing}},
        {"name": "read_error", "path": path, "chunk_bytes": CHUNK, "fault": {"rank": 0, "at": 2, "kind": "raise"}},
    ]
    env = [{"MASTER_ADDR": ADDRS[0], "MASTER_PORT": "29517", "GLOO_SOCKET_IFNAME": VETH[r]} for r in range(world)]
    prefix = [["ip", "netns", "exec", NETNS[r]] for r in range(world)]
    ranks = spawn(tmp_path, world, scenarios, prefix=prefix, env=env, store=False)
    data_bytes = os.path.getsize(path) - safe_open(path, "pt")._open().file.data_offset
    got = ranks["replicated"]
    for result in got:
        assert result["tensors"] == ckpt["expected"]
        assert abs(result["stats"]["bytes_read"] - data_bytes / world) <= 1.5 * CHUNK
        assert result["stats"]["bytes_received"] == data_bytes - result["stats"]["bytes_read"]
    want = planned_bytes(ckpt["path"], plans)
    for rank, result in enumerate(ranks["planned"]):
        assert result["tensors"] == want["per_rank"][rank]
    assert sum(r["stats"]["bytes_read"] for r in ranks["planned"]) == want["union"]
    for scenario, words in (("missing_tensor", "rank 1 of 2"), ("read_error", "rank 0 of 2")):
        texts = {r.get("error") for r in ranks[scenario]}
        assert len(texts) == 1 and words in next(iter(texts)), texts


# -- remote checkpoints ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", [2, 4])
def test_a_remote_checkpoint_is_fetched_about_once_by_the_group(ckpt, tmp_path, world):
    """Every rank loads the same http:// URL (a Range server in this process): each gets load_file's tensors,
    and the group fetches each byte about once (each rank's share, plus the first 16 KiB every rank's open
    fetches), told apart on the server by a header each rank sends."""
    from remote.range_server import RangeServer

    size = os.path.getsize(ckpt["path"])
    head = 16 << 10
    with RangeServer() as server:
        server.put("/model.safetensors", ckpt["path"])
        index = json.loads((ckpt["sharded"] / "model.safetensors.index.json").read_text())
        server.put("/sharded/model.safetensors.index.json", json.dumps(index).encode())
        for shard in sorted(set(index["weight_map"].values())):
            server.put(f"/sharded/{shard}", ckpt["sharded"] / shard)
        options = {"per_rank": [{"header_request_bytes": head, "headers": {"X-Rank": str(r)}} for r in range(world)]}
        ranks = spawn(tmp_path, world, [
            {"name": "remote", "path": server.url("/model.safetensors"), "chunk_bytes": CHUNK,
             "storage_options": options},
            {"name": "remote_index", "path": server.url("/sharded/model.safetensors.index.json"), "sharded": True,
             "chunk_bytes": CHUNK, "storage_options": options},
        ])
        by_rank = [0] * world
        for record in server.requests_for("/model.safetensors"):
            by_rank[int(record.header("X-Rank"))] += record.body_bytes
    for result in ranks["remote"]:
        assert "error" not in result, result
        assert result["tensors"] == ckpt["expected"]
    for result in ranks["remote_index"]:
        assert "error" not in result, result
        assert result["tensors"] == ckpt["expected"]
    assert sum(by_rank) <= size + (world - 1) * head, by_rank
    for rank, fetched in enumerate(by_rank):
        assert fetched <= head + size / world + 2 * CHUNK, (rank, by_rank)
