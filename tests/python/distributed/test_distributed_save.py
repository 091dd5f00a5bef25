"""safetensors.distributed.save_state_dict across gloo ranks (world 2 on a 1-D mesh, world 4 on a 2x2 mesh):
the files equal save_file of the full tensors split as huggingface_hub splits them, byte for byte; errors and
a killed rank leave the previous checkpoint as it was. One spawn per world runs every scenario."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch without distributed", allow_module_level=True)

import safetensors.torch as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the workers beside this file
import save_worker  # noqa: E402
from test_distributed import spawn as spawn_ranks  # noqa: E402

WORKER = Path(save_worker.__file__)
PG_TIMEOUT = 20.0  # bounds every collective: a bug fails the test instead of hanging CI
DEADLINE = 150.0
MULTI = 600


def spawn(tmp: Path, mesh: List[int], scenarios: List[Dict[str, Any]],
          expect_exit: Optional[Dict[int, int]] = None) -> List[List[Dict[str, Any]]]:
    """Runs one worker per rank over ``scenarios`` (test_distributed's spawn); returns
    ``results[scenario][rank]`` (None: no result)."""
    world = 1
    for m in mesh:
        world *= m
    spawn_ranks(tmp, world, scenarios, worker=WORKER, deadline=DEADLINE, pg_timeout=PG_TIMEOUT,
                expect_exit=expect_exit, spec_extra={"mesh": mesh})
    out = tmp / "out"
    results = []
    for i in range(len(scenarios)):
        row = []
        for r in range(world):
            path = out / f"{i}.{r}.json"
            row.append(json.loads(path.read_text()) if path.exists() else None)
        results.append(row)
    return results


def expected_files(full: Dict[str, Any], max_shard_size: Any, metadata: Optional[Dict[str, str]] = None,
                   ) -> Dict[str, bytes]:
    """What a user publishing ``full`` writes: huggingface_hub's split, each file save_file'd with
    ``{"format": "pt", **metadata}``, and transformers' index when there are several."""
    split_torch_state_dict_into_shards = pytest.importorskip("huggingface_hub").split_torch_state_dict_into_shards

    split = split_torch_state_dict_into_shards(full, max_shard_size=max_shard_size)
    md = {"format": "pt", **(metadata or {})}
    out = {name: st.save({t: full[t] for t in tensors}, metadata=md)
           for name, tensors in split.filename_to_tensors.items()}
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        out["model.safetensors.index.json"] = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
    return out


def files_of(directory: Path) -> Dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def one_error(row: List[Optional[Dict[str, Any]]], ranks: Optional[List[int]] = None) -> str:
    """The error every rank of ``ranks`` raised; asserts they raised the same text."""
    got = [row[r] for r in (ranks if ranks is not None else range(len(row)))]
    assert all(g is not None and "error" in g for g in got), got
    texts = {g["error"] for g in got}
    assert len(texts) == 1, texts
    return texts.pop()


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("save2")
    scenarios = [
        {"kind": "save", "dir": str(tmp / "single"), "max": "5GB", "metadata": {"who": "test"}},
        {"kind": "save", "dir": str(tmp / "multi"), "max": MULTI},
        {"kind": "disagree", "dir": str(tmp / "disagree")},
        {"kind": "save", "dir": str(tmp / "notshared" / "{rank}"), "max": "5GB"},
        {"kind": "fail", "dir": str(tmp / "multi"), "max": MULTI, "seed": 1, "rank": 1},
        {"kind": "die", "dir": str(tmp / "multi"), "max": MULTI, "seed": 2, "rank": 1, "last_collective": True},
    ]
    spec = save_worker.entries(1, 2)
    before = time.monotonic()
    results = spawn(tmp, [2], scenarios, expect_exit={1: 3})
    return tmp, spec, scenarios, results, time.monotonic() - before


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("save4")
    spec = save_worker.entries(2, 4)
    scenarios = [
        {"kind": "save", "dir": str(tmp / "single"), "max": "5GB"},
        {"kind": "save", "dir": str(tmp / "multi"), "max": MULTI, "metadata": {"a": "b"}},
        {"kind": "dcp", "dir": str(tmp / "dcp"), "mapping": {name: 1 + i % 3 for i, (name, *_) in enumerate(spec)}},
        # A save over an earlier save of another split: shards and index -> one file, and back.
        {"kind": "save", "dir": str(tmp / "to_single"), "max": MULTI},
        {"kind": "save", "dir": str(tmp / "to_single"), "max": "5GB"},
        {"kind": "save", "dir": str(tmp / "to_shards"), "max": "5GB"},
        {"kind": "save", "dir": str(tmp / "to_shards"), "max": MULTI},
    ]
    for name in ("to_single", "to_shards"):  # files that are not the checkpoint's stay
        (tmp / name).mkdir()
        for other in OTHERS:
            (tmp / name / other).write_bytes(other.encode())
    return tmp, spec, scenarios, spawn(tmp, [2, 2], scenarios)


#: Files beside a checkpoint that a save of ``model`` leaves alone: other stems, other shard counts' look-alikes.
OTHERS = ("notes.txt", "other-00001-of-00002.safetensors", "model-1-of-2.safetensors", "model.bin")


def test_single_file_is_save_file_of_the_full_state_dict(world2):
    tmp, spec, scenarios, results, _ = world2
    assert results[0] == [{"ok": {}}] * 2
    full = save_worker.full_state_dict(spec, 0)
    assert files_of(tmp / "single") == expected_files(full, "5GB", {"who": "test"})


def test_several_files_and_index_as_the_hub_splits_them(world2):
    tmp, spec, _, results, _ = world2
    assert results[1] == [{"ok": {}}] * 2
    want = expected_files(save_worker.full_state_dict(spec, 0), MULTI)
    assert len(want) > 3
    # scenarios 4 (a rank raised) and 5 (a rank died) saved other values here: the files are still these
    assert files_of(tmp / "multi") == want


def test_ranks_that_disagree_raise_the_same_error(world2):
    text = one_error(world2[3][2])
    assert "scalar" in text and "disagree" in text


def test_directory_not_shared_is_refused_on_every_rank(world2):
    tmp, _, scenarios, results, _ = world2
    for rank in range(2):
        assert "is not shared by the ranks" in results[3][rank]["error"]
        assert str(tmp / "notshared") in results[3][rank]["error"]
    assert files_of(tmp / "notshared" / "0") == {}  # marker and temporaries removed


def test_a_rank_that_raises_fails_every_rank_and_changes_nothing(world2):
    text = one_error(world2[3][4])
    assert "failed on rank 1 of 2" in text and "injected" in text


def test_a_rank_that_dies_fails_the_others_in_bounded_time(world2):
    tmp, _, _, results, elapsed = world2
    assert results[5][1] is None  # it died
    assert "collective failed" in results[5][0]["error"]
    assert elapsed < 120


def test_world4_on_a_2x2_mesh(world4):
    tmp, spec, scenarios, results = world4
    assert results[0] == [{"ok": {}}] * 4 and results[1] == [{"ok": {}}] * 4
    full = save_worker.full_state_dict(spec, 0)
    assert files_of(tmp / "single") == expected_files(full, "5GB")
    assert files_of(tmp / "multi") == expected_files(full, MULTI, {"a": "b"})
    # safetensors.dcp.HuggingFaceStorageWriter on the 2x2 mesh; torch's reader loaded it back on every rank
    assert results[2] == [{"ok": {"mismatched": []}}] * 4, results[2]
    mapping = scenarios[2]["mapping"]
    got = files_of(tmp / "dcp")
    del got["model.safetensors.index.json"]
    saved = {k: v for k, v in full.items() if not any(x in k for x in save_worker.DCP_LEFT_OUT)}
    assert got == {f"model-{i:05d}-of-00003.safetensors": st.save(
        {k: v for k, v in saved.items() if mapping[k] == i}, metadata={"format": "pt"}) for i in (1, 2, 3)}


def test_a_save_replaces_an_earlier_split_of_the_checkpoint(world4):
    tmp, spec, scenarios, results = world4
    assert results[3:7] == [[{"ok": {}}] * 4] * 4, results[3:7]
    full = save_worker.full_state_dict(spec, 0)
    others = {name: name.encode() for name in OTHERS}
    # the earlier shards and their index are gone: a reader finds only the new single file
    assert files_of(tmp / "to_single") == {**expected_files(full, "5GB"), **others}
    # the earlier model.safetensors is gone: transformers would load it before looking for an index
    assert files_of(tmp / "to_shards") == {**expected_files(full, MULTI), **others}

