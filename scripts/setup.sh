#!/usr/bin/env bash
# Creates .venv with sgl-blend on SGLang 0.5.23 for this CPU, and prepares the bundled models.
# Idempotent: a stamp records the hash of what was installed, so a second run only checks it.
#   scripts/setup.sh            install (or verify) the CPU environment and prepare models
#   scripts/setup.sh --relock   resolve requirements/cpu.in afresh and rewrite cpu-lock.txt
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
python_bin=${PYTHON:-python3.11}
command -v "$python_bin" >/dev/null || python_bin=python3

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv"
  "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

if [ "${1:-}" = "--relock" ]; then
  "${pip[@]}" install torch==2.13.0
  "${pip[@]}" install --no-deps sglang==0.5.23 torchvision==0.28.0
  "${pip[@]}" install -r requirements/cpu.in torch==2.13.0
  { sed -n '1,2p' requirements/cpu-lock.txt; "${pip[@]}" freeze --exclude-editable | grep -vE '^(sgl-blend|sgl_blend)'; } > requirements/cpu-lock.new
  mv requirements/cpu-lock.new requirements/cpu-lock.txt
  rm -f "$venv/.sgl-blend-stamp"
fi

stamp_file="$venv/.sgl-blend-stamp"
want=$(cat requirements/cpu-lock.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing the pinned CPU environment (requirements/cpu-lock.txt)"
  "${pip[@]}" install -q torch==2.13.0
  "${pip[@]}" install -q --no-deps -r requirements/cpu-lock.txt
  "${pip[@]}" install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp_file"
else
  echo "[setup] .venv is up to date"
fi

# SGLang starts its scheduler and detokenizer as fresh interpreters: the CPU compatibility finder
# must be installed in each of them before its first SGLang import, hence a .pth start-up line.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pth="$site/sgl_blend_cpu_compat.pth"
line="import sgl_blend.cpu_compat as _c; _c.install()"
[ "$(cat "$pth" 2>/dev/null)" = "$line" ] || echo "$line" > "$pth"

"$venv/bin/sgl-blend" models prepare
