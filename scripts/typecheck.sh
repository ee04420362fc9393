#!/usr/bin/env bash
# Type-checks the installed package as Python imports it. `server/` and `kernels/` install as
# `sgl_blend.server` and `sgl_blend.kernels` (pyproject's package-dir), a mapping mypy cannot read
# from an editable install, so it checks a tree of links laid out as the package is.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/sgl_blend"
for entry in sgl_blend/*; do ln -s "$root/$entry" "$tree/$entry"; done
ln -s "$root/server" "$tree/sgl_blend/server"
ln -s "$root/kernels" "$tree/sgl_blend/kernels"
cd "$tree"
exec "$root/.venv/bin/python" -m mypy --config-file "$root/pyproject.toml" -p sgl_blend
