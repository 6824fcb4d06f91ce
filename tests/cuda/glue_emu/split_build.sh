#!/bin/bash
# split_build.sh (glue_emu) — builds OUT/split_cmp: the fused GDN conv + split kernels of a base revision and of the
# working tree (kernels/cuda/cuda_gdn_conv_split.cu, or cuda_conv.cu in revisions before that file: extract.py cuts
# out either layout) under the host emulation (emu.h), both run on the same inputs and every output compared bitwise
# (split_cmp.cpp). For speed rounds that must keep the bits.
# Usage: split_build.sh BASE [OUT]; then OUT/split_cmp (exit 1 on a difference).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
BASE=${1:?usage: split_build.sh BASE [OUT]}
OUT=${2:-$ROOT/build/split_cmp}
E=$ROOT/tests/cuda/glue_emu
CXX=${CXX:-g++}
rm -rf "$OUT/base_root"
mkdir -p "$OUT/base_root" "$OUT/base" "$OUT/tree"
git -C "$ROOT" archive "$BASE" kernels/cuda | tar -x -C "$OUT/base_root"
python3 "$E/extract.py" "$OUT/base_root" "$OUT/base"
python3 "$E/extract.py" "$ROOT" "$OUT/tree"
FLAGS="-std=c++20 -O2 -pthread -fno-strict-aliasing -w -I$E"
$CXX $FLAGS -I"$OUT/base" -DSPLIT_SIDE=split_side_base -c "$E/split_side.cpp" -o "$OUT/side_base.o" &
p1=$!
$CXX $FLAGS -I"$OUT/tree" -DSPLIT_SIDE=split_side_tree -c "$E/split_side.cpp" -o "$OUT/side_tree.o" &
p2=$!
$CXX $FLAGS -c "$E/split_cmp.cpp" -o "$OUT/split_cmp.o" &
p3=$!
wait $p1 && wait $p2 && wait $p3
$CXX -pthread -o "$OUT/split_cmp" "$OUT/split_cmp.o" "$OUT/side_base.o" "$OUT/side_tree.o" -lm
echo "built $OUT/split_cmp ($BASE against the working tree)"
