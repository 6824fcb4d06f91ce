# gpu_case.sh — sourced by tests/cuda/cp_gpu_check.sh and tests/cuda/long_gpu_check.sh: their shared
# set-up, parity case and the helpers that run and judge build/parity_step on it. Reads the callers'
# B (build dir), O (output dir) and the environment's CASE_SETS ("key=value ..." config overrides of the case,
# as model_check.sh takes them, e.g. a KDA hybrid) and DRAWS (stochastic-rounding draws of the bf16 emulation,
# gpu_case_draws; default 3); sets PY (python3), HERE (tests/cuda), MPI2 (mpirun on 2 GPUs), SETS (CASE_SETS as
# --set arguments), rc = 0, an empty O, C (the case dir, gpu_case_make) and DRAW_FILES (gpu_case_draws); a failure
# sets rc=1.
PY=${PYTHON:-python3}
HERE=$(dirname "${BASH_SOURCE[0]}")
export NCCL_NVLS_ENABLE=0
MPI2=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH)
SETS=()
for kv in ${CASE_SETS:-}; do SETS+=(--set "$kv"); done
DRAW_FILES=""
rc=0
rm -rf "$O" && mkdir -p "$O" || exit 2

# gpu_case_make: the parity case of configs/tiny-cpu.yaml, 2 x 1024 tokens, documents starting on the
# rank boundaries of cp 2 (256, 512, 768), one token after them, inside fragments, and a sample that
# starts inside a document (tests/test_cp.py's "boundaries" layout)
gpu_case_make() {
    echo "== case (2 x 1024 tokens, documents on the cp 2 boundaries)"
    local docs='[{"lengths": [64, 1, 63, 1, 127, 1, 43, 84, 1, 127, 1, 187, 68, 1, 127, 64, 1, 63], "carry": 0},
                 {"lengths": [300, 5, 600, 119], "carry": 100}]'
    $PY tests/parity/make_case.py configs/tiny-cpu.yaml "$O/case" --seq-len 1024 --batch 2 --seed 3 --docs "$docs" \
        --ringscan "$B/ringscan" "${SETS[@]}" 2>&1 | grep -v Warning || exit 1
    C="$O/case"
}

# step NAME [launcher...] -- parity_step args: one forward + backward into $C/NAME.safetensors
step() {
    local name=$1
    shift
    local pre=()
    while [ "$1" != "--" ]; do pre+=("$1"); shift; done
    shift
    if ! timeout 300 "${pre[@]}" "$B/parity_step" "$C" --out "$C/$name.safetensors" "$@" > "$O/$name.log" 2>&1; then
        echo "parity_step $name FAILED:"
        tail -5 "$O/$name.log"
        rc=1
    fi
    grep "^parity_step" "$O/$name.log"
}

# gpu_case_draws [parity_step args...]: DRAWS one-step runs of the bf16 emulation with stochastic rounding (parity_step
# --emulate-bf16 --draw D), in parallel, into DRAW_FILES: the judge's allowance spans the draws (compare_bf16.py
# --draws, model_check.sh's rule), so a gradient whose error moves several-fold from one draw of the rounding to
# another is not judged against one draw
gpu_case_draws() {
    local d pids=()
    DRAW_FILES=""
    for d in $(seq 1 "${DRAWS:-3}"); do
        timeout 300 "$B/parity_step" "$C" --emulate-bf16 --draw "$d" --out "$C/cpu_draw$d.safetensors" "$@" \
            > "$O/cpu_draw$d.log" 2>&1 &
        pids+=($!)
        DRAW_FILES="$DRAW_FILES${DRAW_FILES:+,}$C/cpu_draw$d.safetensors"
    done
    for d in "${pids[@]}"; do wait "$d" || { echo "parity_step draw FAILED"; rc=1; }; done
}

# judge TITLE REF GOT: compare_bf16.py's bounds (against the bf16 emulation run cpu_bf16 and the draws of
# gpu_case_draws, when it ran)
judge() {
    echo "-- $1"
    $PY "$HERE/compare_bf16.py" "$C/$2.safetensors" "$C/$3.safetensors" "$C/cpu_bf16.safetensors" \
        ${DRAW_FILES:+--draws "$DRAW_FILES"} > "$O/cmp-$3-$2.log" 2>&1
    local r=$?
    head -6 "$O/cmp-$3-$2.log"
    tail -2 "$O/cmp-$3-$2.log"
    [ $r -eq 0 ] || { echo "FAILED: $1"; rc=1; }
}
