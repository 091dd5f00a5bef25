# The Python package's tests (pytest + hypothesis), including the differential suite against the reference
# implementation installed in .ref.
set -euo pipefail
cd "$ROOT"
export SAFETENSORS_REFERENCE_PATH="$ROOT/.ref"
python -m pytest -q -p no:cacheprovider tests/python
