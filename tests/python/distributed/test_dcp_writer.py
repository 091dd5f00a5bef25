"""safetensors.dcp.HuggingFaceStorageWriter under dcp.save across gloo ranks, and consolidation (the Python
function and ``safetensors consolidate``) of torch's writer's sharded output: every file equals save_file of
its full tensors with {"format": "pt"}; torch's reader loads what our writer wrote."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

import safetensors.torch as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the workers beside this file
import save_worker  # noqa: E402
from test_distributed_save import files_of, spawn  # noqa: E402


def dcp_entries(mesh_ndim: int, world: int):
    """The worker's state dict as its dcp scenario saves it (dtypes torch's HF reader cannot take left out)."""
    return [e for e in save_worker.entries(mesh_ndim, world)
            if not any(k in e[0] for k in save_worker.DCP_LEFT_OUT)]


def expected(full: Dict[str, Any], mapping: Optional[Dict[str, int]]) -> Dict[str, bytes]:
    """save_file of each output file's full tensors, named as torch names them, and the index's weight map."""
    largest = max(mapping.values()) if mapping else 1
    groups: Dict[str, Dict[str, Any]] = {}
    for name, tensor in full.items():
        index = mapping[name] if mapping else 1
        groups.setdefault(f"model-{index:05d}-of-{largest:05d}.safetensors", {})[name] = tensor
    return {name: st.save(tensors, metadata={"format": "pt"}) for name, tensors in groups.items()}


def check_outputs(directory: Path, full: Dict[str, Any], mapping: Optional[Dict[str, int]]) -> None:
    got = files_of(directory)
    index = json.loads(got.pop("model.safetensors.index.json"))
    assert got == expected(full, mapping)
    assert index["weight_map"] == {n: f for f, t in _groups(full, mapping).items() for n in t}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in full.values())


def _groups(full, mapping):
    largest = max(mapping.values()) if mapping else 1
    out: Dict[str, list] = {}
    for name in full:
        out.setdefault(f"model-{(mapping[name] if mapping else 1):05d}-of-{largest:05d}.safetensors", []).append(name)
    return out


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dcp2")
    spec = dcp_entries(1, 2)
    mapping = {name: 1 + i % 2 for i, (name, *_) in enumerate(spec)}
    scenarios = [
        {"kind": "dcp", "dir": str(tmp / "mapped"), "mapping": mapping},
        {"kind": "dcp", "dir": str(tmp / "one"), "consolidate": True},
        {"kind": "dcp", "dir": str(tmp / "torch_sharded"), "torch_writer": True},
    ]
    return tmp, spec, mapping, spawn(tmp, [2], scenarios)


def test_dcp_save_writes_the_full_files_and_torch_reads_them(world2):
    tmp, spec, mapping, results = world2
    assert results[0] == [{"ok": {"mismatched": []}}] * 2, results[0]
    check_outputs(tmp / "mapped", save_worker.full_state_dict(spec, 0), mapping)


def test_with_consolidation_the_full_files_are_the_only_output(world2):
    tmp, spec, _, results = world2
    assert results[1] == [{"ok": {"mismatched": []}}] * 2, results[1]
    assert not (tmp / "one" / "sharded").exists()
    check_outputs(tmp / "one", save_worker.full_state_dict(spec, 0), None)


def test_package_reader_reads_what_the_writer_wrote(world2):
    tmp, spec, _, _ = world2
    full = save_worker.full_state_dict(spec, 0)
    got = st.load_file(tmp / "one" / "model-00001-of-00001.safetensors")
    assert got.keys() == full.keys()
    assert all(torch.equal(got[k].reshape(-1).view(torch.uint8), full[k].reshape(-1).view(torch.uint8))
               for k in full)


def test_consolidate_torch_sharded_output(world2, tmp_path):
    from safetensors.dcp import consolidate

    tmp, spec, mapping, results = world2
    assert results[2] == [{"ok": {}}] * 2, results[2]
    full = save_worker.full_state_dict(spec, 0)
    assert consolidate(tmp / "torch_sharded", tmp_path / "small", mapping, buffer_bytes=16) == sorted(
        expected(full, mapping))
    check_outputs(tmp_path / "small", full, mapping)


def test_consolidate_cli(world2, tmp_path, capsys):
    from safetensors._cli import main

    tmp, spec, _, _ = world2
    assert main(["consolidate", str(tmp / "torch_sharded"), str(tmp_path / "cli")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli" / "model-00001-of-00001.safetensors")
    check_outputs(tmp_path / "cli", save_worker.full_state_dict(spec, 0), None)
    assert main(["consolidate", str(tmp / "mapped"), str(tmp_path / "bad")]) == 2
    assert "DCP_SHARDING_INFO" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists() or files_of(tmp_path / "bad") == {}


def test_slabs_cover_a_box_in_order():
    from safetensors.dcp._consolidate import slabs

    for shape, limit in [((3, 4, 5), 8), ((3, 4, 5), 40), ((2, 3), 1000), ((), 4), ((4,), 4), ((0, 3), 8)]:
        seen = bytearray()
        for at, box in slabs(shape, 4, limit):
            size = 4
            for a, b in box:
                size *= b - a
            assert size <= max(limit, 4)
            assert at == len(seen)
            seen += b"x" * size
        n = 4
        for s in shape:
            n *= s
        assert len(seen) == n
