"""Sharded checkpoints through Python: the C++ implementation (sharded.h) bound as _safetensors_cpp.sharded.ShardIndex,
ShardedFile, plan_shards, write_index and save_sharded, and the CLI's convert built on it. Checkpoints are saved
through convert and through the binding, reopened through the binding and as transformers reads an index (the
JSON plus one safe_open per shard); the index text is byte for byte what transformers writes; an existing
index's mode bits survive; every index error names the index or the shard."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import safetensors.numpy as stnp
from safetensors import SafetensorError, safe_open
from safetensors import _safetensors_cpp as _cpp
from safetensors._cli import main
from safetensors._checkpoint_paths import IndexFormatError, read_index, resolve

INDEX = "model.safetensors.index.json"


def transformers_index_text(weight_map: Dict[str, str], total_size: int) -> str:
    """What transformers' save_pretrained writes (modeling_utils: json.dumps(index, indent=2, sort_keys=True) + "\\n")."""
    return json.dumps({"metadata": {"total_size": total_size}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n"


def arrays() -> Dict[str, np.ndarray]:
    # Insertion order is the split's order; non-ASCII and quoting names exercise the index's escapes.
    return {
        "embed.weight": np.arange(24, dtype=np.float32).reshape(4, 6),  # 96 bytes
        "layer.0.weight": np.full((4, 4), 2, np.float16),  # 32 bytes
        "caf\u00e9 \"q\" \U0001f600": np.arange(10, dtype=np.int64),  # 80 bytes
        "big": np.ones(64, np.float32),  # 256 bytes: over the limit, a shard of its own
        "lm_head.bias": np.zeros(3, np.int8),  # 3 bytes
    }


def specs(tensors: Dict[str, np.ndarray]) -> List[tuple]:
    codes = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64", np.dtype(np.int8): "I8"}
    return [(name, codes[a.dtype], list(a.shape), a.ctypes.data, a.nbytes) for name, a in tensors.items()]


def read_like_transformers(directory: Path) -> Dict[str, np.ndarray]:
    """Every tensor as transformers' sharded loading finds it: the index's weight_map, one safe_open per shard."""
    index = json.loads((directory / INDEX).read_text())
    out: Dict[str, np.ndarray] = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(directory / shard), "np") as f:
            for name in f.keys():
                if index["weight_map"].get(name) == shard:
                    out[name] = f.get_tensor(name)
    return out


def read_through_binding(index_path: Path) -> Dict[str, np.ndarray]:
    ckpt = _cpp.sharded.ShardedFile.open_index(str(index_path))
    out = {}
    for name, (code, shape, begin, end) in ckpt.infos():
        buf = bytearray(end - begin)
        ptr = np.frombuffer(buf, np.uint8).ctypes.data if buf else 0
        ckpt.read_into(name, ptr, len(buf))
        dtype = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I8": np.int8}[code]
        out[name] = np.frombuffer(bytes(buf), dtype).reshape(shape)
    return out


def assert_same(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# -- saving ------------------------------------------------------------------------------------------------

def test_save_through_the_binding_and_reopen_both_ways(tmp_path):
    tensors = arrays()
    plan = _cpp.sharded.save_sharded(str(tmp_path), specs(tensors), 128, "model", [("format", "pt")], True)
    names = [f"model-{i:05d}-of-00003.safetensors" for i in range(1, 4)]
    assert [s[0] for s in plan.shards] == names
    # huggingface_hub's split: the open shard closes when the next tensor overflows it; `big` is a shard of
    # its own where it is met, while the open shard stays open for `lm_head.bias`.
    assert [[list(tensors)[i] for i in s[1]] for s in plan.shards] == [
        ["embed.weight", "layer.0.weight"], ["big"], ["caf\u00e9 \"q\" \U0001f600", "lm_head.bias"]
    ]
    assert sorted(os.listdir(tmp_path)) == sorted(names + [INDEX])
    weight_map = {name: names[k] for k, s in enumerate(plan.shards) for name in (list(tensors)[i] for i in s[1])}
    total = sum(a.nbytes for a in tensors.values())
    assert plan.total_size == total
    assert (tmp_path / INDEX).read_text() == plan.index_json == transformers_index_text(weight_map, total)
    assert "\\u00e9" in plan.index_json and "\\ud83d\\ude00" in plan.index_json  # ensure_ascii, as json.dumps

    assert_same(read_like_transformers(tmp_path), tensors)
    assert_same(read_through_binding(tmp_path / INDEX), tensors)
    ckpt = _cpp.sharded.ShardedFile.open_index(str(tmp_path / INDEX))
    assert ckpt.index_path == str(tmp_path / INDEX)
    assert ckpt.total_size == total and ckpt.index_metadata == {"total_size": str(total)}
    assert [f.path for f in ckpt.shards] == [str(tmp_path / n) for n in names]
    assert all(f.metadata() == {"format": "pt"} for f in ckpt.shards)
    assert ckpt.shard_of("big") == 1 and "big" in ckpt and len(ckpt) == 5
    assert ckpt.keys() == sorted(tensors)


def test_read_many_and_open_files(tmp_path):
    tensors = arrays()
    _cpp.sharded.save_sharded(str(tmp_path), specs(tensors), 128)
    ckpt = _cpp.sharded.ShardedFile.open_index(str(tmp_path / INDEX))
    outs = {name: np.empty_like(a) for name, a in tensors.items()}
    ckpt.read_many([(name, o.ctypes.data, o.nbytes) for name, o in outs.items()], 4)
    assert_same(outs, tensors)
    files = sorted(str(p) for p in tmp_path.glob("model-*.safetensors"))
    assert sorted(_cpp.sharded.ShardedFile.open_files(files).keys()) == sorted(tensors)
    with pytest.raises(SafetensorError, match="is also in"):
        _cpp.sharded.ShardedFile.open_files([files[0], files[0]])


def test_save_through_cli_convert(tmp_path):
    torch = pytest.importorskip("torch")
    state = {name: torch.from_numpy(a.copy()) for name, a in arrays().items()}
    torch.save(state, tmp_path / "model.bin")
    out = tmp_path / "out"
    assert main(["convert", "-q", "--max-shard-size", "128B", str(tmp_path / "model.bin"), str(out / "model.safetensors")]) == 0
    index_text = (out / INDEX).read_text()
    index = json.loads(index_text)
    assert index_text == transformers_index_text(index["weight_map"], index["metadata"]["total_size"])
    hub = pytest.importorskip("huggingface_hub")
    assert hub.split_torch_state_dict_into_shards(state, max_shard_size=128).tensor_to_filename == index["weight_map"]
    expected = {name: t.numpy() for name, t in state.items()}
    assert_same(read_like_transformers(out), expected)
    assert_same(read_through_binding(out / INDEX), expected)
    for shard in _cpp.sharded.ShardedFile.open_index(str(out / INDEX)).shards:
        assert shard.metadata() == {"format": "pt"}


def test_empty_input_is_huggingface_hubs_split(tmp_path):
    plan = _cpp.sharded.plan_shards([], 10)
    assert plan.shards == [] and plan.total_size == 0
    hub = pytest.importorskip("huggingface_hub")
    split = hub.split_torch_state_dict_into_shards({})
    assert (split.is_sharded, split.filename_to_tensors, split.metadata) == (False, {}, {"total_size": 0})
    torch = pytest.importorskip("torch")
    torch.save({}, tmp_path / "empty.bin")
    # Not sharded, so one (empty) file, as save_pretrained writes for an unsharded split.
    assert main(["convert", "-q", "--max-shard-size", "1KB", str(tmp_path / "empty.bin"), str(tmp_path / "o") + "/"]) == 0
    assert os.listdir(tmp_path / "o") == ["model.safetensors"]
    assert stnp.load_file(str(tmp_path / "o" / "model.safetensors")) == {}


# -- the index file: mode bits, fsync, atomicity ---------------------------------------------------------

def test_mode_bits_of_an_existing_index_are_kept(tmp_path):
    tensors = arrays()
    index = tmp_path / INDEX
    index.write_text("old")
    os.chmod(index, 0o604)
    umask = os.umask(0o022)
    os.umask(umask)
    _cpp.sharded.save_sharded(str(tmp_path), specs(tensors), 128, fsync=True)
    assert stat.S_IMODE(os.stat(index).st_mode) == 0o604
    plan = _cpp.sharded.plan_shards([(n, a.nbytes) for n, a in tensors.items()], 100)
    os.chmod(index, 0o640)
    _cpp.sharded.write_index(str(tmp_path), plan, fsync=True)
    assert stat.S_IMODE(os.stat(index).st_mode) == 0o640
    assert index.read_text() == plan.index_json
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    # A new index gets 0666 minus the umask, and the process umask is left as it was.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    _cpp.sharded.write_index(str(fresh), plan)
    assert stat.S_IMODE(os.stat(fresh / INDEX).st_mode) == 0o666 & ~umask
    assert os.umask(umask) == umask


def test_cli_convert_force_keeps_the_index_mode(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({name: torch.from_numpy(a.copy()) for name, a in arrays().items()}, tmp_path / "m.bin")
    out = tmp_path / "out" / "model.safetensors"
    argv = ["convert", "-q", "--max-shard-size", "128B", str(tmp_path / "m.bin"), str(out)]
    assert main(argv) == 0
    os.chmod(out.parent / INDEX, 0o600)
    assert main(["convert", "-f"] + argv[1:]) == 0
    assert stat.S_IMODE(os.stat(out.parent / INDEX).st_mode) == 0o600


def test_write_index_into_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        _cpp.sharded.write_index(str(tmp_path / "nope"), _cpp.sharded.plan_shards([("a", 1)], 10))


# -- index errors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "invalid index: The JSON document has an improper structure"),
        ('[1]', "the index must be a JSON object"),
        ('{"weight_map": {"a": "s.safetensors", "a": "s.safetensors"}}', "duplicate key `a` in `weight_map`"),
        ('{"weight_map": {}, "weight_map": {}}', "duplicate key `weight_map`"),
        ('{"metadata": {"k": 1, "k": 2}, "weight_map": {}}', "duplicate key `k` in `metadata`"),
        ('{"metadata": {}}', "missing `weight_map`"),
        ('{"weight_map": []}', "`weight_map` must be an object"),
        ('{"weight_map": {"a": "../s.safetensors"}}', "not a relative path inside the index's directory"),
        ('{"weight_map": {"a": "x/../../s.safetensors"}}', "not a relative path inside the index's directory"),
        ('{"weight_map": {"a": "/etc/passwd"}}', "not a relative path inside the index's directory"),
        ('{"weight_map": {"a": ""}}', "not a relative path inside the index's directory"),
        ('{"weight_map": {"a": 1}}', "value for tensor `a` must be a string"),
        ('{"metadata": 3, "weight_map": {}}', "`metadata` must be an object"),
    ],
)
def test_index_errors_name_the_index(tmp_path, content, message):
    index = tmp_path / INDEX
    index.write_text(content)
    for call in (lambda: _cpp.sharded.ShardIndex.read(str(index)), lambda: _cpp.sharded.ShardedFile.open_index(str(index))):
        with pytest.raises(SafetensorError) as e:
            call()
        assert message in str(e.value) and f'in "{index}"' in str(e.value) and "InvalidArgument" in str(e.value)
    with pytest.raises(IndexFormatError, match=str(index)):
        read_index(str(index))


def test_a_shard_missing_a_tensor_names_the_shard_and_the_tensor(tmp_path):
    stnp.save_file({"a": np.zeros(2, np.float32), "stale": np.zeros(1, np.int8)}, str(tmp_path / "s1.safetensors"))
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}}))
    with pytest.raises(SafetensorError) as e:
        _cpp.sharded.ShardedFile.open_index(str(tmp_path / INDEX))
    assert str(e.value) == f'File does not contain tensor ghost (TensorNotFound) in "{tmp_path / "s1.safetensors"}"'
    index = _cpp.sharded.ShardIndex.read(str(tmp_path / INDEX))
    shard = _cpp.File(str(tmp_path / "s1.safetensors"))
    with pytest.raises(SafetensorError, match="ghost"):
        index.select(shard, 0)
    # Without ghost the shard opens, and `stale` (held but not assigned) stays hidden.
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"a": "s1.safetensors"}}))
    assert _cpp.sharded.ShardedFile.open_index(str(tmp_path / INDEX)).keys() == ["a"]
    assert _cpp.sharded.ShardIndex.read(str(tmp_path / INDEX)).select(shard, 0) == ["a"]
    # A shard that does not exist: FileNotFoundError naming it.
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="gone.safetensors"):
        _cpp.sharded.ShardedFile.open_index(str(tmp_path / INDEX))


def test_shard_index_fields_and_resolve(tmp_path):
    (tmp_path / INDEX).write_text(
        '{"metadata": {"total_size": 9, "note": "x"}, "extra": 1, '
        '"weight_map": {"b": "s2.safetensors", "a": "s1.safetensors", "c": "s2.safetensors"}}'
    )
    index = _cpp.sharded.ShardIndex.read(str(tmp_path / INDEX))
    assert index.path == str(tmp_path / INDEX)
    assert index.shard_names == ["s1.safetensors", "s2.safetensors"]
    assert index.weight_map == {"b": "s2.safetensors", "a": "s1.safetensors", "c": "s2.safetensors"}
    assert index.assigned(1) == ["b", "c"] and index.shard_path(0) == str(tmp_path / "s1.safetensors")
    assert index.total_size == 9 and index.metadata == {"total_size": "9", "note": "x"}
    assert json.loads(index.metadata_json) == {"total_size": 9, "note": "x"}
    checkpoint = resolve(str(tmp_path))
    assert checkpoint.index_metadata == {"total_size": 9, "note": "x"}
    assert [(s.path, s.names, s.position) for s in checkpoint.shards] == [
        (str(tmp_path / "s1.safetensors"), ["a"], 0),
        (str(tmp_path / "s2.safetensors"), ["b", "c"], 1),
    ]


def test_plan_refuses_bad_input():
    with pytest.raises(SafetensorError, match="duplicate tensor name `a`"):
        _cpp.sharded.plan_shards([("a", 1), ("a", 2)], 10)
    with pytest.raises(SafetensorError, match="shard prefix"):
        _cpp.sharded.plan_shards([("a", 1)], 10, "a/b")


def test_cli_commands_use_the_one_index_check(tmp_path, capsys):
    tensors = arrays()
    _cpp.sharded.save_sharded(str(tmp_path), specs(tensors), 128)
    single = tmp_path / "single.safetensors"
    stnp.save_file(tensors, str(single))
    assert main(["diff", str(tmp_path / INDEX), str(single)]) == 0
    assert main(["verify", "-q", str(tmp_path)]) == 0
    index = json.loads((tmp_path / INDEX).read_text())
    index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors"
    (tmp_path / INDEX).write_text(json.dumps(index))
    shard = tmp_path / "model-00001-of-00003.safetensors"
    expected = f'File does not contain tensor ghost (TensorNotFound) in "{shard}"'
    for argv, rc in ((["diff", str(tmp_path), str(single)], 2), (["inspect", str(tmp_path)], 2), (["verify", str(tmp_path)], 1)):
        capsys.readouterr()
        assert main(argv) == rc
        captured = capsys.readouterr()
        assert expected in captured.out + captured.err, argv
