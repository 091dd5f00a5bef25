"""Byte-order checks of the Python package with numpy, run on both hosts of the big-endian stage
(scripts/test.d/60-big-endian.sh): the x86-64 host and an s390x Python under qemu.

    python check_numpy.py write DIR   saves the golden arrays to DIR/numpy-<byteorder>.safetensors
    python check_numpy.py check DIR   round trips on this host, then every numpy-*.safetensors in DIR (written
                                      on either host) and DIR/cpp-*.safetensors (tests/cpp/cross_host_file) read
                                      back to the golden values, with the golden little-endian bytes

Only numpy's own dtypes: Debian's s390x Python has no ml_dtypes (bfloat16, float8), so the C++ golden file's
BF16 and F4 tensors are checked by the C++ side only. Exits non-zero with a message on the first mismatch.
"""

import glob
import os
import sys

import numpy as np

from safetensors import SafetensorError, TensorSpec, deserialize, safe_open, serialize
from safetensors.numpy import load, load_file, save, save_file

# name -> (array in this host's byte order, the little-endian bytes the file must hold: spelled with an
# explicit "<" dtype, so the same on every host). The values are golden_le.h's where both have the name.
GOLDEN = {
    "u64": np.array([0x0102030405060708], dtype=np.uint64),
    "i64": np.array([-2, 0x1122334455667788], dtype=np.int64),
    "f64": np.array([-1.5], dtype=np.float64),
    "c64": np.array([1.0 - 2.0j], dtype=np.complex64),
    "f32": np.array([0.5, 3.0], dtype=np.float32),
    "u32": np.array([0xA1B2C3D4], dtype=np.uint32),
    "i32": np.array([[1], [-1], [0x01020304]], dtype=np.int32),
    "f16": np.array([1.0], dtype=np.float16),
    "u16": np.array([0xBEEF], dtype=np.uint16),
    "i16": np.array([-2, 0x0102], dtype=np.int16),
    "u8": np.array([1, 2, 3], dtype=np.uint8),
    "bool": np.array([True, False]),
}
LITTLE = {name: a.astype(a.dtype.newbyteorder("<")).tobytes() for name, a in GOLDEN.items()}
# Spelled out for two of them, so a host that got "<" wrong cannot agree with itself.
assert LITTLE["u64"] == bytes([8, 7, 6, 5, 4, 3, 2, 1]) and LITTLE["f32"] == b"\x00\x00\x00\x3f\x00\x00\x40\x40"


def fail(message):
    sys.exit(f"check_numpy ({sys.byteorder}-endian): {message}")


def expect_golden(arrays, what, names=GOLDEN):
    for name in names:
        got = arrays[name]
        want = GOLDEN[name]
        if got.dtype != want.dtype or not got.dtype.isnative or got.shape != want.shape or not np.array_equal(got, want):
            fail(f"{what}: {name} is {got!r} ({got.dtype.str}), expected {want!r} ({want.dtype.str})")


def expect_file_bytes(path, names=GOLDEN):
    data = open(path, "rb").read()
    for name, entry in deserialize(data):  # deserialize gives the file's own bytes
        if name in names and bytes(entry["data"]) != LITTLE[name]:
            fail(f"{path}: {name} holds {bytes(entry['data']).hex()}, expected {LITTLE[name].hex()}")


def round_trips(tmp):
    path = os.path.join(tmp, f"roundtrip-{sys.byteorder}.safetensors")
    save_file(GOLDEN, path)
    expect_file_bytes(path)
    for backend in ("mmap", "pread"):
        expect_golden(load_file(path, backend=backend), f"load_file(backend={backend})")
        with safe_open(path, "np", backend=backend) as f:
            expect_golden({k: f.get_tensor(k) for k in f.keys()}, f"get_tensor({backend})")
            expect_golden(f.get_tensors(), f"get_tensors({backend})")
            rows = f.get_slice("i32")[1:]
            if rows.tolist() != [[-1], [0x01020304]]:
                fail(f"get_slice(i32)[1:] on {backend} is {rows!r}")
            if f.get_slice("i64")[1] != 0x1122334455667788:
                fail(f"get_slice(i64)[1] on {backend}")
    data = save(GOLDEN)
    if data != open(path, "rb").read():
        fail("save() differs from save_file()")
    expect_golden(load(data), "load(bytes)")
    # A non-native byte order is saved by value: the file holds the same little-endian bytes.
    swapped = {k: v.astype(v.dtype.newbyteorder("S")) for k, v in GOLDEN.items()}
    if save(swapped) != data:
        fail("arrays in the other byte order saved different bytes")
    # The raw path: TensorSpec over native memory, serialize, deserialize.
    f32 = GOLDEN["f32"]
    spec = TensorSpec(dtype="float32", shape=[2], data_ptr=f32.ctypes.data, data_len=f32.nbytes)
    raw = serialize({"f32": spec})
    if raw != save({"f32": f32}):
        fail("serialize(TensorSpec) differs from save()")
    if not np.array_equal(GOLDEN["f32"], np.array([0.5, 3.0], dtype=np.float32)):
        fail("serialize modified the caller's memory")
    ((name, entry),) = deserialize(raw)
    if bytes(entry["data"]) != LITTLE["f32"]:
        fail("deserialize did not give the file's little-endian bytes")


def check(directory):
    round_trips(directory)
    files = sorted(glob.glob(os.path.join(directory, "numpy-*.safetensors")))
    if not files:
        fail(f"no numpy-*.safetensors in {directory}")
    for path in files:
        expect_file_bytes(path)
        for backend in ("mmap", "pread"):
            expect_golden(load_file(path, backend=backend), f"{os.path.basename(path)} ({backend})")
    for path in sorted(glob.glob(os.path.join(directory, "cpp-*.safetensors"))):
        expect_file_bytes(path)
        with safe_open(path, "np") as f:
            expect_golden({n: f.get_tensor(n) for n in GOLDEN}, os.path.basename(path))
            try:
                bf16 = f.get_tensor("bf16")  # BF16 1.0 and -3.0: numpy holds it only with ml_dtypes
            except SafetensorError:
                pass
            else:
                if bf16.astype(np.float32).tolist() != [1.0, -3.0]:
                    fail(f"{path}: bf16 is {bf16!r}")
        files.append(path)
    print(f"check_numpy: {sys.byteorder}-endian host, numpy {np.__version__}: round trips and "
          f"{len(files)} files ok: {', '.join(os.path.basename(p) for p in files)}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        sys.exit("usage: check_numpy.py write|check DIR")
    if sys.argv[1] == "write":
        save_file(GOLDEN, os.path.join(sys.argv[2], f"numpy-{sys.byteorder}.safetensors"))
    else:
        check(sys.argv[2])


if __name__ == "__main__":
    main()
