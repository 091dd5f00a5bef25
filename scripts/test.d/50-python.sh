# The Python package: a wheel builds (and holds the native module, its stubs and the CLI entry point), then
# its tests run (pytest + hypothesis), including the differential suites against the reference in .ref.
set -euo pipefail
cd "$ROOT"
rm -rf build/wheel
python -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w build/wheel . 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
wheel=$(ls build/wheel/safetensors-*.whl)
python - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["safetensors/__init__.py", "safetensors/torch.py", "safetensors/_safetensors_cpp/__init__.pyi",
        "safetensors/_safetensors_cpp/engine.pyi", "safetensors/_safetensors_cpp/sharded.pyi", "safetensors/py.typed"]
missing = [n for n in need if n not in names]
assert not missing, missing
assert any(n.startswith("safetensors/_safetensors_cpp") and n.endswith(".so") for n in names), names
entry = [n for n in names if n.endswith("entry_points.txt")]
assert entry and b"safetensors = safetensors._cli:main" in zipfile.ZipFile(sys.argv[1]).read(entry[0]), entry
print("wheel ok:", sys.argv[1].split("/")[-1], len(names), "files")
PY
export SAFETENSORS_REFERENCE_PATH="$ROOT/.ref"
# -rs: the summary lists every skipped suite and why (no FUSE, no root mounts or namespaces, no CUDA, ...).
python -m pytest -q -p no:cacheprovider -rs tests/python
