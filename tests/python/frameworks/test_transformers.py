"""A real client: transformers saves a tiny randomly initialised model with save_pretrained and loads it back
with from_pretrained through this package; the two models give identical outputs."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import safetensors
from safetensors import safe_open


@pytest.mark.parametrize("max_shard_size", ["50GB", "20KB"])
def test_save_pretrained_from_pretrained_round_trip(tmp_path, max_shard_size):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, eos_token_id=0, bos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size=max_shard_size)
    files = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".safetensors")
    assert files, os.listdir(tmp_path)
    if max_shard_size == "20KB":
        assert len(files) > 1 and (tmp_path / "model.safetensors.index.json").exists()
    # The files transformers wrote are ours and hold the model's tensors (tied lm_head dropped).
    names = set()
    for name in files:
        with safe_open(tmp_path / name, "pt") as f:
            names.update(f.keys())
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names

    loaded = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()  # tie restored
    # Every weight and buffer comes back bit for bit.
    expected, got = model.state_dict(), loaded.state_dict()
    assert sorted(expected) == sorted(got)
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []
    # And the outputs are identical. On one thread: torch's multi-threaded CPU kernels are not bitwise
    # reproducible from one call to the next (the same model, the same input, 1 ulp apart in about a third of
    # the processes on 2 cores), which is no property of the file.
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            assert torch.equal(model(ids).logits, loaded(ids).logits)
    finally:
        torch.set_num_threads(threads)
    # transformers used this package, not a copy of the reference from somewhere else.
    assert sys.modules["safetensors"] is safetensors
    assert "+cpp" in safetensors.__version__
