#!/bin/bash
# build.sh (glue_emu) — builds OUT/emu_conv, OUT/emu_norm, OUT/emu_ew: the glue kernels' device code (cut out by
# extract.py) under the host emulation of emu.h, against the cpu oracle objects of an existing build (BUILD: build/
# by default; `make CUDA=0 build/test_ops` or any full build provides them). Usage: build.sh [OUT] [BUILD]; then run
# each binary (exit status 1 and FAIL lines when a kernel disagrees with the oracle).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:-$ROOT/build/glue_emu}
BUILD=${2:-$ROOT/build}
E=$ROOT/tests/cuda/glue_emu
CXX=${CXX:-g++}
mkdir -p "$OUT"
python3 "$E/extract.py" "$ROOT" "$OUT"
FLAGS="-std=c++20 -O2 -pthread -fno-strict-aliasing -w -I$E -I$OUT"
pids=()
# the conv's oracle objects include cpu_norm.o (and its copies, cpu_memory.o): the fused GDN conv + split's
# oracle is the conv and the split
for k in conv:cpu_conv,cpu_norm,cpu_memory norm:cpu_norm ew:cpu_elementwise; do
    objs=()
    IFS=, read -ra names <<< "${k#*:}"
    for n in "${names[@]}"; do objs+=("$BUILD/kernels/cpu/$n.o"); done
    $CXX $FLAGS -o "$OUT/emu_${k%%:*}" "$E/emu_${k%%:*}.cpp" "${objs[@]}" "$BUILD/lib/core/error.o" -lm &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "built $OUT/emu_conv $OUT/emu_norm $OUT/emu_ew"
