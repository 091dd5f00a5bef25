"""Checks an installed safetensors wheel on a bare system (scripts/test.d/70-wheels.sh runs it in each root).

    python check_wheel.py WORKDIR EXPECTED_TAG

EXPECTED_TAG is the tag the wheel was built for (e.g. cp311-cp311-manylinux_2_17_aarch64): pip must have chosen
that wheel for this interpreter. Then: the package and its native module come from the installed wheel, files
round-trip byte for byte with numpy (every dtype numpy holds, both backends, slices, metadata, errors), and with
torch where torch is installed (every torch dtype, safe_open, save_model/load_model), and what a URL
does without libcurl on the system. WORKDIR receives
files the stage then reads with the `safetensors` command. Needs only the standard library and numpy; prints
one line per check and exits non-zero on the first failure.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import struct
import sys
import sysconfig
from pathlib import Path


def check(label: str, condition: bool, detail: object = "") -> None:
    if not condition:
        sys.exit(f"FAILED: {label} {detail}")
    print(f"ok  {label}")


def expected_file(name: str, code: str, shape: list, data: bytes) -> bytes:
    """The bytes the format prescribes for one tensor (COMPAT.md section 1): the header padded with spaces to a
    multiple of 8, as the reference writes it."""
    header = json.dumps({name: {"dtype": code, "shape": shape, "data_offsets": [0, len(data)]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def installed(module: str) -> bool:
    """Whether `module` is installed; one that is installed but fails to import fails the check."""
    return importlib.util.find_spec(module) is not None


def check_install(tag: str) -> None:
    import safetensors
    from safetensors import _safetensors_cpp

    package = Path(safetensors.__file__).resolve().parent
    check("safetensors imported from the installed wheel",
          "site-packages" in package.parts or "dist-packages" in package.parts, package)
    check("native module is the wheel's", Path(_safetensors_cpp.__file__).resolve().parent == package,
          _safetensors_cpp.__file__)
    dist = importlib.metadata.distribution("safetensors")
    check("version", dist.version == safetensors.__version__, (dist.version, safetensors.__version__))
    wheel_tags = [line.split(": ", 1)[1] for line in dist.read_text("WHEEL").splitlines() if line.startswith("Tag:")]
    python, abi, platforms = tag.split("-")
    want = {f"{python}-{abi}-{p}" for p in platforms.split(".")}
    check(f"pip chose the {tag} wheel", set(wheel_tags) == want, wheel_tags)
    scripts = [e for e in dist.entry_points if e.group == "console_scripts"]
    check("console script safetensors", [(e.name, e.value) for e in scripts] == [("safetensors",
          "safetensors._cli:main")], scripts)


def check_numpy(work: Path) -> None:
    if not installed("numpy"):
        print("--  numpy not installed: numpy checks skipped")
        return
    import numpy as np
    from safetensors import SafetensorError, TensorSpec, deserialize, safe_open, serialize
    from safetensors.numpy import load, load_file, save, save_file

    print(f"--  numpy {np.__version__}")
    data = np.arange(6, dtype="<f4").reshape(2, 3)
    check("numpy save: the format's bytes", save({"w": data}) == expected_file("w", "F32", [2, 3], data.tobytes()))
    big = data.astype(">f4")  # a big-endian array is written little-endian
    check("numpy save of a big-endian array", save({"w": big}) == save({"w": data}))

    rng = np.random.default_rng(0)
    arrays = {
        "bool": rng.integers(0, 2, (3, 4)).astype(np.bool_),
        "u8": rng.integers(0, 255, (5,), dtype=np.uint8),
        "i8": rng.integers(-128, 127, (2, 2), dtype=np.int8),
        "i16": rng.integers(-1000, 1000, (3,), dtype=np.int16),
        "u16": rng.integers(0, 60000, (3,), dtype=np.uint16),
        "i32": rng.integers(-(2**31), 2**31 - 1, (4, 1), dtype=np.int32),
        "u32": rng.integers(0, 2**32 - 1, (4,), dtype=np.uint32),
        "i64": rng.integers(-(2**62), 2**62, (2, 3), dtype=np.int64),
        "u64": rng.integers(0, 2**63, (2,), dtype=np.uint64),
        "f16": rng.standard_normal((3, 3)).astype(np.float16),
        "f32": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "f64": rng.standard_normal((7,)),
        "c64": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.int32),
    }
    path = work / "numpy.safetensors"
    save_file(arrays, str(path), metadata={"format": "np"})
    for backend in ("mmap", "pread"):
        loaded = load_file(str(path), backend=backend)
        same = all(loaded[k].dtype == v.dtype and loaded[k].shape == v.shape and np.array_equal(loaded[k], v)
                   for k, v in arrays.items())
        check(f"numpy round trip of {len(arrays)} dtypes/shapes ({backend})", same and loaded.keys() == arrays.keys())
    check("numpy load(bytes)", all(np.array_equal(load(path.read_bytes())[k], v) for k, v in arrays.items()))
    # A TensorSpec describes native memory (README, "Big-endian hosts"); deserialize gives the file's bytes.
    native = data.astype("=f4")
    spec = TensorSpec(dtype="float32", shape=[2], data_ptr=native.ctypes.data, data_len=8)
    check("serialize/deserialize", [(n, t["dtype"], t["shape"], bytes(t["data"])) for n, t in
                                    deserialize(serialize({"a": spec}))] == [("a", "F32", [2], data.tobytes()[:8])])
    with safe_open(str(path), framework="np") as f:
        check("safe_open metadata", f.metadata() == {"format": "np"}, f.metadata())
        check("safe_open slice [1:, ::2, -1]", np.array_equal(f.get_slice("f32")[1:, ::2, -1],
                                                            arrays["f32"][1:, ::2, -1]))
        check("safe_open get_tensor_meta", f.get_tensor_meta("i64").shape == [2, 3])
    bad = bytearray(path.read_bytes())
    bad[8] = ord("[")
    try:
        load(bytes(bad))
        check("a corrupt header is refused", False)
    except SafetensorError as e:
        check("a corrupt header is refused", "(InvalidHeaderDeserialization)" in str(e), e)
    if not installed("ml_dtypes"):
        print("--  ml_dtypes not installed: bfloat16/float8 numpy checks skipped")
    else:
        import ml_dtypes

        ext = {"bf16": np.arange(4).astype(ml_dtypes.bfloat16), "f8": np.arange(4).astype(ml_dtypes.float8_e4m3fn)}
        check("numpy round trip of bfloat16 and float8 (ml_dtypes)",
              all(np.array_equal(load(save(ext))[k].astype(np.float32), v.astype(np.float32)) for k, v in ext.items()))


def check_torch(work: Path) -> None:
    if not installed("torch"):
        print("--  torch not installed: torch checks skipped")
        return
    import torch
    from safetensors import safe_open
    from safetensors.torch import load, load_file, load_model, save, save_file, save_model

    print(f"--  torch {torch.__version__}")
    torch.manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 4),
        "f16": torch.randn(5).half(),
        "bf16": torch.randn(2, 2).bfloat16(),
        "f64": torch.randn(2, dtype=torch.float64),
        "i64": torch.arange(-3, 3),
        "u8": torch.arange(0, 200, 7, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "f8": torch.randn(4).to(torch.float8_e4m3fn),
        "c64": torch.randn(3, dtype=torch.complex64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 2),
    }
    path = work / "torch.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    for backend in ("mmap", "pread"):
        loaded = load_file(str(path), backend=backend)
        check(f"torch round trip of {len(tensors)} dtypes ({backend})", loaded.keys() == tensors.keys() and all(
            loaded[k].dtype == v.dtype and torch.equal(loaded[k].view(torch.uint8), v.view(torch.uint8))
            if v.dtype == torch.float8_e4m3fn else loaded[k].dtype == v.dtype and torch.equal(loaded[k], v)
            for k, v in tensors.items()))
    check("torch save(bytes) equals the file", save(tensors, metadata={"format": "pt"}) == path.read_bytes())
    check("torch load(bytes)", torch.equal(load(path.read_bytes())["f32"], tensors["f32"]))
    with safe_open(str(path), framework="pt") as f:
        check("torch safe_open slice", torch.equal(f.get_slice("f32")[:, 1:3], tensors["f32"][:, 1:3]))
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 4))
    model[1].weight = torch.nn.Parameter(model[0].weight.t().contiguous())
    save_model(model, str(work / "model.safetensors"))
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 4))
    missing, unexpected = load_model(other, str(work / "model.safetensors"))
    check("torch save_model/load_model", not missing and not unexpected and all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values())))


def check_remote() -> None:
    """A URL needs libcurl, which the wheel does not carry: it is loaded from the system when a URL is first
    opened. Where the system has it, a URL nobody answers is an I/O error naming it; where it has not, the error
    says what is missing. Local files never need it (the checks above ran either way)."""
    import ctypes

    from safetensors import SafetensorError, safe_open

    url = "http://127.0.0.1:1/model.safetensors"
    try:
        safe_open(url, "np", storage_options={"max_retries": 0})
    except SafetensorError as e:
        text = str(e)
    else:
        text = "no error"
    try:
        ctypes.CDLL("libcurl.so.4")  # the loader's search, as the library's dlopen makes it
        have_libcurl = True
    except OSError:
        have_libcurl = False
    if not have_libcurl:
        check("a URL without libcurl says what is missing", "need libcurl" in text, text)
    else:
        check("a URL nobody answers names it", url in text and "Connection refused" in text, text)


def main() -> None:
    work, tag = Path(sys.argv[1]), sys.argv[2]
    work.mkdir(parents=True, exist_ok=True)
    print(f"--  Python {sys.version.split()[0]} on {sysconfig.get_platform()}")
    check_install(tag)
    check_numpy(work)
    check_torch(work)
    check_remote()


if __name__ == "__main__":
    main()
