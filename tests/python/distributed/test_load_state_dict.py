"""``safetensors.distributed.load_state_dict``: DTensor state dicts (1-D and 2-D meshes, every placement a file
can hold, uneven shards) and plain tensors, filled in place over gloo, checked bit for bit against the full
tensors of a single-process load cut with torch's own ``compute_local_shape_and_global_offset``; what each rank
reads; the errors every rank raises alike. Ranks are processes (distributed/state_dict_worker.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from remote.seaweed import seaweed_s3_fixture
from safetensors.torch import save_file
from test_distributed import spawn

WORKER = Path(__file__).parent / "state_dict_worker.py"
PAGE = 4096


def checkpoint_tensors() -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    return {
        "big": randn(64, 256),  # 64 KiB: many chunks of one page, boxes of many rows
        "uneven": randn(10, 6),  # 10 rows over 4 ranks: 3, 3, 3, 1 (torch.chunk)
        "tall": randn(5, 7, 3, dtype=torch.bfloat16),
        "half": randn(9, dtype=torch.float16),
        "wide": randn(4, 130, dtype=torch.float64),
        "ints": torch.randint(-2**40, 2**40, (6, 5), generator=g, dtype=torch.int64),
        "bytes": torch.randint(0, 256, (6, 12), generator=g, dtype=torch.uint8),
        "flags": torch.randint(0, 2, (3, 4), generator=g).bool(),
        "scalar": randn(()),
        "empty": randn(0, 4),
        "cast": randn(8, 16, dtype=torch.bfloat16),
    }


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Dict[str, Any]:
    root = tmp_path_factory.mktemp("sd_ckpt")
    tensors = checkpoint_tensors()
    single = root / "model.safetensors"
    save_file(tensors, str(single), metadata={"format": "pt"})
    sharded = root / "sharded"
    sharded.mkdir()
    names = sorted(tensors)
    groups = [names[0::3], names[1::3], names[2::3]]
    weight_map = {}
    for i, group in enumerate(groups, 1):
        fname = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(sharded / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in group})
    index = sharded / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    files = [str(p) for p in sorted(sharded.glob("*.safetensors"))]
    return {"root": root, "single": str(single), "index": str(index), "files": files, "tensors": tensors}


def layout(world: int, kind: str) -> Dict[str, Dict[str, Any]]:
    """Per tensor: placements on the mesh (one per mesh dimension) and the destination dtype."""
    t = checkpoint_tensors()
    out: Dict[str, Dict[str, Any]] = {}
    one_d = world == 2
    for name, tensor in t.items():
        nd = tensor.dim()
        if kind == "rows":  # FSDP2: Shard(0) everywhere
            p = ["S0"] if one_d else ["S0", "S0"]
        elif kind == "cols":  # a shard of the last dimension (tensor parallel, rowwise)
            p = [f"S{max(nd - 1, 0)}"] if one_d else ["R", f"S{max(nd - 1, 0)}"]
        elif kind == "mixed":  # 2-D: rows on one mesh dimension, columns on the other
            p = ["S1" if nd > 1 else "S0"] if one_d else ["S0", "S1" if nd > 1 else "S0"]
        elif kind == "replicated":
            p = ["R"] if one_d else ["R", "R"]
        else:
            p = "plain"
        if nd == 0 and p != "plain":
            p = ["R"] * (1 if one_d else 2)
        out[name] = {"placements": p, "dtype": "float32" if name == "cast" else None}
    if kind == "mixed":
        out["tall"]["placements"] = ["S2"] if one_d else ["S1", "S2"]  # a 3-D tensor's innermost dimension
    return out


def scenarios(c: Dict[str, Any], world: int) -> List[Dict[str, Any]]:
    mesh = [world] if world == 2 else [2, 2]
    base = {"mesh": mesh, "files": [c["single"]], "checkpoint": c["single"], "chunk_bytes": PAGE}
    out = []
    for kind in ["rows", "cols", "mixed", "replicated", "plain"]:
        out.append(dict(base, name=kind, tensors=layout(world, kind)))
    out.append(dict(base, name="index", tensors=layout(world, "mixed"), files=c["files"], checkpoint=c["index"]))
    out.append(dict(base, name="directory", tensors=layout(world, "cols"), files=c["files"],
                    checkpoint=str(Path(c["index"]).parent), backend="mmap", chunk_bytes=16 * PAGE))
    partial = layout(world, "rows")
    partial["big"]["placements"] = ["P"] if world == 2 else ["S0", "P"]
    out.append(dict(base, name="partial", tensors=partial))
    missing = layout(world, "rows")
    missing["absent"] = {"placements": ["R"] * len(mesh), "dtype": None, "shape": [2]}
    out.append(dict(base, name="missing", tensors=missing))
    out.append(dict(base, name="missing_not_strict", tensors=missing, strict=False))
    subset = {k: v for k, v in layout(world, "cols").items() if k in ("big", "cast")}
    out.append(dict(base, name="subset", tensors=subset))
    wrong = layout(world, "rows")
    wrong["uneven"]["shape"] = [10, 7]
    out.append(dict(base, name="wrong_shape", tensors=wrong))
    out.append(dict(base, name="npu", tensors=layout(world, "mixed"), device="npu"))
    plans = [{"big": [[0, 64], [64 * r, 64 * r + 64]], "uneven": [[2, 9], [1, 4]], "tall": [[0, 5], [r, r + 2]],
              "wide": [[1, 2], [0, 100]], "ints": [[1, 5]]} for r in range(world)]
    out.append(dict(base, name="box_plans", plans=plans))
    out.append(dict(base, name="box_plans_index", plans=plans, files=c["files"], checkpoint=c["index"],
                    sharded=True))
    out.append(dict(base, name="read_error", tensors=layout(world, "mixed"), fault={"rank": world - 1}))
    out.append(dict(base, name="after_error", tensors=layout(world, "mixed")))
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def run(request, ckpt, tmp_path_factory):
    world = request.param
    ranks = spawn(tmp_path_factory.mktemp(f"sd_world{world}"), world, scenarios(ckpt, world), worker=WORKER)
    return world, ranks


@pytest.mark.parametrize("scenario", ["rows", "cols", "mixed", "replicated", "plain", "index", "directory",
                                      "after_error", "npu"])
def test_every_rank_gets_exactly_its_piece_of_the_full_tensors(run, scenario):
    world, ranks = run
    for rank, got in enumerate(ranks[scenario]):
        assert "error" not in got, got["error"]
        bad = [name for name, ok in got["checks"].items() if not ok]
        assert not bad, f"rank {rank}: wrong values in {bad}"
        assert got["missing"] == [] and got["unexpected"] == []
        assert got["type"] == "IncompatibleKeys"
        # It returned with no tensor it gave the process group still held by gloo's threads.
        assert got["lent"] > 0 and got["held"] == 0, got


@pytest.mark.parametrize("scenario", ["rows", "cols", "mixed"])
def test_sharded_layouts_read_each_byte_once_per_group_and_each_rank_about_its_share(run, scenario):
    world, ranks = run
    results = ranks[scenario]
    scheduled = results[0]["stats"]["bytes_scheduled"]
    # Every byte the group needs is read once, by one rank.
    assert sum(r["stats"]["bytes_read"] for r in results) == scheduled
    for rank, r in enumerate(results):
        s = r["stats"]
        # Disjoint shards: a rank reads what it needs and nothing else (replicated 0-d scalars aside).
        assert s["bytes_read"] <= s["bytes_needed"] + PAGE, (rank, s)
        # What the kernel counted: the rank's reads plus the header (a page per file at most).
        assert r["rchar"] <= s["bytes_read"] + 64 * 1024, (rank, r["rchar"], s)


def test_replicated_tensors_are_read_once_per_group_and_shared(run):
    world, ranks = run
    results = ranks["replicated"]
    total = sum(t.numel() * t.element_size() for t in checkpoint_tensors().values())
    assert results[0]["stats"]["bytes_scheduled"] == total
    assert sum(r["stats"]["bytes_read"] for r in results) == total
    for r in results:
        assert r["stats"]["bytes_read"] <= total // world + 16 * 1024
        assert r["stats"]["bytes_received"] >= total - r["stats"]["bytes_read"]


def test_a_subset_of_the_checkpoint_reports_the_rest_as_unexpected(run):
    world, ranks = run
    for got in ranks["subset"]:
        assert all(got["checks"].values())
        assert got["missing"] == []
        assert sorted(got["unexpected"]) == sorted(set(checkpoint_tensors()) - {"big", "cast"})


@pytest.mark.parametrize("scenario, words", [
    ("partial", ["tensor big: placement", "cannot be loaded"]),
    ("missing", ["does not contain 1 tensor(s)", "absent", "strict=False"]),
    ("wrong_shape", ["tensor uneven has shape [10, 6]", "[10, 7] in the state dict"]),
    ("read_error", ["failed on rank", "Input/output error (injected)"]),
])
def test_errors_are_raised_on_every_rank_with_the_same_text(run, scenario, words):
    world, ranks = run
    texts = [got.get("error") for got in ranks[scenario]]
    assert all(texts) and len(set(texts)) == 1, texts
    for w in words:
        assert w in texts[0], texts[0]


@pytest.mark.parametrize("scenario", ["box_plans", "box_plans_index"])
def test_distributed_plans_take_boxes_of_the_leading_dimensions(run, scenario):
    world, ranks = run
    results = ranks[scenario]
    for rank, got in enumerate(results):
        assert got["checks"] and all(got["checks"].values()), (rank, got["checks"])
    # "uneven" is the same box on every rank: read once for the group.
    assert sum(r["stats"]["bytes_read"] for r in results) == results[0]["stats"]["bytes_scheduled"]


def test_not_strict_loads_the_rest_and_reports_the_missing_key(run):
    world, ranks = run
    for got in ranks["missing_not_strict"]:
        assert got["missing"] == ["absent"]
        assert all(ok for name, ok in got["checks"].items() if name != "absent")


# -- a checkpoint on the S3 test server ------------------------------------------------------------------------

seaweed_s3 = seaweed_s3_fixture()


def test_a_remote_sharded_checkpoint_on_s3_fills_the_state_dict(ckpt, seaweed_s3, tmp_path):
    bucket = seaweed_s3.new_bucket("sharded")
    for path in ckpt["files"] + [ckpt["index"]]:
        seaweed_s3.put_file(bucket, f"model/{Path(path).name}", path)
    options = {"endpoint_url": seaweed_s3.endpoint, "aws_access_key_id": seaweed_s3.access_key,
               "aws_secret_access_key": seaweed_s3.secret_key, "region": "us-east-1"}
    url = f"s3://{bucket}/model/model.safetensors.index.json"
    world = 2
    ranks = spawn(tmp_path, world, [
        {"name": "s3", "mesh": [world], "files": ckpt["files"], "checkpoint": url, "chunk_bytes": PAGE,
         "storage_options": options, "tensors": layout(world, "mixed")},
    ], worker=WORKER)
    for rank, got in enumerate(ranks["s3"]):
        assert "error" not in got, got["error"]
        assert all(got["checks"].values()), (rank, got["checks"])
        assert got["lent"] > 0 and got["held"] == 0, got
    results = ranks["s3"]
    assert sum(r["stats"]["bytes_read"] for r in results) == results[0]["stats"]["bytes_scheduled"]
