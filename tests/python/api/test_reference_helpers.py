"""The private helpers other projects import, run on both sides: the reference's (in its subprocess) and ours.

Each test runs one code string twice, through the ``reference`` fixture and through the same wrapper over our
package, on the same inputs; the code builds its tensors itself from seeded generators (views and shared
storage do not survive pickling) and leaves plain values in ``result``: names, bytes, dtype names, shapes,
and ``(exception type, message)`` pairs. The results must be equal.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
from typing import Any

import pytest

Reference = Any  # the conftest fixture's type
# Shared by both sides: how to report an exception, and the state dicts of the sharing tests.
PRELUDE = r'''
import os, pickle, random, re, sys

def error(e):
    """(type, message); the members of a set in the message are sorted (set order is per process)."""
    def sort_set(m):
        return "{" + ", ".join(sorted(m.group(1).split(", "))) + "}"
    return (type(e).__name__, re.sub(r"\{('[^{}]*')\}", sort_set, str(e)))

def attempt(f, *args, **kwargs):
    try:
        return ("ok", f(*args, **kwargs))
    except Exception as e:
        return ("error",) + error(e)

def finish(value):
    """Writes the result and leaves at once (the reference's paddle tensors abort the interpreter at exit)."""
    sys.stdout.buffer.write(pickle.dumps(value))
    sys.stdout.flush()
    os._exit(0)
'''

TORCH_CASES = r'''
import torch

def storage(n, seed, dtype=torch.float32):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)

def cases():
    A, B, C, W = storage(10, 1), storage(12, 2), storage(6, 3), storage(8, 4)
    M = storage(12, 5).reshape(3, 4)
    out = {
        "tied": {"a": W, "b": W},
        "tied and separate": {"a": W, "b": W, "c": C},
        "tied, other order": {"z": W, "a": C, "y": W},
        "disjoint slices": {"a": A[:4], "b": A[4:]},
        "full and slice": {"a": A, "b": A[1:3]},
        "full and two disjoint slices": {"a": A, "b": A[1:2], "c": A[3:4]},
        "overlapping views": {"a": A[0:3], "b": A[2:5]},
        "chain of overlaps": {"a": A[0:3], "b": A[2:5], "c": A[4:7], "d": A[8:]},
        "nested views": {"a": A[0:8], "b": A[1:3], "c": A[2:7]},
        "nested, then overlapping the outer": {"a": A[0:6], "b": A[4:9], "c": A[1:3]},
        "lone slice": {"B": A[:1]},
        "lone full": {"A": A},
        "meta": {"m": torch.empty(3, device="meta"), "n": torch.empty(3, device="meta"), "a": W},
        "meta only": {"m": torch.empty(3, device="meta")},
        "empty": {"e": torch.empty(0), "f": torch.zeros(0, 3), "a": W},
        "empty view of a storage": {"a": A, "e": A[3:3]},
        "scalar view": {"a": A, "s": A[3]},
        "reinterpreted": {"a": A, "b": A.view(torch.int32)},
        "reshaped": {"m": M, "f": M.reshape(-1), "r": M[1]},
        "column": {"m": M, "c": M[:, 0]},
        "several groups": {"a1": A, "a2": A, "b1": B, "b2": B.view(3, 4), "c": C, "w": W[2:]},
        "half dtype": {"h": storage(6, 6, torch.float16), "b": storage(6, 7, torch.bfloat16)},
    }
    # Random slices of a few storages, from a seeded generator.
    rng = random.Random(1234)
    bases = [storage(16, 10 + i) for i in range(3)]
    for case in range(40):
        d = {}
        for k in range(rng.randint(1, 6)):
            base = bases[rng.randrange(len(bases))]
            if rng.random() < 0.25:
                d[f"t{k}"] = base
            else:
                start = rng.randrange(16)
                d[f"t{k}"] = base[start:rng.randrange(start, 17)]
        out[f"random {case}"] = d
    return out
'''

# The reference's main-branch fix of its sharing helpers (newer than both releases; README lists it), applied to
# the release in its subprocess, so that our helpers are compared with the release's own code wherever the fix
# does not apply and with the fix where it does. The fixed grouping is computed another way than ours: within
# each group, names whose byte ranges overlap are joined transitively over every pair (union-find), and the
# parts are ordered by their first (start, end, name). The release's _find_shared_tensors calls it by module
# name, so the patch fixes that too.
MAIN_BRANCH_GROUPING = r'''
import itertools
import safetensors.torch as _st

def _split_overlapping(tensors, state_dict):
    out = []
    for group in tensors:
        spans = {n: (state_dict[n].data_ptr(), _st._end_ptr(state_dict[n])) for n in group}
        parent = {n: n for n in group}
        def root(n):
            while parent[n] != n:
                n = parent[n]
            return n
        for a, b in itertools.combinations(sorted(group), 2):
            if spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]:
                parent[root(a)] = root(b)
        parts = {}
        for n in group:
            parts.setdefault(root(n), set()).add(n)
        out.extend(sorted(parts.values(), key=lambda p: min(spans[n] + (n,) for n in p)))
    return out

_st._filter_shared_not_shared = _split_overlapping
'''
# ... and its lone views: a group of one name has nothing to drop, covering its storage or not. The release's
# _remove_duplicate_names raises for such a group; _flatten and _remove_duplicate_names use nothing else of
# groups of one, so leaving them out of what they see is that fix.
MAIN_BRANCH_LONE_VIEWS = MAIN_BRANCH_GROUPING + r'''
_find_with_singletons = _st._find_shared_tensors
_st._find_shared_tensors = lambda state_dict: [g for g in _find_with_singletons(state_dict) if len(g) > 1]
'''


def _run_ours(code: str, **inputs: Any) -> Any:
    """Reference.run, over our installed package (no PYTHONPATH)."""
    script = (
        "import pickle, sys\n"
        "g = pickle.loads(sys.stdin.buffer.read())\n"
        f"exec({code!r}, g)\n"
        "sys.stdout.buffer.write(pickle.dumps(g.get('result')))\n"
    )
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(inputs), capture_output=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"our subprocess failed:\n{proc.stderr.decode()}")
    return pickle.loads(proc.stdout)


def both(reference: Reference, code: str, reference_fix: str = "", **inputs: Any) -> Any:
    """Runs ``PRELUDE + code`` on both sides (``reference_fix`` first on the reference's: a fix of its main
    branch that we follow); asserts equal results and returns them."""
    ref = reference.run(PRELUDE + reference_fix + code, **inputs)
    ours = _run_ours(PRELUDE + code, **inputs)
    if isinstance(ref, dict) and isinstance(ours, dict):
        assert list(ours) == list(ref)
        differing = {k: (ours[k], ref[k]) for k in ref if ours[k] != ref[k]}
        assert not differing, "ours vs the reference:\n" + "\n".join(f"{k}: {v[0]!r} != {v[1]!r}" for k, v in differing.items())
    assert ours == ref
    return ref


def _framework(name: str) -> None:
    """Skips unless ``name`` is installed; it is not imported here (frameworks are imported by the
    subprocesses only: several of them in one interpreter can crash it)."""
    try:
        found = importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        pytest.skip(f"{name} is not installed")


# -- torch: sharing ----------------------------------------------------------------------------------------

def test_find_shared_tensors(reference: Reference) -> None:
    code = TORCH_CASES + r'''
from safetensors.torch import _find_shared_tensors
result = {name: attempt(_find_shared_tensors, d) for name, d in cases().items()}
finish(result)
'''
    result = both(reference, code, reference_fix=MAIN_BRANCH_GROUPING)
    assert result["meta only"] == ("ok", [])
    assert result["full and two disjoint slices"] == ("ok", [{"a", "b", "c"}])
    assert result["nested, then overlapping the outer"] == ("ok", [{"a", "b", "c"}])
    # Where the release differs: a range nested in another ended its group early.
    release = reference.run(PRELUDE + code)
    assert {name for name in result if release[name] != result[name]} == {
        "full and two disjoint slices", "nested, then overlapping the outer", "random 38"}
    assert release["full and two disjoint slices"] == ("ok", [{"a", "b"}, {"c"}])


def test_filter_shared_not_shared(reference: Reference) -> None:
    code = TORCH_CASES + r'''
from safetensors.torch import _filter_shared_not_shared
result = {}
for name, d in cases().items():
    # One group per storage, in first-seen order (addresses of different storages differ between processes).
    groups = {}
    for k, v in d.items():
        if v.device.type != "meta":
            groups.setdefault(v.untyped_storage().data_ptr(), set()).add(k)
    result[name] = attempt(_filter_shared_not_shared, list(groups.values()), d)
finish(result)
'''
    result = both(reference, code, reference_fix=MAIN_BRANCH_GROUPING)
    release = reference.run(PRELUDE + code)
    assert {name for name in result if release[name] != result[name]} == {
        "full and two disjoint slices", "nested, then overlapping the outer", "random 38"}


def test_remove_duplicate_names(reference: Reference) -> None:
    code = TORCH_CASES + r'''
from safetensors.torch import _remove_duplicate_names
result = {}
for name, d in cases().items():
    result[name] = attempt(lambda: list(_remove_duplicate_names(d).items()))
    result[name + " preferring b"] = attempt(lambda: list(_remove_duplicate_names(d, preferred_names=["b", "y"]).items()))
    result[name + " discarding a"] = attempt(lambda: list(_remove_duplicate_names(d, discard_names=["a", "z"]).items()))
finish(result)
'''
    result = both(reference, code, reference_fix=MAIN_BRANCH_LONE_VIEWS)
    assert result["lone slice"] == ("ok", [])
    assert result["full and two disjoint slices"] == ("ok", [("a", ["b", "c"])])
    kind, exc, message = result["overlapping views"]  # aliases none of which covers the storage
    assert (kind, exc) == ("error", "RuntimeError") and "None is covering the entire storage.Refusing" in message
    release = reference.run(PRELUDE + code)
    kind, exc, message = release["lone slice"]
    assert (kind, exc) == ("error", "RuntimeError") and "amongst: {'B'}. None is covering the entire storage.Refusing" in message


def test_save_and_models_with_shared_tensors(reference: Reference) -> None:
    both(reference, reference_fix=MAIN_BRANCH_LONE_VIEWS, code=TORCH_CASES + r'''
import tempfile
import torch
from safetensors.torch import save, save_model, load_model

class Tied(torch.nn.Module):
    def __init__(self, view_only=False):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.b.weight = self.a.weight
        if view_only:
            base = torch.randn(40, generator=g)
            self.register_buffer("part", base[:4])

result = {}
for name, d in cases().items():
    result[name] = attempt(lambda: save(d))
from safetensors import safe_open
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.safetensors")
    for view_only in (False, True):
        metadata = {"user": "kept"}
        target = os.path.join(tmp, f"m{view_only}.safetensors")
        # What the file holds is compared; the caller's metadata dict is not: the reference adds the dropped
        # names to it, ours leaves it as it is (test_torch.py pins that).
        result[f"save_model {view_only}"] = attempt(save_model, Tied(view_only), target, metadata=metadata)
        if os.path.exists(target):
            with safe_open(target, "pt") as f:
                result[f"saved {view_only}"] = (f.keys(), f.metadata())
    os.rename(os.path.join(tmp, "mFalse.safetensors"), path)
    for view_only in (False, True):
        result[f"load_model {view_only}"] = attempt(lambda: tuple(sorted(x) for x in load_model(Tied(view_only), path)))
        result[f"load_model lax {view_only}"] = attempt(lambda: tuple(sorted(x) for x in load_model(torch.nn.Linear(4, 4), path, strict=False)))
finish(result)
''')


# -- torch: saving -----------------------------------------------------------------------------------------

def test_evaluate_tensors_for_save(reference: Reference) -> None:
    both(reference, TORCH_CASES + r'''
import torch
from safetensors.torch import _evaluate_tensors_for_save, _flatten_as_ptr, serialize
A = storage(10, 1)
inputs = {
    "fine": {"a": A, "b": storage(3, 2)},
    "not a dict": [A],
    "not a tensor": {"a": A, "b": [1, 2]},
    "sparse": {"a": A, "s": torch.eye(3).to_sparse()},
    "sparse before a non-tensor": {"s": torch.eye(3).to_sparse(), "x": 1},
    "two sparse": {"s": torch.eye(3).to_sparse(), "t": torch.eye(2).to_sparse_csr()},
    "shared": {"a": A, "b": A},
    "two shared groups": {"a": A, "b": A, "c": A[1:3], "x": storage(4, 3), "y": storage(4, 3)},
    "non-contiguous": {"t": storage(12, 4).reshape(3, 4).t()},
    "meta": {"m": torch.empty(2, device="meta")},
    "empty": {},
}
result = {}
for name, d in inputs.items():
    result[name] = attempt(_evaluate_tensors_for_save, d)
    keep = []
    result[name + " flatten"] = attempt(lambda: serialize(_flatten_as_ptr(d, keep), metadata={"k": "v"}))
finish(result)
''')


DTYPE_SETUP = r'''
import torch
from safetensors.torch import _SIZE as REF_SIZES
DTYPES = sorted((d for d in REF_SIZES if d is not None), key=str)

def make(dtype, shape, seed):
    n = 1
    for s in shape:
        n *= s
    data = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    if dtype == torch.bool:
        data = data % 2
    return data.view(dtype).reshape(shape)
'''


def test_to_ndarray_for_every_dtype(reference: Reference) -> None:
    result = both(reference, DTYPE_SETUP + r'''
from safetensors.torch import _to_ndarray
result = {}
for i, dtype in enumerate(DTYPES):
    for shape in [(3, 4), (), (0, 2), (5,)]:
        if dtype == getattr(torch, "float4_e2m1fn_x2", None) and shape == ():
            continue
        t = make(dtype, shape, i)
        def describe(t=t):
            arr, owner = _to_ndarray(t)
            if isinstance(owner, int):
                return ("no memory", owner, str(arr.dtype), arr.shape)
            # zero-copy: the array is the tensor's memory
            same = arr.ctypes.data == t.data_ptr() and owner is t
            return (arr.tobytes(), str(arr.dtype), arr.shape, same)
        result[(str(dtype), shape)] = attempt(describe)
M = make(torch.float32, (3, 4), 99)
result["transposed"] = attempt(lambda: _to_ndarray(M.t())[0].tobytes())
result["offset view"] = attempt(lambda: _to_ndarray(M[1])[0].tobytes())
result["meta"] = attempt(lambda: _to_ndarray(torch.empty(2, device="meta")))
finish(result)
''')
    assert result[("torch.float32", (3, 4))][1][3] is True


def test_view2torch_on_deserialize(reference: Reference) -> None:
    from safetensors.torch import save
    import torch

    tensors = {}
    g = torch.Generator().manual_seed(7)
    for dtype in [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
                  torch.int8, torch.uint8, torch.bool, torch.complex64, torch.uint16, torch.uint32, torch.uint64,
                  torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]:
        name = str(dtype).removeprefix("torch.")
        data = torch.randint(0, 256, (6 * dtype.itemsize,), dtype=torch.uint8, generator=g)
        tensors[name] = (data % 2 if dtype == torch.bool else data).view(dtype).reshape(2, 3)
        tensors[name + ".empty"] = torch.zeros((0, 3), dtype=dtype)
        tensors[name + ".scalar"] = tensors[name][0, 0].clone()
    data = save(tensors, metadata={"m": "1"})
    both(reference, r'''
import torch
from safetensors.torch import _view2torch, deserialize
out = _view2torch(deserialize(data))
# sorted: the reference's deserialize lists tensors in its hash map's (per-process) order
result = {k: (str(v.dtype), tuple(v.shape), v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()) for k, v in sorted(out.items())}
finish(result)
''', data=data)


# -- numpy -------------------------------------------------------------------------------------------------

def test_numpy_helpers(reference: Reference) -> None:
    from safetensors.numpy import save
    import numpy as np

    rng = np.random.default_rng(3)
    arrays = {}
    for dtype in ["float64", "float32", "float16", "int64", "uint64", "int32", "uint32", "int16", "uint16", "int8",
                  "uint8", "bool", "complex64"]:
        arrays[dtype] = np.frombuffer(rng.bytes(6 * np.dtype(dtype).itemsize), dtype=np.uint8).view(dtype).reshape(2, 3)
        if dtype == "bool":
            arrays[dtype] = arrays[dtype].view(np.uint8) % 2 == 1
        arrays[dtype + ".empty"] = np.zeros((0, 2), dtype=dtype)
    data = save(arrays)
    result = both(reference, r'''
import numpy as np
from safetensors.numpy import _flatten, _is_little_endian, _view2np, deserialize, serialize
result = {}
out = _view2np(deserialize(data))
result["view2np"] = {k: (str(v.dtype), v.shape, v.tobytes(), v.flags.writeable) for k, v in sorted(out.items())}
dtypes = ["<i4", ">i4", "=i4", "|u1", "bool", ">f8", "<c8", ">c8", "=f2", "S3", "<U2", ">U2"]
result["little endian"] = {d: attempt(_is_little_endian, np.zeros(2, dtype=d)) for d in dtypes}
result["structured"] = attempt(_is_little_endian, np.zeros(2, dtype=[("a", ">i4")]))
big = {"b": np.arange(6, dtype=">i4").reshape(2, 3), "l": np.arange(3, dtype="<f8"), "s": np.full((), 2.5)}
keep = []
result["flatten"] = serialize(_flatten(big, keep), metadata=None)
finish(result)
''', data=data)
    assert result["little endian"][">i4"] == ("ok", False)


# -- the other frameworks ----------------------------------------------------------------------------------

FRAMEWORK_INPUT_DTYPES = ["float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool", "float64"]


def _numpy_inputs(dtypes: Any) -> Any:
    import numpy as np

    rng = np.random.default_rng(11)
    out = {}
    for _i, dtype in enumerate(dtypes):
        raw = rng.integers(0, 256, 12 * np.dtype(dtype).itemsize, dtype=np.uint8)
        array = raw.view(dtype).reshape(3, 4) if dtype != "bool" else (raw % 2).astype(bool).reshape(3, 4)
        if np.dtype(dtype).kind == "f":
            array = np.nan_to_num(array, nan=1.5, posinf=2.0, neginf=-2.0)  # equal bytes, whatever NaN payloads become
        out[dtype] = array
        out[dtype + ".scalar"] = np.array(array[0, 0])
    return out


def test_flax_converters(reference: Reference) -> None:
    _framework("jax")
    # float64 is left out: with jax_enable_x64 off both sides give float32, which is compared below through int.
    result = both(reference, r'''
import numpy as np
from safetensors.flax import _jnp2np, _np2jnp
d = dict(arrays)
back = _np2jnp(d)
result = {"in place": back is d, "types": sorted({type(v).__name__ for v in back.values()})}
result["np2jnp"] = {k: (str(v.dtype), tuple(v.shape), np.asarray(v).tobytes()) for k, v in back.items()}
again = _jnp2np(back)
result["jnp2np in place"] = again is back
result["jnp2np"] = {k: (type(v).__name__, str(v.dtype), v.shape, v.tobytes()) for k, v in again.items()}
finish(result)
''', arrays=_numpy_inputs([d for d in FRAMEWORK_INPUT_DTYPES if d != "float64"]))
    assert result["in place"] and result["jnp2np in place"] and len(result["np2jnp"]) == 16


def test_tensorflow_converters(reference: Reference) -> None:
    _framework("tensorflow")
    result = both(reference, r'''
import numpy as np
from safetensors.tensorflow import _np2tf, _tf2np
d = dict(arrays)
back = _np2tf(d)
result = {"in place": back is d}
result["np2tf"] = {k: (v.dtype.name, tuple(v.shape), v.numpy().tobytes()) for k, v in back.items()}
again = _tf2np(back)
result["tf2np in place"] = again is back
result["tf2np"] = {k: (type(v).__name__, str(v.dtype), v.shape, v.tobytes()) for k, v in again.items()}
finish(result)
''', arrays=_numpy_inputs(FRAMEWORK_INPUT_DTYPES))
    assert result["in place"] and result["tf2np in place"] and len(result["tf2np"]) == 18


def test_mlx_converters(reference: Reference) -> None:
    _framework("mlx.core")
    # float64 is left out: ours keeps it (mx.float64, an exact round trip), the reference's mx.array makes float32.
    result = both(reference, r'''
import numpy as np
import mlx.core as mx
from safetensors.mlx import _mx2np, _np2mx
d = dict(arrays)
back = _np2mx(d)
result = {"in place": back is d}
result["np2mx"] = {k: (str(v.dtype), tuple(v.shape), np.asarray(v).tobytes()) for k, v in back.items()}
again = _mx2np(back)
result["mx2np new dict"] = again is not back and all(isinstance(v, mx.array) for v in back.values())
result["mx2np"] = {k: (type(v).__name__, str(v.dtype), v.shape, v.tobytes()) for k, v in again.items()}
finish(result)
''', arrays=_numpy_inputs([d for d in FRAMEWORK_INPUT_DTYPES if d != "float64"]))
    assert result["in place"] and result["mx2np new dict"] and len(result["mx2np"]) == 16


def test_paddle_helpers(reference: Reference) -> None:
    _framework("paddle")
    from safetensors.numpy import save

    arrays = _numpy_inputs(["float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool", "float64"])
    data = save(arrays)
    result = both(reference, r'''
import numpy as np
import paddle
from safetensors.paddle import NPDTYPES, _SIZE, _np2paddle, _paddle2np, _to_ndarray, _view2paddle, deserialize
result = {
    "sizes": {str(k): v for k, v in _SIZE.items() if str(k) in REF_DTYPES},
    "npdtypes": {str(k): v for k, v in NPDTYPES.items() if str(k) in REF_DTYPES and str(k) != "paddle.complex64"},
}
d = dict(arrays)
back = _np2paddle(d, "cpu")
result["np2paddle in place"] = back is d
result["np2paddle"] = {k: (str(v.dtype), tuple(v.shape), v.numpy().tobytes()) for k, v in back.items()}
nd = {}
for k, v in back.items():
    arr, owner = _to_ndarray(v, k)
    nd[k] = (str(arr.dtype), arr.shape, arr.tobytes(), owner is v)
result["to_ndarray"] = nd
result["to_ndarray non-contiguous"] = attempt(lambda: _to_ndarray(paddle.to_tensor(np.arange(12.0).reshape(3, 4)).transpose([1, 0]), "t"))
again = _paddle2np(back)
result["paddle2np in place"] = again is back
result["paddle2np"] = {k: (type(v).__name__, str(v.dtype), v.shape, v.tobytes()) for k, v in again.items()}
viewed = _view2paddle(deserialize(data), "cpu")
result["view2paddle"] = {k: (str(v.dtype), tuple(v.shape), v.numpy().tobytes()) for k, v in sorted(viewed.items())}
finish(result)
''', arrays=arrays, data=data, REF_DTYPES=_REFERENCE_PADDLE_DTYPES)
    assert len(result["sizes"]) == len(_REFERENCE_PADDLE_DTYPES) and len(result["npdtypes"]) == len(_REFERENCE_PADDLE_DTYPES) - 1
    assert len(result["view2paddle"]) == len(arrays) and all(owned for *_, owned in result["to_ndarray"].values())


# The dtypes the reference's paddle tables hold (its NPDTYPES lacks complex64; ours hold more: complex64 in
# NPDTYPES, the uint types of newer paddle versions).
_REFERENCE_PADDLE_DTYPES = [
    "paddle.int64", "paddle.float32", "paddle.int32", "paddle.bfloat16", "paddle.float16", "paddle.int16",
    "paddle.uint8", "paddle.int8", "paddle.bool", "paddle.float64", "paddle.float8_e4m3fn", "paddle.float8_e5m2",
    "paddle.complex64",
]
