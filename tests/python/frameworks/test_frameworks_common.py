"""The contract every framework module (flax, tensorflow, mlx, paddle) is tested against.

``FrameworkContract`` holds the tests; each ``test_frameworks_<name>.py`` subclasses it with a ``Test`` class
that names the framework, the codes it holds, where the reference succeeds, and a SETUP snippet defining
``make(np.ndarray) -> tensor`` and ``dump(tensor) -> (dtype name, shape, raw bytes)``. The snippet runs both
here and in the reference's subprocess, so both sides build and inspect tensors the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Tuple

import numpy as np
import pytest

from safetensors import SafetensorError, safe_open
from safetensors._core import DTYPES
from safetensors.numpy import _TYPES as NUMPY_TYPES
from safetensors.numpy import save_file as numpy_save_file

Dump = Tuple[str, Tuple[int, ...], bytes]

#: Every code of the format, in rank order.
ALL_CODES: List[str] = list(DTYPES)


def sample(code: str, shape: Tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A numpy array of ``code``'s dtype holding random bit patterns (NaNs included, for the float types)."""
    rng = np.random.default_rng(seed)
    dtype = NUMPY_TYPES[code]
    n = int(np.prod(shape, dtype=np.int64))
    if code == "BOOL":
        return rng.integers(0, 2, n).astype(np.bool_).reshape(shape)
    bits = DTYPES[code].bits
    if bits < 8:  # ml_dtypes keeps one sub-byte value per byte, in the low bits
        return rng.integers(0, 1 << bits, n, dtype=np.uint8).view(dtype).reshape(shape)
    return np.frombuffer(rng.bytes(n * dtype.itemsize), dtype=dtype).reshape(shape).copy()


def numpy_dump(array: np.ndarray) -> Tuple[Tuple[int, ...], bytes]:
    return tuple(array.shape), np.ascontiguousarray(array).tobytes()


# The reference's side: SETUP, then this driver. It writes its own result and leaves with os._exit, because the
# reference's paddle tensors abort the interpreter at exit ("The deleter of the pointer is not found").
_DRIVER = """
import os, pickle, sys
import numpy as np
from safetensors import safe_open
result = {"saved": {}, "save_errors": {}, "loaded": {}, "load_errors": {}, "sliced": {}, "slice_errors": {}}
with CONTEXTS[-1]():
    for key, (tensors, metadata) in to_save.items():
        try:
            result["saved"][key] = MODULE.save({k: make(v) for k, v in tensors.items()}, metadata=metadata)
        except Exception as e:
            result["save_errors"][key] = repr(e)
for ctx_index, ctx in enumerate(CONTEXTS):
    with ctx():
        for key, path in to_load.items():
            try:
                result["loaded"][(ctx_index, key)] = {k: dump(v) for k, v in MODULE.load_file(path).items()}
            except Exception as e:
                result["load_errors"][(ctx_index, key)] = repr(e)
with CONTEXTS[-1]():
    for key, (path, index) in to_slice.items():
        try:
            with safe_open(path, framework=FRAMEWORK) as f:
                result["sliced"][key] = dump(f.get_slice("t")[index])
        except Exception as e:
            result["slice_errors"][key] = repr(e)
sys.stdout.buffer.write(pickle.dumps(result))
sys.stdout.flush()
os._exit(0)
"""

# One key: the reference writes metadata in its hash map's (per-process random) order.
MIXED_METADATA = {"ünï": "välue \"q\"\n"}

# Step-free slices: the reference's indexer for frameworks other than torch ignores steps.
REFERENCE_SLICES = [(0,), (slice(1, 3),), (slice(None), slice(0, 2)), (Ellipsis, 1), (slice(2, None), Ellipsis)]

NUMPY_SLICES = [
    (0,),
    (-1,),
    (slice(1, 3),),
    (slice(None, None, 2),),
    (slice(None, None, -1),),
    (slice(None), slice(4, 0, -2)),
    (Ellipsis, 1),
    (1, Ellipsis, slice(None, None, -3)),
    (None, slice(1, None)),
    ([0, 2],),
    (slice(None), [3, 0, 3]),
    ([],),
    (slice(10, 20),),
    (slice(-100, 100, 3), 2, slice(None)),
]


class FrameworkContract:
    """Tests shared by the framework modules; subclasses set the attributes and SETUP below."""

    #: The name given to safe_open, and every other spelling of it.
    framework: str
    aliases: Tuple[str, ...] = ()
    #: The framework's name in "Device X is not supported for framework NAME", and in "dtype X has no NAME
    #: equivalent" unless dtype_owner says otherwise.
    display_name: str
    dtype_owner: str = ""
    #: ``safetensors.<module>`` (this project's).
    module: Any
    #: Import path of the module in the reference.
    module_name: str
    #: Codes the framework holds (load and save round-trip exactly).
    codes: FrozenSet[str]
    #: Codes the reference saves from this framework, and those it loads into it.
    reference_save_codes: FrozenSet[str]
    reference_load_codes: FrozenSet[str]
    #: False where the reference fails on 0-d tensors (on save) or zero-size tensors (on load).
    reference_saves_scalars: bool = True
    reference_handles_empty: bool = True
    #: Python source defining make, dump and CONTEXTS (context manager factories; the last one is exact).
    SETUP: str

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrizes ``held_code`` over the codes this framework holds, ``missing_code`` over the others."""
        if "held_code" in metafunc.fixturenames:
            metafunc.parametrize("held_code", [c for c in ALL_CODES if c in self.codes])
        if "missing_code" in metafunc.fixturenames:
            metafunc.parametrize("missing_code", [c for c in ALL_CODES if c not in self.codes])

    # -- helpers ------------------------------------------------------------------------------------------
    @classmethod
    def ns(cls) -> Dict[str, Any]:
        cache = cls.__dict__.get("_ns")
        if cache is None:
            cache = {}
            exec(cls.SETUP, cache)
            cls._ns = cache
        return cache

    def make(self, array: np.ndarray) -> Any:
        return self.ns()["make"](array)

    def dump(self, tensor: Any) -> Dump:
        return self.ns()["dump"](tensor)

    def exact(self) -> Any:
        """The context in which every code the framework has loads without conversion."""
        return self.ns()["CONTEXTS"][-1]()

    def expected(self, array: np.ndarray) -> Dump:
        """What loading ``array``'s bytes must give: the framework's own tensor for it."""
        with self.exact():
            return self.dump(self.make(array))

    @classmethod
    def mixed(cls) -> Dict[str, np.ndarray]:
        """Several dtypes and (where the reference manages them) a scalar and an empty tensor, for whole-file
        checks against the reference."""
        tensors = {"z.w": sample("F32", (2, 3), 1), "a": sample("I32", (4,), 2), "m": sample("U8", (5,), 3),
                   "s": sample("F16", (), 4), "e": sample("F32", (0, 2), 5)}
        if not cls.reference_saves_scalars:
            del tensors["s"]
        if not cls.reference_handles_empty:
            del tensors["e"]
        return tensors

    @staticmethod
    def write_numpy(path: Path, tensors: Dict[str, np.ndarray], metadata: Any = None) -> Path:
        numpy_save_file(tensors, path, metadata=metadata)
        return path

    # -- round trips ----------------------------------------------------------------------------------------
    def test_round_trip_every_dtype(self, held_code: str, tmp_path: Path) -> None:
        code = held_code
        array = sample(code, (3, 4), seed=ALL_CODES.index(code))
        with self.exact():
            tensors = {"t": self.make(array)}
            want = self.dump(tensors["t"])
            data = self.module.save(tensors)
            self.module.save_file(tensors, tmp_path / "t.safetensors")
            assert (tmp_path / "t.safetensors").read_bytes() == data
            with safe_open(tmp_path / "t.safetensors", framework="np") as f:
                assert f.get_slice("t").get_dtype() == code
                assert numpy_dump(f.get_tensor("t")) == numpy_dump(array)
            assert self.dump(self.module.load(data)["t"]) == want
            for backend in ("mmap", "pread"):
                loaded = self.module.load_file(tmp_path / "t.safetensors", backend=backend)
                assert list(loaded) == ["t"]
                assert self.dump(loaded["t"]) == want

    def test_loads_numpy_files_of_every_dtype(self, held_code: str, tmp_path: Path) -> None:
        code = held_code
        array = sample(code, (2, 5), seed=100 + ALL_CODES.index(code))
        path = self.write_numpy(tmp_path / "n.safetensors", {"t": array})
        with self.exact():
            got = self.dump(self.module.load_file(path)["t"])
        assert got == self.expected(array)
        assert got[1:] == numpy_dump(array)

    def test_codes_without_a_dtype_raise(self, missing_code: str, tmp_path: Path) -> None:
        code = missing_code
        path = self.write_numpy(tmp_path / f"{code}.safetensors", {"t": sample(code, (8,))})
        message = f"^dtype {code} has no {self.dtype_owner or self.display_name} equivalent"
        with pytest.raises(SafetensorError, match=message):
            self.module.load_file(path)
        with pytest.raises(SafetensorError, match=message):
            self.module.load(path.read_bytes())
        for backend in ("mmap", "pread"):
            with safe_open(path, framework=self.framework, backend=backend) as f:
                assert f.get_slice("t").get_dtype() == code
                with pytest.raises(SafetensorError, match=message):
                    f.get_tensor("t")
                with pytest.raises(SafetensorError, match=message):
                    f.get_tensors()
                with pytest.raises(SafetensorError, match=message):
                    f.get_slice("t")[4:]

    @pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1,), (1, 1, 1)])
    @pytest.mark.parametrize("backend", ["mmap", "pread"])
    def test_empty_and_scalar_tensors(self, shape: Tuple[int, ...], backend: str, tmp_path: Path) -> None:
        arrays = {"f": sample("F32", shape, 1), "b": sample("BF16", shape, 2), "z": sample("BOOL", shape, 3)}
        tensors = {name: self.make(a) for name, a in arrays.items()}
        self.module.save_file(tensors, tmp_path / "e.safetensors")
        with safe_open(tmp_path / "e.safetensors", framework="np") as f:
            assert {k: f.get_slice(k).get_shape() for k in f.keys()} == {k: list(shape) for k in arrays}
        for loaded in (self.module.load_file(tmp_path / "e.safetensors", backend=backend),
                       self.module.load(self.module.save(tensors))):
            assert {k: self.dump(v) for k, v in loaded.items()} == {k: self.expected(a) for k, a in arrays.items()}
            assert all(tuple(v.shape) == shape for v in loaded.values())

    # -- metadata, names, order --------------------------------------------------------------------------------
    def test_metadata_and_key_order(self, tmp_path: Path) -> None:
        arrays = {"zeta": sample("F32", (2,), 4), "alpha": sample("I32", (3,), 5), "mid": sample("U8", (4,), 6)}
        tensors = {k: self.make(a) for k, a in arrays.items()}
        metadata = {"format": "np", "ünïcode": "välue \"quoted\"\n"}
        self.module.save_file(tensors, tmp_path / "m.safetensors", metadata=metadata)
        assert self.module.save(tensors, metadata=metadata) == (tmp_path / "m.safetensors").read_bytes()
        for backend in ("mmap", "pread"):
            with safe_open(tmp_path / "m.safetensors", framework=self.framework, backend=backend) as f:
                assert f.metadata() == metadata
                assert f.keys() == ["alpha", "mid", "zeta"]
                assert f.offset_keys() == ["zeta", "alpha", "mid"]  # F32/I32 by name, then U8
                assert list(f.get_tensors()) == ["zeta", "alpha", "mid"]
        self.module.save_file(tensors, tmp_path / "none.safetensors")
        with safe_open(tmp_path / "none.safetensors", framework=self.framework) as f:
            assert f.metadata() is None
        with pytest.raises(TypeError):
            self.module.save(tensors, metadata={"n": 1})

    def test_caller_dict_is_not_mutated(self, tmp_path: Path) -> None:
        tensors = {"a": self.make(sample("F32", (2, 2), 7)), "b": self.make(sample("I8", (3,), 8))}
        before = dict(tensors)
        self.module.save(tensors)
        self.module.save_file(tensors, tmp_path / "c.safetensors")
        assert list(tensors) == list(before)
        assert all(tensors[k] is before[k] for k in before)

    def test_save_rejects_a_non_dict(self) -> None:
        with pytest.raises(ValueError, match="Expected a dict of"):
            self.module.save([("a", self.make(sample("F32", (1,))))])

    # -- safe_open --------------------------------------------------------------------------------------------
    @pytest.mark.parametrize("backend", ["mmap", "pread"])
    def test_safe_open_returns_framework_tensors(self, backend: str, tmp_path: Path) -> None:
        arrays = {"w": sample("F32", (4, 3), 9), "b": sample("BF16", (3,), 10), "m": sample("BOOL", (2, 2), 11)}
        path = self.write_numpy(tmp_path / "s.safetensors", arrays)
        for name in (self.framework, *self.aliases):
            with safe_open(path, framework=name, backend=backend) as f:
                one = f.get_tensor("w")
                every = f.get_tensors()
            assert type(one) is type(self.make(arrays["w"]))
            assert self.dump(one) == self.expected(arrays["w"])
            assert {k: self.dump(v) for k, v in every.items()} == {k: self.expected(a) for k, a in arrays.items()}
            with pytest.raises(SafetensorError, match="File is closed"):
                f.get_tensor("w")
        with safe_open(path, framework=self.framework, backend=backend) as f:
            with pytest.raises(SafetensorError, match="File does not contain tensor missing"):
                f.get_tensor("missing")

    @pytest.mark.parametrize("backend", ["mmap", "pread"])
    def test_tensors_outlive_the_file(self, backend: str, tmp_path: Path) -> None:
        path = tmp_path / "l.safetensors"
        first = sample("F32", (64, 8), 12)
        self.write_numpy(path, {"t": first})
        loaded = self.module.load_file(path, backend=backend)
        with safe_open(path, framework=self.framework, backend=backend) as f:
            part = f.get_slice("t")[3:5]
            whole = f.get_tensor("t")
        self.write_numpy(path, {"t": sample("F32", (64, 8), 13)})  # replaces the file under the mapping
        assert self.dump(loaded["t"]) == self.expected(first)
        assert self.dump(whole) == self.expected(first)
        assert self.dump(part) == self.expected(first[3:5])

    # -- slicing ----------------------------------------------------------------------------------------------
    @pytest.mark.parametrize("code", ["F32", "BF16", "BOOL", "I16"])
    @pytest.mark.parametrize("backend", ["mmap", "pread"])
    def test_slices_follow_numpy(self, code: str, backend: str, tmp_path: Path) -> None:
        array = sample(code, (4, 5, 6), 14)
        path = self.write_numpy(tmp_path / "x.safetensors", {"t": array})
        with safe_open(path, framework=self.framework, backend=backend) as f:
            sl = f.get_slice("t")
            assert sl.get_shape() == [4, 5, 6]
            assert sl.get_dtype() == code
            for index in NUMPY_SLICES:
                got = sl[index]
                assert type(got) is type(self.make(array)), index
                assert self.dump(got) == self.expected(array[index]), index

    # -- devices ------------------------------------------------------------------------------------------------
    def test_non_cpu_devices_are_refused_like_the_reference(self, tmp_path: Path) -> None:
        path = self.write_numpy(tmp_path / "d.safetensors", {"t": sample("F32", (2,))})
        for name in (self.framework, *self.aliases):
            with safe_open(path, framework=name, device="cpu") as f:
                assert self.dump(f.get_tensor("t"))[1] == (2,)
            # The device as the reference spells it in the message (checked against it once, by hand).
            for device, spelled in (("cuda:0", "cuda:0"), ("cuda", "cuda:0"), ("xpu:1", "xpu:1"), ("npu", "npu:0"),
                                    ("mps", "mps"), ("mps:0", "mps"), (1, "1")):
                message = f"^Device {spelled} is not supported for framework {self.display_name}$"
                with pytest.raises(SafetensorError, match=message):
                    safe_open(path, framework=name, device=device)
            with pytest.raises(SafetensorError, match="^device gpu is invalid$"):
                safe_open(path, framework=name, device="gpu")

    # -- the reference ------------------------------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def reference_run(cls, reference: Any, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
        """One reference subprocess per framework: it saves every case, loads our files, and slices one."""
        self = cls()
        root = tmp_path_factory.mktemp(f"ref-{cls.framework}")
        to_save: Dict[Any, Any] = {code: ({"t": sample(code, (3, 5), 200 + i)}, None)
                                   for i, code in enumerate(ALL_CODES) if code in cls.reference_save_codes}
        to_save["mixed"] = (cls.mixed(), MIXED_METADATA)
        to_load: Dict[Any, str] = {}
        with self.exact():
            for i, code in enumerate(ALL_CODES):
                if code in cls.reference_load_codes:
                    path = root / f"ours-{code}.safetensors"
                    cls.module.save_file({"t": self.make(sample(code, (3, 5), 300 + i))}, path)
                    to_load[code] = str(path)
            to_load["mixed"] = str(root / "ours-mixed.safetensors")
            cls.module.save_file({k: self.make(v) for k, v in to_save["mixed"][0].items()}, to_load["mixed"],
                                 metadata=to_save["mixed"][1])
            slice_path = root / "ours-slice.safetensors"
            cls.module.save_file({"t": self.make(sample("F32", (4, 5, 6), 15))}, slice_path)
        to_slice = {i: (str(slice_path), index) for i, index in enumerate(REFERENCE_SLICES)}
        code = (f"import {cls.module_name} as MODULE\nFRAMEWORK = {cls.framework!r}\n" + cls.SETUP + _DRIVER)
        result = reference.run(code, to_save=to_save, to_load=to_load, to_slice=to_slice)
        result["paths"] = to_load
        return result

    def test_files_are_byte_identical_to_the_reference(self, reference_run: Dict[str, Any]) -> None:
        saved = reference_run["saved"]
        assert set(saved) == set(self.reference_save_codes) | {"mixed"}, reference_run["save_errors"]
        for i, code in enumerate(ALL_CODES):
            if code in self.reference_save_codes:
                with self.exact():
                    ours = self.module.save({"t": self.make(sample(code, (3, 5), 200 + i))})
                assert ours == saved[code], code
        mixed = {k: self.make(v) for k, v in self.mixed().items()}
        assert self.module.save(mixed, metadata=MIXED_METADATA) == saved["mixed"]

    def test_we_load_the_references_files(self, reference_run: Dict[str, Any], tmp_path: Path) -> None:
        for i, code in enumerate(ALL_CODES):
            if code in self.reference_save_codes and code in self.codes:
                want = self.expected(sample(code, (3, 5), 200 + i))
                with self.exact():
                    assert self.dump(self.module.load(reference_run["saved"][code])["t"]) == want, code
                    (tmp_path / "r.safetensors").write_bytes(reference_run["saved"][code])
                    assert self.dump(self.module.load_file(tmp_path / "r.safetensors")["t"]) == want, code
        tensors = self.mixed()
        mixed = self.module.load(reference_run["saved"]["mixed"])
        # File order: dtype rank descending, then name.
        assert list(mixed) == [k for k in ["e", "z.w", "a", "s", "m"] if k in tensors]
        assert {k: self.dump(v) for k, v in mixed.items()} == {k: self.expected(a) for k, a in tensors.items()}
        (tmp_path / "mixed.safetensors").write_bytes(reference_run["saved"]["mixed"])
        with safe_open(tmp_path / "mixed.safetensors", framework=self.framework) as f:
            assert f.metadata() == MIXED_METADATA

    def test_the_reference_loads_our_files_as_we_do(self, reference_run: Dict[str, Any]) -> None:
        contexts = self.ns()["CONTEXTS"]
        for ctx_index, ctx in enumerate(contexts):
            for _i, code in enumerate(ALL_CODES):
                if code not in self.reference_load_codes:
                    continue
                key = (ctx_index, code)
                assert key in reference_run["loaded"], reference_run["load_errors"].get(key)
                with ctx():
                    ours = self.dump(self.module.load_file(reference_run["paths"][code])["t"])
                assert reference_run["loaded"][key] == {"t": ours}, (ctx_index, code)
        key = (len(contexts) - 1, "mixed")
        assert key in reference_run["loaded"], reference_run["load_errors"].get(key)
        with self.exact():
            ours = {k: self.dump(v) for k, v in self.module.load_file(reference_run["paths"]["mixed"]).items()}
        assert reference_run["loaded"][key] == ours

    def test_slices_equal_the_references(self, reference_run: Dict[str, Any]) -> None:
        array = sample("F32", (4, 5, 6), 15)
        for i, index in enumerate(REFERENCE_SLICES):
            assert i in reference_run["sliced"], reference_run["slice_errors"].get(i)
            assert reference_run["sliced"][i] == self.expected(array[index]), index

