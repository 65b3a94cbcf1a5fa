#!/usr/bin/env bash
# The wheelhouse a GPU machine without network needs to run benchmarks/gpu_check.py: carbonflow itself (built
# from this tree) and those of its runtime dependencies on the script's code paths that such a machine lacks,
# as wheels for CPython 3.12 on x86-64 Linux, each at the version constraints.txt pins. Nothing else: the GPU
# machine already has torch, torchvision, nvidia-ml-py, numpy, pandas, psutil, py-cpuinfo, requests, click,
# typer, rich and typing-extensions (docs/gpu-check.md). The script's code paths import pydantic (models,
# wrapper results) and codecarbon with RapidFuzz (the CPU device's estimate when RAPL is not readable, as in
# a VM).
#
#   bash scripts/device-wheels.sh [DIR]      (default DIR: .whl, git-ignored; `make device-wheels`)
#
# On the GPU machine, from the repository root, into the interpreter's own environment (not a PYTHONPATH: the
# wrapper gives a training only an allow-list of its environment):
#   python3 -m pip install -q --no-index --no-deps --no-compile --root-user-action=ignore DIR/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.whl}"
PYTHON="${PYTHON:-python3}"
MAX_MIB=40  # the tree that travels to a lent GPU machine is limited to 64 MiB, wheels included
# The packages carried, by their names in constraints.txt (pip normalises - _ . and case).
# codecarbon's other dependencies (arrow, Authlib, questionary, ...) are not imported on these paths.
PACKAGES=(pydantic pydantic_core annotated-types typing-inspection codecarbon RapidFuzz)

pinned() {  # NAME -> NAME==VERSION from constraints.txt (a clear error when it is not pinned there)
  local norm line
  norm=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  line=$(awk -F'==' -v want="$norm" '{n=tolower($1); gsub(/[_.]/, "-", n)} n == want {print; exit}' constraints.txt)
  if [ -z "$line" ]; then
    echo "error: package $1 is not pinned in constraints.txt; pin it there (make constraints) or drop it" >&2
    exit 1
  fi
  echo "$line"
}

specs=()
for name in "${PACKAGES[@]}"; do specs+=("$(pinned "$name")"); done
rm -rf "$DIR" && mkdir -p "$DIR"
echo "downloading ${#specs[@]} wheels for CPython 3.12, x86-64 Linux, into $DIR"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$DIR" "${specs[@]}"
echo "building carbonflow's own wheel from this tree"
"$PYTHON" -m pip wheel -q --no-deps -w "$DIR" .
count=$(ls "$DIR"/*.whl | wc -l)
if [ "$count" -ne $(( ${#specs[@]} + 1 )) ]; then
  echo "error: expected $(( ${#specs[@]} + 1 )) wheels in $DIR, found $count: $(ls "$DIR")" >&2
  exit 1
fi
size_kib=$(du -sk "$DIR" | cut -f1)
if [ "$size_kib" -gt $(( MAX_MIB * 1024 )) ]; then
  echo "error: $DIR holds ${size_kib} KiB of wheels, over the ${MAX_MIB} MiB kept for them" >&2
  exit 1
fi
echo "$count wheels, $(( size_kib / 1024 )) MiB, in $DIR:"
ls "$DIR"
