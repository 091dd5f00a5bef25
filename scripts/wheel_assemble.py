"""Assembles one wheel from an unpacked sdist, a metadata directory and a built native module (scripts/wheel.sh).

The wheel holds what scikit-build-core's own wheel holds: the package directory python/safetensors of the sdist
(every file but caches and native modules), the module, and a .dist-info with the METADATA and entry_points.txt
the build backend wrote (prepare_metadata_for_build_wheel), a WHEEL naming the tags, and a RECORD. Files are
stored sorted with one fixed timestamp, so the same inputs give the same bytes.

    python wheel_assemble.py SDIST_DIR METADATA_DIR MODULE TAG OUT_DIR   -> prints the wheel's path
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

# 1980-01-01, the earliest time a zip entry can hold (what SOURCE_DATE_EPOCH=315532800 gives other tools).
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def wheel_file(tag: str) -> bytes:
    python, abi, platforms = tag.split("-")
    lines = ["Wheel-Version: 1.0", "Generator: safetensors scripts/wheel_assemble.py", "Root-Is-Purelib: false"]
    lines += [f"Tag: {python}-{abi}-{platform}" for platform in platforms.split(".")]
    return ("\n".join(lines) + "\n\n").encode()


def main(sdist_dir: str, metadata_dir: str, module: str, tag: str, out_dir: str) -> None:
    metadata = Path(metadata_dir)
    dist_info = metadata.name  # safetensors-VERSION.dist-info
    name_version = dist_info[: -len(".dist-info")]
    package = Path(sdist_dir) / "python" / "safetensors"
    files: dict[str, bytes] = {}
    for path in sorted(package.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix in (".so", ".pyc"):
            continue
        files[f"safetensors/{path.relative_to(package).as_posix()}"] = path.read_bytes()
    files[f"safetensors/{Path(module).name}"] = Path(module).read_bytes()
    for name in ("METADATA", "entry_points.txt"):
        files[f"{dist_info}/{name}"] = (metadata / name).read_bytes()
    files[f"{dist_info}/WHEEL"] = wheel_file(tag)
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()

    wheel = Path(out_dir) / f"{name_version}-{tag}.whl"
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            executable = name.endswith(".so")
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            zf.writestr(info, data, compresslevel=9)
    print(wheel)


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])
