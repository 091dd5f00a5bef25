"""safetensors.dcp.HuggingFaceStorageReader: a drop-in for torch.distributed.checkpoint's reader.

Ranks are spawned processes (tests/python/distributed/dcp_worker.py) joined through a TCPStore this process
hosts, world 2 (a mesh of 2) and world 4 (a 2x2 mesh); one spawn per world runs every scenario. Each scenario
loads a checkpoint into DTensor state dicts (Shard on every dimension, Replicate, uneven splits, 1-D to 3-D,
0-d and empty tensors, plain and non-contiguous plain tensors, seven dtypes, a bf16 file into f32) with
``dcp.load`` through our reader and through torch's: both must give, byte for byte, what ``load_file`` cut with
``compute_local_shape_and_global_offset`` gives, and the readers' metadata must be equal. Checkpoints: one
file, several files with an index (huggingface_hub's split), per-rank shard files that torch's
``HuggingFaceStorageWriter(save_distributed=True)`` writes (DCP_SHARDING_INFO), and the several files served
over http:// (a Range server in this process) to the ranks. One process (``dcp.load(no_dist=True)``): s3://
(SeaweedFS, where its fixture does not skip), the destinations that take the bytes with no temporary, the
constructor's parameters, URLs as paths, errors. Every process has a deadline: a hang fails the test.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from safetensors.torch import save_file

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.distributed.checkpoint as dcp  # noqa: E402

from remote.range_server import RangeServer  # noqa: E402
from remote.seaweed import seaweed_s3_fixture  # noqa: E402
from safetensors.dcp import HuggingFaceStorageReader  # noqa: E402
from safetensors.dcp import _reader  # noqa: E402
from safetensors import _safetensors_cpp as _cpp  # noqa: E402
from test_distributed import spawn as spawn_ranks  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem  # noqa: E402

WORKER = Path(__file__).parent / "dcp_worker.py"
PG_TIMEOUT = 30  # seconds: every collective of the workers
SPAWN_DEADLINE = 120  # seconds: a whole spawn

seaweed_s3 = seaweed_s3_fixture()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


# -- the checkpoints -------------------------------------------------------------------------------------------

def full_state() -> Dict[str, torch.Tensor]:
    """Small tensors of f32, f64, f16, bf16, i64, u8 and bool; shapes that split unevenly over 2 and 2x2."""
    g = torch.Generator().manual_seed(7)
    return {
        "w2d": torch.randn(7, 5, generator=g),
        "w3d": torch.randn(3, 5, 6, generator=g).half(),
        "v1d": torch.randn(9, generator=g).double(),
        "ids": torch.randint(-(1 << 40), 1 << 40, (5, 3), generator=g),
        "bytes": torch.randint(0, 256, (6, 10), generator=g).to(torch.uint8),
        "mask": torch.randint(0, 2, (5, 4), generator=g).bool(),
        "bf": torch.randn(6, 7, generator=g).bfloat16(),  # loaded into f32 destinations
        "bf_keep": torch.randn(5, 8, generator=g).bfloat16(),
        "half": torch.randn(2, 3, 5, generator=g).half(),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "plain": torch.randn(3, 3, generator=g),
        "nc": torch.randn(4, 5, generator=g),  # loaded into a transposed (non-contiguous) destination
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Dict[str, Path]:
    split_torch_state_dict_into_shards = pytest.importorskip("huggingface_hub").split_torch_state_dict_into_shards

    root = tmp_path_factory.mktemp("dcp")
    state = full_state()
    (root / "single").mkdir()
    save_file(state, root / "single" / "model.safetensors")
    multi = root / "multi"
    multi.mkdir()
    split = split_torch_state_dict_into_shards(state, max_shard_size=300)
    assert split.is_sharded and len(split.filename_to_tensors) >= 3
    for filename, names in split.filename_to_tensors.items():
        save_file({n: state[n] for n in names}, multi / filename)
    (multi / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": split.metadata, "weight_map": split.tensor_to_filename}, indent=2))
    return {"root": root, "single": root / "single", "multi": multi}


# -- spawning ranks --------------------------------------------------------------------------------------------

def spawn(tmp: Path, world: int, spec: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Runs ``world`` workers over ``spec`` (test_distributed's spawn); each rank's results, {} where none."""
    ranks = spawn_ranks(tmp, world, spec.pop("scenarios", []), worker=WORKER, deadline=SPAWN_DEADLINE,
                        pg_timeout=PG_TIMEOUT, spec_extra=spec)
    return [r or {} for r in ranks.results]


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def ranks(request, checkpoints, tmp_path_factory) -> Dict[str, Any]:
    """Every scenario on ``world`` ranks: {scenario: [each rank's result]}."""
    world = request.param
    tmp = tmp_path_factory.mktemp(f"world{world}")
    cast = {"bf": "float32"}
    scenarios: List[Dict[str, Any]] = [
        {"name": "single", "path": str(checkpoints["single"]), "load": "a", "cast": cast},
        {"name": "multi", "path": str(checkpoints["multi"]), "load": "b", "cast": cast, "threads": 4},
        {"name": "sharded_by_torch", "path": str(tmp / "by_torch"), "save": "a", "load": "b", "cast": cast},
    ]
    with RangeServer() as server:
        for file in checkpoints["multi"].iterdir():
            server.put(f"/multi/{file.name}", file)
        scenarios.append({"name": "http", "path": server.url("/multi"), "load": "a", "cast": cast, "torch": False})
        results = spawn(tmp, world, {"full": str(checkpoints["single"] / "model.safetensors"),
                                     "scenarios": scenarios})
    out: Dict[str, Any] = {}
    for scenario in scenarios:
        name = scenario["name"]
        got = []
        for rank, result in enumerate(results):
            assert name in result, f"rank {rank} has no result for {name}"
            assert "crash" not in result[name], f"rank {rank} crashed in {name}:\n{result[name]['crash']}"
            got.append(result[name])
        out[name] = got
    return out


# -- loads through dcp.load ------------------------------------------------------------------------------------

def _same(got: Dict[str, Any], want: Dict[str, Any], what: str) -> None:
    wrong = {name: (got.get(name), digest) for name, digest in want.items() if got.get(name) != digest}
    assert not wrong and set(got) == set(want), f"{what}: {wrong}"


@pytest.mark.parametrize("scenario", ["single", "multi", "sharded_by_torch"])
def test_every_rank_gets_the_bytes_torchs_reader_gets_and_load_file_says(ranks, scenario):
    for rank, result in enumerate(ranks[scenario]):
        _same(result["ours"], result["expected"], f"rank {rank}: ours vs load_file")
        _same(result["torch"], result["expected"], f"rank {rank}: torch's vs load_file")
        assert result["expected"]["bf"][0] == "torch.float32"  # the bf16 file was cast


@pytest.mark.parametrize("scenario", ["single", "multi", "sharded_by_torch"])
def test_metadata_equals_torchs(ranks, scenario):
    metadata = ranks[scenario][0]["metadata"]
    assert metadata["state_dict_metadata"] and metadata["storage_data"], metadata


def test_per_rank_shard_files_give_several_chunks_per_tensor(ranks):
    chunks = ranks["sharded_by_torch"][0]["metadata"]["chunks"]
    assert chunks["w2d"] > 1 and chunks["w3d"] > 1, chunks


def test_a_remote_directory_is_read_through_its_index(ranks):
    for rank, result in enumerate(ranks["http"]):
        _same(result["ours"], result["expected"], f"rank {rank}: ours over http vs load_file")


# -- one process -----------------------------------------------------------------------------------------------

def test_the_constructor_keeps_torchs_parameters_and_adds_storage_options():
    theirs = inspect.signature(dcp.HuggingFaceStorageReader.__init__).parameters
    ours = inspect.signature(HuggingFaceStorageReader.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    assert all(ours[n].default == theirs[n].default for n in theirs)
    assert ours["storage_options"].kind is inspect.Parameter.KEYWORD_ONLY
    assert issubclass(HuggingFaceStorageReader, dcp.HuggingFaceStorageReader)


def test_remote_paths_stay_urls():
    reader = HuggingFaceStorageReader("s3://bucket/dir")
    assert reader.checkpoint_id == "s3://bucket/dir"
    reader.reset("https://host/dir")
    assert reader.checkpoint_id == "https://host/dir"
    assert HuggingFaceStorageReader.validate_checkpoint_id("s3://bucket/dir")


def test_a_remote_directory_without_index_or_model_file_is_named_in_the_error():
    with RangeServer() as server:
        with pytest.raises(FileNotFoundError, match="neither model.safetensors.index.json nor model.safetensors"):
            HuggingFaceStorageReader(server.url("/nothing")).read_metadata()


def test_contiguous_cpu_destinations_of_the_files_dtype_take_the_bytes_directly(checkpoints, monkeypatch):
    """No temporary where the destination can take the bytes; a temporary and copy_ for a cast or a
    non-contiguous destination (single process: dcp.load without a process group)."""
    state = full_state()
    temporaries: List[Any] = []
    real_empty = _reader.empty

    def counting_empty(code: str, shape: Any, device: Any) -> torch.Tensor:
        temporaries.append(code)
        return real_empty(code, shape, device)

    monkeypatch.setattr(_reader, "empty", counting_empty)
    direct = {n: torch.empty_like(state[n]) for n in ("w2d", "ids", "mask", "scalar", "empty")}
    dcp.load(direct, storage_reader=HuggingFaceStorageReader(str(checkpoints["single"])), no_dist=True)
    assert temporaries == []
    for name, tensor in direct.items():
        assert torch.equal(tensor, state[name]), name
    cast = {"bf": torch.empty(6, 7), "nc": torch.empty(5, 4).t()}
    dcp.load(cast, storage_reader=HuggingFaceStorageReader(str(checkpoints["single"]), thread_count=3),
             no_dist=True)
    assert sorted(temporaries) == ["BF16", "F32"]
    assert torch.equal(cast["bf"], state["bf"].float()) and torch.equal(cast["nc"], state["nc"])


def test_a_destination_of_another_shape_fails_with_torchs_text(checkpoints):
    file = _cpp.File(str(checkpoints["single"] / "model.safetensors"), _reader.BACKEND)
    item = ReadItem(type=LoadItemType.TENSOR, dest_index=MetadataIndex("w2d"), dest_offsets=torch.Size([0, 0]),
                    storage_index=MetadataIndex("w2d", [0, 0]), storage_offsets=torch.Size([0, 0]),
                    lengths=torch.Size([7, 5]))
    with pytest.raises(AssertionError, match=r"mismatch sizes torch.Size\(\[5, 7\]\) vs torch.Size\(\[7, 5\]\)"):
        _reader.read_item(file, item, torch.empty(5, 7))


def test_an_s3_directory_is_read_through_its_index(checkpoints, seaweed_s3):
    """One process (dcp.load without a process group; the spawns cover http:// on 2 and 4 ranks): every tensor
    whole, the bf16 one cast to f32, as load_file reads the local files."""
    bucket = seaweed_s3.new_bucket("dcp")
    for file in checkpoints["multi"].iterdir():
        seaweed_s3.put_file(bucket, f"multi/{file.name}", file)
    options = {"endpoint_url": seaweed_s3.endpoint, "aws_access_key_id": seaweed_s3.access_key,
               "aws_secret_access_key": seaweed_s3.secret_key, "region": seaweed_s3.region}
    state = full_state()
    loaded = {name: torch.full_like(t, 1) if name != "bf" else torch.ones(t.shape) for name, t in state.items()}
    reader = HuggingFaceStorageReader(f"s3://{bucket}/multi", thread_count=2, storage_options=options)
    dcp.load(loaded, storage_reader=reader, no_dist=True)
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor.to(loaded[name].dtype)), name
    metadata = HuggingFaceStorageReader(f"s3://{bucket}/multi", storage_options=options).read_metadata()
    local = dcp.HuggingFaceStorageReader(str(checkpoints["multi"])).read_metadata()
    assert metadata.state_dict_metadata == local.state_dict_metadata
    assert {k: os.path.basename(v.relative_path) for k, v in metadata.storage_data.items()} == \
        {k: os.path.basename(v.relative_path) for k, v in local.storage_data.items()}
