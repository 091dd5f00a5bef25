"""`safetensors convert`: PyTorch checkpoints to safetensors files and shards, tied weights, options and errors."""

from __future__ import annotations

import io
import json
import os
import sys
from typing import Dict

import pytest
import torch

import safetensors.torch as stt
from safetensors._cli import main
from safetensors import safe_open
from cli.helpers import Result, assert_input_error, shard_file_names


# -- convert -----------------------------------------------------------------------------------------------

def _state_dict() -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(10, 4, generator=g),
        "layer.weight": torch.randn(4, 4, generator=g, dtype=torch.float64),
        "layer.bias": torch.zeros(4, dtype=torch.bfloat16),
        "steps": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False]),
    }


def _assert_equal_dicts(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(a[name], b[name]), name


def test_convert_state_dict_round_trip_and_bytes(cli, tmp_path):
    sd = _state_dict()
    src = tmp_path / "pytorch_model.bin"
    torch.save(sd, src)
    out = tmp_path / "model.safetensors"
    r = cli("convert", src, out)
    assert r.rc == 0 and r.err == ""
    assert r.out == f"converted {src}: 5 tensors, 306 B\n  wrote {out}: 5 tensors\n"
    _assert_equal_dicts(stt.load_file(out), torch.load(src, weights_only=True))
    # The very bytes save_file writes, with the metadata transformers looks for.
    expected = tmp_path / "expected.safetensors"
    stt.save_file(sd, expected, metadata={"format": "pt"})
    assert out.read_bytes() == expected.read_bytes()
    assert cli("verify", out).rc == 0


@pytest.mark.parametrize("entry", ["state_dict", "model"])
def test_convert_finds_the_state_dict_entry(cli, tmp_path, entry):
    sd = _state_dict()
    src = tmp_path / "checkpoint.pt"
    torch.save({entry: sd, "epoch": 3, "optimizer": {"lr": 0.1}}, src)
    r = cli("convert", src, tmp_path / "out.safetensors")
    assert r.rc == 0
    assert r.out.startswith(f'converted {src} ("{entry}" entry): 5 tensors')
    _assert_equal_dicts(stt.load_file(tmp_path / "out.safetensors"), sd)


def test_convert_legacy_format_and_pth(cli, tmp_path):
    sd = _state_dict()
    src = tmp_path / "legacy.pth"
    torch.save(sd, src, _use_new_zipfile_serialization=False)  # cannot be memory-mapped
    assert cli("convert", "-q", src, tmp_path / "out.safetensors") == Result(0, "", "")
    _assert_equal_dicts(stt.load_file(tmp_path / "out.safetensors"), sd)


def test_convert_tied_weights_like_save_model(cli, tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.lm_head = torch.nn.Linear(4, 10, bias=False)
            self.lm_head.weight = self.embed.weight

    torch.manual_seed(0)
    model = Tied()
    src = tmp_path / "tied.bin"
    torch.save(model.state_dict(), src)
    out = tmp_path / "tied.safetensors"
    r = cli("convert", src, out)
    assert r.rc == 0
    assert r.out.splitlines()[-1] == (
        "  shared tensor lm_head.weight is stored once, as embed.weight (recorded in the metadata)"
    )
    with safe_open(out, "pt") as f:
        assert f.keys() == ["embed.weight"]
        assert f.metadata() == {"format": "pt", "lm_head.weight": "embed.weight"}
    expected = tmp_path / "expected.safetensors"
    stt.save_model(model, expected, metadata={"format": "pt"})
    assert out.read_bytes() == expected.read_bytes()
    fresh = Tied()
    assert stt.load_model(fresh, out) == (set(), [])
    assert torch.equal(fresh.lm_head.weight, model.embed.weight)


def test_convert_overlapping_views_and_non_contiguous_tensors(cli, tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    sd = {"base": base, "rows": base[2:4], "transposed": torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).t(), "strided": torch.arange(10)[::3]}
    src = tmp_path / "views.pt"
    torch.save(sd, src)
    out = tmp_path / "views.safetensors"
    r = cli("convert", src, out)
    assert r.rc == 0
    assert "  overlapping tensors written as separate copies: rows\n" in r.out
    _assert_equal_dicts(stt.load_file(out), torch.load(src, weights_only=True))
    assert safe_open(out, "pt").metadata() == {"format": "pt"}


def test_convert_sharded_matches_transformers_layout(cli, tmp_path):
    sd = {f"layer.{i}.weight": torch.full((i + 1, 100), float(i)) for i in range(6)}  # 400, 800, ... 2400 bytes
    sd["big"] = torch.zeros(2000)  # 8000 bytes, over the limit: a shard of its own
    sd["tail"] = torch.ones(10, dtype=torch.float16)
    src = tmp_path / "big.bin"
    torch.save(sd, src)
    out_dir = tmp_path / "out"
    r = cli("convert", "--max-shard-size", "3KB", "--metadata", "source=test", src, out_dir / "model.safetensors")
    assert r.rc == 0, r.err
    names = shard_file_names("model", 5)
    assert sorted(os.listdir(out_dir)) == names + ["model.safetensors.index.json"]
    assert r.out.splitlines()[-1] == f"  wrote {out_dir / 'model.safetensors.index.json'}"

    index_text = (out_dir / "model.safetensors.index.json").read_text()
    index = json.loads(index_text)
    assert index_text == json.dumps(index, indent=2, sort_keys=True) + "\n"
    total = sum(t.nelement() * t.element_size() for t in sd.values())
    assert index["metadata"] == {"total_size": total}
    assert index["weight_map"] == {
        "layer.0.weight": names[0], "layer.1.weight": names[0], "layer.2.weight": names[0],
        "layer.3.weight": names[1], "layer.4.weight": names[2], "big": names[3],
        "layer.5.weight": names[4], "tail": names[4],
    }
    hub = pytest.importorskip("huggingface_hub")
    split = hub.split_torch_state_dict_into_shards(sd, max_shard_size=3000)
    assert split.tensor_to_filename == index["weight_map"]

    loaded: Dict[str, torch.Tensor] = {}
    for name in names:
        with safe_open(out_dir / name, "pt") as f:
            assert f.metadata() == {"format": "pt", "source": "test"}
        loaded.update(stt.load_file(out_dir / name))
    _assert_equal_dicts(loaded, sd)
    # The tool reads its own output as a checkpoint.
    assert json.loads(cli("inspect", "--json", out_dir).out)["total_bytes"] == total
    assert cli("verify", out_dir).rc == 0
    single = tmp_path / "single.safetensors"
    assert cli("convert", "-q", "--metadata", "source=test", src, single).rc == 0
    assert cli("diff", single, out_dir).rc == 0


def test_convert_below_the_shard_limit_writes_one_file(cli, tmp_path):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    assert cli("convert", "--max-shard-size", "5GB", src, tmp_path).rc == 0
    assert sorted(os.listdir(tmp_path)) == ["m.bin", "model.safetensors"]


def test_convert_refuses_to_overwrite_without_force_and_cleans_stale_shards(cli, tmp_path):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    out = tmp_path / "out" / "model.safetensors"
    assert cli("convert", "-q", "--max-shard-size", "100B", src, out).rc == 0
    shards = sorted(os.listdir(out.parent))
    assert shards == shard_file_names("model", 3) + ["model.safetensors.index.json"]
    before = {name: (out.parent / name).read_bytes() for name in shards}

    r = cli("convert", src, out)
    assert_input_error(r, f"{out.parent / 'model-00001-of-00003.safetensors'}: already exists; pass --force")
    assert {name: (out.parent / name).read_bytes() for name in os.listdir(out.parent)} == before

    r = cli("convert", "--force", src, out)
    assert r.rc == 0
    assert sorted(os.listdir(out.parent)) == ["model.safetensors"]
    assert r.out.splitlines()[-4:] == [f"  removed stale {out.parent / name}" for name in shards]
    _assert_equal_dicts(stt.load_file(out), _state_dict())
    assert_input_error(cli("convert", src, out), "model.safetensors: already exists")
    # Other stems in the same directory are not this output.
    assert cli("convert", "-q", src, out.parent / "other.safetensors").rc == 0


def test_convert_counts_as_its_outputs_the_shard_names_the_library_gives(tmp_path):
    """convert's (and save_state_dict's) stale-output rule is the C++ shard naming rule (is_shard_file_name),
    not a second pattern."""
    from safetensors._checkpoint_paths import checkpoint_files

    ours = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
            "model-100000-of-100000.safetensors", "model.safetensors", "model.safetensors.index.json"]
    not_ours = ["model-00003-of-00002.safetensors", "model-00000-of-00002.safetensors",
                "model-0001-of-00002.safetensors", "model-00001-of-00002.safetensors.tmp",
                "other-00001-of-00002.safetensors", "model.bin"]
    for name in ours + not_ours:
        (tmp_path / name).write_bytes(b"")
    assert checkpoint_files(str(tmp_path), "model") == sorted(str(tmp_path / n) for n in ours)
    assert checkpoint_files(str(tmp_path / "absent"), "model") == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-shard-size", "5XB"], "--max-shard-size: invalid size '5XB'"),
        (["--max-shard-size", "0KB"], "must be at least one byte"),
        (["--metadata", "novalue"], "--metadata 'novalue': expected KEY=VALUE"),
        (["--metadata", "=v"], "--metadata '=v': expected KEY=VALUE"),
        (["--metadata", "k=1", "--metadata", "k=2"], "--metadata: key 'k' given twice"),
    ],
)
def test_convert_option_errors(cli, tmp_path, argv, message):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    assert_input_error(cli("convert", src, tmp_path / "o.safetensors", *argv), message)
    assert not (tmp_path / "o.safetensors").exists()


def test_convert_metadata_options(cli, tmp_path):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    out = tmp_path / "o.safetensors"
    assert cli("convert", src, out, "--metadata", "format=mlx", "--metadata", "note=a=b", "--metadata", "empty=").rc == 0
    assert safe_open(out, "pt").metadata() == {"format": "mlx", "note": "a=b", "empty": ""}


class _NotAllowed:
    pass


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: torch.save({"w": torch.ones(2), "obj": _NotAllowed()}, p),
         "cannot load with torch.load(weights_only=True): Unsupported global: GLOBAL"),
        (lambda p: p.write_bytes(b"not a checkpoint"), "cannot load with torch.load(weights_only=True)"),
        (lambda p: torch.save([torch.ones(2)], p), "holds a list, not a state dict"),
        (lambda p: torch.save({"w": torch.ones(2), "epoch": 3}, p),
         "the state dict has entries that are not named tensors: 'epoch' (int)"),
        (lambda p: torch.save({"model": {"w": torch.ones(2), "n": "x"}}, p),
         "the state dict (in its \"model\" entry) has entries that are not named tensors: 'n' (str)"),
        (lambda p: torch.save({"c": torch.ones(2, dtype=torch.complex128)}, p),
         "tensor 'c' has dtype torch.complex128, which safetensors cannot store"),
        (lambda p: torch.save({"s": torch.eye(2).to_sparse()}, p), "tensor 's' is sparse"),
    ],
)
def test_convert_input_errors(cli, tmp_path, make, message):
    src = tmp_path / "in.pt"
    make(src)
    assert_input_error(cli("convert", src, tmp_path / "o.safetensors"), str(src), message)
    assert not (tmp_path / "o.safetensors").exists()


def test_convert_path_errors(cli, tmp_path):
    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    assert_input_error(cli("convert", tmp_path / "nope.bin", tmp_path / "o.safetensors"), "nope.bin: no such file")
    assert_input_error(cli("convert", tmp_path, tmp_path / "o.safetensors"), "is a directory")
    assert_input_error(cli("convert", src, tmp_path / "o.st"), "o.st: the output must be a .safetensors file name")
    # A directory that does not exist yet is created.
    assert cli("convert", "-q", src, tmp_path / "new" / "deeper" / "m.safetensors").rc == 0
    assert (tmp_path / "new" / "deeper" / "m.safetensors").is_file()


def test_convert_progress_bar(cli, tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    src = tmp_path / "m.bin"
    torch.save(_state_dict(), src)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["convert", str(src), str(tmp_path / "a.safetensors")]) == 0
    assert terminal.getvalue().startswith("\rconverting [")
    assert terminal.getvalue().endswith("[##############################] 100% 306 B/306 B\n")
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(["convert", "--quiet", str(src), str(tmp_path / "b.safetensors")]) == 0
    assert quiet.getvalue() == ""


def test_convert_output_loads_in_transformers(cli, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    src = tmp_path / "pytorch_model.bin"
    torch.save(model.state_dict(), src)  # lm_head.weight is tied to transformer.wte.weight
    out = tmp_path / "hf"
    assert cli("convert", "-q", "--max-shard-size", "10KiB", src, out / "model.safetensors").rc == 0
    assert (out / "model.safetensors.index.json").exists()
    config.save_pretrained(out)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out)
    _assert_equal_dicts(loaded.state_dict(), model.state_dict())
    # A checkpoint transformers itself writes is read by the tool.
    model.save_pretrained(tmp_path / "saved", max_shard_size="10KB")
    assert cli("verify", "--scan", tmp_path / "saved").rc == 0
    doc = json.loads(cli("inspect", "--json", tmp_path / "saved").out)
    assert doc["total_parameters"] == sum(p.numel() for p in model.parameters())
