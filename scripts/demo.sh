#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the demo: a GPT-2-sized checkpoint saved, inspected, loaded
# back on every available device, and a speed comparison with the reference and torch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SAFETENSORS_REFERENCE_PATH="$PWD/.ref"
exec .venv/bin/python examples/python/demo.py
