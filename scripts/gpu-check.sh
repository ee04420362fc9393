#!/usr/bin/env bash
# One prepared check of SGLang's GPU path with sgl-blend, for a short GPU loan (docs/gpu-check.md).
#   bash scripts/gpu-check.sh            on a bare GPU machine (Python 3.12, torch, no network): install
#                                        gpu-wheels/ (scripts/gpu-wheels.sh, carried with the tree),
#                                        then run every step of bench/gpu_check.py on CUDA
#   bash scripts/gpu-check.sh --dry-run  here: the same steps on the emulated H100, small files, the
#                                        project's .venv (no install), so the check cannot rot
# Writes gpu-check.json, gpu-check.md and gpu-check.log to $OUT (default ./gpu-check-out), after
# every step. It ends within $GPU_CHECK_BUDGET_S seconds (default 530: a 10-minute device call with
# room; 1500 for the dry run, whose shared CPU starts each SGLang server several times slower).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-./gpu-check-out}
mkdir -p "$out"
exec > >(tee -a "$out/gpu-check.log") 2>&1
dry_run=()
if [ "${1:-}" = "--dry-run" ]; then
  budget_s=${GPU_CHECK_BUDGET_S:-1500}
  dry_run=(--dry-run)
  python=.venv/bin/python
  work=$(mktemp -d /tmp/gpu-check-dry.XXXXXX)
  inputs=$work/inputs
  echo "[gpu-check] dry run: writing small inputs to $inputs"
  "$python" -m bench.gpu_check prepare --small --inputs "$inputs" || exit 1
  work=$work/work
else
  budget_s=${GPU_CHECK_BUDGET_S:-530}
  [ -f gpu-wheels/inputs.tar.xz ] || { echo "error: no gpu-wheels/: run scripts/gpu-wheels.sh where PyPI is reachable, and carry gpu-wheels" >&2; exit 1; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  # Into the image's own Python (itself a venv holding torch, triton and transformers: a venv made
  # from it would not see them); the machine is bare and given back after the loan.
  python=${GPU_CHECK_PYTHON:-python3}
  "$python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check gpu-wheels/*.whl || exit 1
  "$python" -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check -e . || exit 1
  # As scripts/setup.sh does: SGLang's scheduler and detokenizer are fresh interpreters, and each
  # must load the import stub of sgl_kernel (which cannot travel) before SGLang's first import.
  site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import sgl_blend.cpu_compat as _c; _c.install()" > "$site/sgl_blend_cpu_compat.pth"
  export SGLBLEND_KERNEL_STUB=1
  # With the stub, SGLang 0.5.23 stops at its sglang-kernel version check, and its fused ops
  # (RMSNorm, SiLU-and-mul, rotary) would call the stub: skip the check, run their torch paths.
  export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 SGLANG_FORCE_FUSED_OP_BACKEND=torch
  mkdir -p /tmp/gpu-check-inputs && tar -C /tmp/gpu-check-inputs -xJf gpu-wheels/inputs.tar.xz || exit 1
  inputs=/tmp/gpu-check-inputs/inputs
  work=/tmp/gpu-check-work
  echo "[gpu-check] installed in ${SECONDS} s"
fi
left=$((budget_s - SECONDS))
# The steps get what is left, less a margin for the last summary; timeout is the backstop.
PYTHONUNBUFFERED=1 timeout -k 10 "$left" "$python" -m bench.gpu_check run --inputs "$inputs" --out "$out" \
  --work "$work" --budget-s $((left - 15)) "${dry_run[@]}"
code=$?
echo "[gpu-check] done in ${SECONDS} s (exit $code); summary in $out/gpu-check.md"
cat "$out/gpu-check.md" 2>/dev/null
exit $code
