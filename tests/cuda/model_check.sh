#!/bin/bash
# model_check.sh — the whole-model GPU check of issue 6, on a GPU machine (from the repo root):
#
#   tests/cuda/model_check.sh [BUILD_DIR] [OUT_DIR]        (defaults: build, runs/model_check)
#
#   1. a parity case of configs/tiny-cpu.yaml (tests/parity/make_case.py: random non-trivial
#      weights, a packed batch of 2 x 512 tokens with documents);
#   2. build/parity_step on it on cpu (fp32 oracle), on cpu with --emulate-bf16 (the cpu kernels
#      with every activation stored in bf16: what bf16 storage alone costs) and on cuda (--set
#      device.kind=cuda): one forward +
#      backward (every parameter gradient and the loss), then STEPS AdamW steps on that batch
#      (a loss curve that needs neither MPI nor a data set);
#   3. tests/cuda/compare_bf16.py: per tensor, the cuda gradient's error against cpu must stay
#      within max(2 x the bf16 emulation's error, 1e-2), the loss within 1e-2; the emulation's error
#      the largest of DRAWS (default 3) more one-step runs with stochastic rounding (--draw 1..DRAWS,
#      compare_bf16.py --draws: what one draw of the rounding says about a gradient that cancels);
#      tests/cuda/compare_curves.py: every step's |loss_cuda - loss_cpu| / first loss <= CURVE_TOL
#      (the bf16 emulation's curve is printed beside it for scale);
#   4. `ringscan train` of the config on cuda, one rank, TRAIN_STEPS steps on synthetic data: the
#      trainer's cuda wiring (device metadata, memory report); it needs an MPI runtime (MPI_Init).
#
# CASE_SETS: config overrides (KEY=VALUE, space-separated) for the case and the training run, e.g.
#   CASE_SETS="model.linear_attention=kda model.linear_num_value_heads=2"   (a KDA hybrid: issue 39)
# Needs the attention and GDN kernels (kernels/cuda/attention/, gdn/gdn.cu). Exit 0 when
# every check passed. tests/cuda/README.md records what the device runs measured.
set -u -o pipefail
B=${1:-build}
O=${2:-runs/model_check}
PY=${PYTHON:-python3}
STEPS=${STEPS:-50}
TRAIN_STEPS=${TRAIN_STEPS:-20}
CURVE_TOL=${CURVE_TOL:-1e-2}
THREADS=${THREADS:-8}
DRAWS=${DRAWS:-3}
SETS=()
for kv in ${CASE_SETS:-}; do SETS+=(--set "$kv"); done
HERE=$(dirname "$0")
rc=0
rm -rf "$O" && mkdir -p "$O" || exit 2

echo "== case"
$PY tests/parity/make_case.py configs/tiny-cpu.yaml "$O/case" --ringscan "$B/ringscan" "${SETS[@]}" 2>&1 | grep -v Warning || exit 1
echo "== one step + $STEPS steps on the batch: cpu, cpu with bf16 storage, cuda"
C="$O/case"
"$B/parity_step" "$C" --out "$C/grads_cpu.safetensors" --steps "$STEPS" --threads "$THREADS" > "$O/cpu.log" 2>&1 &
"$B/parity_step" "$C" --emulate-bf16 --out "$C/grads_bf16.safetensors" --steps "$STEPS" --threads "$THREADS" \
    > "$O/bf16.log" 2>&1 &
"$B/parity_step" "$C" --set device.kind=cuda --out "$C/grads_cuda.safetensors" --steps "$STEPS" | grep -v counters || rc=1
wait
DRAW_FILES=""
for d in $(seq 1 "$DRAWS"); do
    "$B/parity_step" "$C" --emulate-bf16 --draw "$d" --out "$C/grads_draw$d.safetensors" --threads "$THREADS" \
        > "$O/draw$d.log" 2>&1 &
    DRAW_FILES="$DRAW_FILES${DRAW_FILES:+,}$C/grads_draw$d.safetensors"
done
wait
grep -hv counters "$O/cpu.log" "$O/bf16.log"
$PY "$HERE/compare_bf16.py" "$C/grads_cpu.safetensors" "$C/grads_cuda.safetensors" "$C/grads_bf16.safetensors" \
    --draws "$DRAW_FILES" || rc=1
echo "-- curve, cuda vs cpu"
$PY "$HERE/compare_curves.py" "$C/grads_cpu.safetensors.curve.jsonl" "$C/grads_cuda.safetensors.curve.jsonl" \
    --tol "$CURVE_TOL" || rc=1
echo "-- curve, cpu with bf16 storage vs cpu (for scale)"
$PY "$HERE/compare_curves.py" "$C/grads_cpu.safetensors.curve.jsonl" "$C/grads_bf16.safetensors.curve.jsonl" \
    --tol "$CURVE_TOL" | tail -1

echo "== ringscan train on cuda, $TRAIN_STEPS steps"
"$B/ringscan" data synth "$O/recall.tok" --seed 1 > /dev/null || exit 1
"$B/ringscan" train configs/tiny-cpu.yaml --set device.kind=cuda --set parallel.dp=1 --set parallel.cp=1 \
    --set train.steps="$TRAIN_STEPS" --set train.warmup_steps=$((TRAIN_STEPS / 2)) --set data.path="$O/recall.tok" --set run.out_dir="$O/train_cuda" \
    --set checkpoint.every="$TRAIN_STEPS" "${SETS[@]}" > "$O/train_cuda.log" 2>&1 || { rc=1; echo "train failed:"; }
grep -E "^memory|^step|error|rror" "$O/train_cuda.log" | tail -8
echo "model_check: $([ $rc = 0 ] && echo ok || echo FAILED)"
exit $rc
