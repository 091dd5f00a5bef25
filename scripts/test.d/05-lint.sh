# House style, before anything is built: clang-format (.clang-format) on every C and C++ file git tracks, and
# ruff (pyproject.toml's [tool.ruff]) on every Python file. Fix with `clang-format-14 -i FILE` / `ruff check --fix`.
set -euo pipefail
cd "$ROOT"
git ls-files -z '*.c' '*.cc' '*.h' | xargs -0 clang-format-14 --dry-run -Werror
ruff check --no-cache .
echo "lint: clang-format and ruff clean"
