"""save_model of an RNN whose parameters were packed into one buffer, as ``flatten_parameters()`` packs them for
cuDNN: each parameter a disjoint view of one storage, none covering it. Both releases of the reference refuse
such a model ("found no suitable name to keep for saving"); its main branch saves it, and so does this package.
The same fix groups nested ranges transitively and accepts a lone view in ``_remove_duplicate_names``.

The packing is done on the CPU (the layout is what matters, not the device); test_cuda.py saves a model
flattened by cuDNN itself."""

from __future__ import annotations

import pytest
import torch

from safetensors import safe_open
from safetensors.torch import _find_shared_tensors, _remove_duplicate_names, load_model, save_model


def pack_parameters(rnn: torch.nn.RNNBase) -> torch.Tensor:
    """Moves every parameter of ``rnn`` into one new buffer, back to back, each becoming a view of it (the
    layout flatten_parameters gives on cuDNN); returns the buffer."""
    params = list(rnn.parameters())
    buffer = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype)
    offset = 0
    with torch.no_grad():
        for p in params:
            buffer[offset : offset + p.numel()].copy_(p.reshape(-1))
            p.set_(buffer.untyped_storage(), offset, p.shape)
            offset += p.numel()
    return buffer


def seeded(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return module


@pytest.mark.parametrize("kind", [torch.nn.GRU, torch.nn.LSTM])
def test_save_model_of_packed_rnn_parameters(tmp_path, kind):
    model = seeded(kind(5, 4, num_layers=2, bidirectional=True), 1)
    buffer = pack_parameters(model)
    state = model.state_dict()
    assert {t.untyped_storage().data_ptr() for t in state.values()} == {buffer.untyped_storage().data_ptr()}
    # Every parameter is a group of its own, and none has an alias to drop.
    assert sorted(_find_shared_tensors(state), key=min) == sorted(({n} for n in state), key=min)
    assert _remove_duplicate_names(state) == {}

    path = tmp_path / "rnn.safetensors"
    save_model(model, path, metadata={"format": "pt"})
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt"}  # no alias recorded
        assert sorted(f.keys()) == sorted(state)
        for name, value in state.items():
            assert torch.equal(f.get_tensor(name), value), name

    fresh = seeded(kind(5, 4, num_layers=2, bidirectional=True), 2)
    assert load_model(fresh, path) == (set(), [])
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, state[name]), name
    # The loaded model still runs.
    x = torch.randn(3, 2, 5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(fresh(x)[0], model(x)[0])


def test_nested_ranges_are_one_group():
    A = torch.zeros(600)
    # Sorted by start: a [0, 400), c [100, 200) inside a, b [300, 500) overlapping a beyond c's end.
    state = {"a": A[:400], "b": A[300:500], "c": A[100:200]}
    assert _find_shared_tensors(state) == [{"a", "b", "c"}]
    # Ranges that only touch stay apart, a nested one joins the range around it.
    assert _find_shared_tensors({"a": A[:300], "c": A[100:200], "b": A[300:500]}) == [{"a", "c"}, {"b"}]


def test_lone_view_has_nothing_to_remove():
    A = torch.zeros((3, 3))
    assert _remove_duplicate_names({"B": A[:1, :]}) == {}
    # Aliases that none covers whole are still refused.
    with pytest.raises(RuntimeError, match=r"amongst: \{'[BC]', '[BC]'\}\. None is covering the entire storage"):
        _remove_duplicate_names({"B": A[:1, :], "C": A[:1, :]})
