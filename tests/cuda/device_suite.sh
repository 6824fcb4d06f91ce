#!/bin/bash
# device_suite.sh — what a session runs on the lent GPU machine, in one call, from the repository root:
#
#   tests/cuda/device_suite.sh PART...        e.g.  tests/cuda/device_suite.sh parity gdn attn32k
#
# with the binaries already in build/ (built on the CPU machine and carried; CI only compiles them).
# Every part writes its log under logs/ and prints a summary line; the benchmark parts keep their bench.json
# as PART.json. All of it ends in one file, $OUT/device_suite.tgz (the device tool returns at most 8 files).
# Parts, in the order given:
#   parity     every build/test_cuda case but timing / bench / sweep / big (one process), and beside it
#              tests/cuda/model_check.sh (20 steps): the GPU parity of every kernel and of the model
#   parity-gdn the test_cuda cases of the delta rule alone (no model_check)
#   big        the cuda_big_* cases (entries at sizes where offsets pass 2^31; tests/cuda/test_cuda_big.cu),
#              one process each (up to ~72 GiB of device memory; parity leaves them out)
#   gdn        ringscan bench gdn --peer (every shape, FLA beside)      gdn-nopeer  the same, ours only
#   gdn-states ringscan bench gdn --gdn-keep states (ours only: the kept chunk states, GDN v4.4)
#   gdn32k     ringscan bench gdn at T = 32768, 16 and 64 heads, 1 and 16 documents (ours only), and the
#              same with --profile 1 (the time of every kernel, in the log)
#   gdn32k-dwg, gdn32k-sfbv32, gdn32k-dwg-sfbv32   gdn32k with --gdn-tune dwg=1 / sfbv=32 / both
#              (GDN v4.5: the dual launch's many-document form on wgmma; the wgmma forward pass in
#              32-column blocks)
#   gdn-cycles the state passes' cycles per phase (--profile 2, block 0) at 32k, one document: the wgmma
#              passes (--gdn-tune sfwd=1,sbwd=1) at 64 and 32 columns, 16 and 64 heads; mma.sync at 16
#   attn       ringscan bench attn --peer (every shape, SDPA flash and cuDNN beside)
#   attn32k    the same at T = 32768 only
#   step       ringscan bench step --peer, checkpoint.activations=none (transformers+FLA beside)
#   remat      ringscan bench step, remat (ours only)
#   step-states  ringscan bench step, none, checkpoint.gdn_keep=states (ours only)
#   cp-parity  tests/cuda/cp_gpu_check.sh (two GPUs): cuda cp 2 / dp 2 against one GPU and the cpu oracle,
#              50-step curves, remat counters, resume under cp 2
#   cp-step    ringscan train of the 1B config, remat: 128k tokens on one GPU, then 256k at cp 2 on two GPUs
#              with communication overlapped and forced serial (parallel.overlap_comm: false): ms/step,
#              tokens/s, MFU, peak memory beside plan
#   cp2-attn   cp2's ring attention at 128k and 256k with torch's context_parallel beside it
#   cp2-gdn    cp2's GDN layer, ours only (FLA's CP autotunes for more than 240 s cold)
#   cp2        mpirun -np 2 ringscan bench cp --peer on the machine's 2 GPUs (NCCL_NVLS_ENABLE=0): ring
#              attention at 128k/256k/512k and the GDN layer at 64k/128k beside torch's context_parallel
#              (cuDNN) and FLA's CP, one-GPU times and CP efficiencies, the serial schedule, per-step
#              compute and communication (issue 22)
# Environment:
#   OUT       where device_suite.tgz goes (default $OUT of the device tool, else runs/device)
#   PEER      the folder holding FLA's `fla` package (default .dev/peer; git-ignored, never committed)
#   MPI_LIB   a folder with libmpi.so.40 and its libraries, used when the machine has none (ringscan
#             links Open MPI; the device machine may lack it)
#   TRITON_CACHE_TAR  a .tar.xz of a Triton cache to unpack first (FLA's autotuning takes minutes cold)
#   LIMIT_S   seconds after which no further part starts (default 560: the device tool's 600 s per call)
# Exit status: 1 if any part failed (a failed check, a bench error row, a timeout), else 0.
set -u
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-runs/device}
PEER=${PEER:-$PWD/.dev/peer}
LIMIT_S=${LIMIT_S:-560}
W=$(mktemp -d /tmp/device_suite.XXXXXX)
L=$W/logs
mkdir -p "$L" "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PEER${PYTHONPATH:+:$PYTHONPATH}
if ! ldconfig -p 2>/dev/null | grep -q libmpi.so.40 && [ -n "${MPI_LIB:-}" ]; then
    export LD_LIBRARY_PATH=$MPI_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if [ -n "${TRITON_CACHE_TAR:-}" ]; then
    export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
    mkdir -p "$TRITON_CACHE_DIR" && tar xJf "$TRITON_CACHE_TAR" -C "$TRITON_CACHE_DIR"
fi
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader 2>&1 | head -2 || true
build/ringscan --version 2>&1 | head -1
status=0

# the seconds a part may still take
left() { echo $((LIMIT_S + 30 - SECONDS)); }

# suite_parity [PATTERN]: the test_cuda cases matching PATTERN (every case but timing / bench / sweep / the
# cuda_big_* ones if none, and then model_check beside them); each distinct failed check is printed once
suite_parity() {
    local mc="" cases
    if [ -z "${1:-}" ]; then
        STEPS=20 TRAIN_STEPS=20 timeout "$(left)" tests/cuda/model_check.sh build /tmp/device_suite_mc \
            > "$L/model_check.log" 2>&1 &
        mc=$!
    fi
    mapfile -t cases < <(build/test_cuda --list | grep -v -E "timing|bench|sweep|_big_" | grep -E "${1:-.}")
    timeout "$(left)" build/test_cuda "${cases[@]}" > "$L/parity${1:+-$1}.log" 2>&1
    local rc=$? mrc=0
    echo "parity${1:+ ($1)} rc=$rc cases=${#cases[@]} checks_ok=$(grep -c ' ok$' "$L/parity${1:+-$1}.log")" \
        "failed=$(grep -c FAIL "$L/parity${1:+-$1}.log")"
    grep FAIL "$L/parity${1:+-$1}.log" | sed 's/: [a-zA-Z_|]* differs between two runs/: ... differs/' |
        sort | uniq -c | head -20
    if [ -n "$mc" ]; then
        wait "$mc"
        mrc=$?
        echo "model_check rc=$mrc"
        grep -E "worst|curve|loss" "$L/model_check.log" | tail -4
    fi
    [ $rc -eq 0 ] && [ $mrc -eq 0 ]
}

# the cuda_big_* cases, one process each (cuda_big_gdn keeps its ~58 GB workspace to the end)
suite_big() {
    local rc=0 c
    for c in $(build/test_cuda --list | grep -E "^cuda_big_"); do
        if [ "$(left)" -le 30 ]; then
            echo "$c: not started (LIMIT_S)"
            rc=1
            continue
        fi
        timeout "$(left)" build/test_cuda "$c" > "$L/$c.log" 2>&1
        local crc=$?
        [ $crc -eq 0 ] || rc=1
        echo "$c rc=$crc checks_ok=$(grep -c ' ok$' "$L/$c.log") failed=$(grep -c FAIL "$L/$c.log")"
        grep -E "FAIL|big attention:|cudaMalloc" "$L/$c.log" | head -5
    done
    return $rc
}

# suite_gdn32k NAME [BENCH OPTION...]: ringscan bench gdn at 32k with the given options, then per kernel
suite_gdn32k() {
    local name=$1
    shift
    timeout "$(left)" build/ringscan bench gdn --T 32768 --heads 16,64 --doc-len 0,2048 "$@" \
        --out "/tmp/device_suite_$name" > "$L/$name.log" 2>&1
    local rc=$?
    echo "$name ($*) rc=$rc"
    sed -n '/^case /,$p' "$L/$name.log" | head -12
    cp "/tmp/device_suite_$name/bench.json" "$W/$name.json" 2>/dev/null
    timeout "$(left)" build/ringscan bench gdn --T 32768 --heads 16,64 --doc-len 0,2048 "$@" --profile 1 \
        --reps 3 --out "/tmp/device_suite_$name-prof" > "$L/$name-prof.log" 2>&1
    local prc=$?
    echo "$name per kernel rc=$prc (log $name-prof.log)"
    [ $rc -eq 0 ] && [ $prc -eq 0 ]
}

# the per-phase cycle counters of the state passes (--profile 2), one line per pass and setting
suite_gdn_cycles() {
    local rc=0 bv h
    for bv in 64 32; do
        for h in 16 64; do
            timeout "$(left)" build/ringscan bench gdn --gdn-tune sfwd=1,sbwd=1,sfbv=$bv --profile 2 \
                --T 32768 --heads $h --doc-len 0 --reps 1 --out /tmp/device_suite_cyc > "$L/cycles-wg$bv-h$h.log" 2>&1 || rc=1
            echo "wgmma, $bv columns forward, $h heads:"
            grep "gdn cycles" "$L/cycles-wg$bv-h$h.log" | tail -2
        done
    done
    timeout "$(left)" build/ringscan bench gdn --gdn-tune sfwd=2,sbwd=2 --profile 2 --T 32768 --heads 16 \
        --doc-len 0 --reps 1 --out /tmp/device_suite_cyc > "$L/cycles-mma-h16.log" 2>&1 || rc=1
    echo "mma.sync, 16 heads:"
    grep "gdn cycles" "$L/cycles-mma-h16.log" | tail -2
    return $rc
}

# suite_cp NAME NP ARGS...: mpirun -np NP ringscan bench cp ARGS, the tables printed, bench.json kept
suite_cp() {
    local name=$1 np=$2
    shift 2
    timeout "$(left)" mpirun -np "$np" --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x PYTHONPATH -x PYTHONUNBUFFERED \
        ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} ${TRITON_CACHE_DIR:+-x TRITON_CACHE_DIR} \
        build/ringscan bench cp "$@" --out "/tmp/device_suite_$name" > "$L/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc"
    sed -n '/^case /,/^results/p' "$L/$name.log" | head -80
    cp "/tmp/device_suite_$name/bench.json" "$W/$name.json" 2>/dev/null
    cp /tmp/device_suite_"$name"/peer_cp_*.log "$L/" 2>/dev/null
    return $rc
}

# suite_bench NAME ARGS...: ringscan bench ARGS, the table printed, bench.json kept
suite_bench() {
    local name=$1
    shift
    timeout "$(left)" build/ringscan bench "$@" --out "/tmp/device_suite_$name" > "$L/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc"
    sed -n '/^case /,$p' "$L/$name.log" | head -60
    cp "/tmp/device_suite_$name/bench.json" "$W/$name.json" 2>/dev/null
    return $rc
}

# the 1B config's training step: one GPU at 128k, two GPUs at cp 2 and 256k (overlapped, serial)
suite_cp_step() {
    local cfg=configs/hybrid-1b-256k-h200x4.yaml rc=0 d=/dev/shm/device_suite_step
    rm -rf $d && mkdir -p $d
    # documents longer than any sample: every sample is one causal document (attention's full cost)
    build/ringscan data synth $d/synth.tok --vocab 151936 --tokens 3145728 --min-doc 4194304 --max-doc 4194304 \
        --seed 1 > "$L/cp-step-data.log" 2>&1 || return 1
    local common=(--set data.format=flat --set data.path=$d/synth.tok --set train.grad_accum=1 --set train.steps=${CP_STEPS:-6}
        --set train.warmup_steps=2 --set device.kind=cuda --set device.peak_tflops=989 --set checkpoint.every=0)
    timeout "$(left)" build/ringscan train $cfg "${common[@]}" --set parallel.cp=1 --set data.seq_len=131072 \
        --set slurm.gpus_per_node=1 --set run.out_dir=$d/one > "$L/cp-step-1gpu.log" 2>&1 || rc=1
    echo "one GPU, 128k tokens (rc $rc):"
    grep -E "^memory|^step" "$L/cp-step-1gpu.log" | tail -3
    local name overlap
    for name in overlapped serial; do
        overlap=$([ $name = overlapped ] && echo true || echo false)
        timeout "$(left)" mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH \
            build/ringscan train $cfg "${common[@]}" --set parallel.cp=2 --set data.seq_len=262144 \
            --set slurm.gpus_per_node=2 --set parallel.overlap_comm=$overlap --set run.out_dir=$d/$name \
            > "$L/cp-step-cp2-$name.log" 2>&1 || rc=1
        echo "cp 2, 256k tokens, communication $name (rc $rc):"
        grep -E "^memory|^step" "$L/cp-step-cp2-$name.log" | tail -3
    done
    rm -rf $d
    return $rc
}

for part in "$@"; do
    if [ "$SECONDS" -ge "$LIMIT_S" ]; then
        echo "== $part: not started (${SECONDS} s of LIMIT_S=$LIMIT_S gone)"
        status=1
        continue
    fi
    echo "== $part at ${SECONDS} s"
    case $part in
    parity) suite_parity ;;
    parity-gdn) suite_parity gdn ;;
    big) suite_big ;;
    gdn) suite_bench gdn gdn --peer --peer-timeout 200 ;;
    gdn-nopeer) suite_bench gdn-nopeer gdn ;;
    gdn-states) suite_bench gdn-states gdn --gdn-keep states ;;
    gdn32k) suite_gdn32k gdn32k ;;
    gdn32k-dwg) suite_gdn32k gdn32k-dwg --gdn-tune dwg=1 ;;
    gdn32k-sfbv32) suite_gdn32k gdn32k-sfbv32 --gdn-tune sfbv=32 ;;
    gdn32k-dwg-sfbv32) suite_gdn32k gdn32k-dwg-sfbv32 --gdn-tune dwg=1,sfbv=32 ;;
    gdn-cycles) suite_gdn_cycles ;;
    attn) suite_bench attn attn --peer --peer-timeout 200 ;;
    attn32k) suite_bench attn32k attn --T 32768 --peer --peer-timeout 120 ;;
    step) suite_bench step step --profile 1 --peer --peer-timeout 240 --set checkpoint.activations=none ;;
    remat) suite_bench remat step --profile 1 ;;
    cp-parity)
        timeout "$(left)" tests/cuda/cp_gpu_check.sh build /tmp/device_suite_cp > "$L/cp-parity.log" 2>&1
        r=$?
        grep -E "^==|^--|FAIL|within|ok$|resume|counters|curve|worst|cp_gpu_check" "$L/cp-parity.log" | head -60
        [ $r -eq 0 ]
        ;;
    cp-step) suite_cp_step ;;
    step-states)
        suite_bench step-states step --profile 1 --set checkpoint.activations=none --set checkpoint.gdn_keep=states
        ;;
    cp2) suite_cp cp2 2 --peer --peer-timeout 240 ;;
    cp2-attn) suite_cp cp2-attn 2 --parts attn --T 131072,262144 --peer --peer-timeout 150 ;;
    cp2-gdn) suite_cp cp2-gdn 2 --parts gdn ;;
    *)
        echo "unknown part '$part' (parity parity-gdn big gdn gdn-nopeer gdn-states gdn32k gdn32k-dwg gdn32k-sfbv32"
        echo "  gdn32k-dwg-sfbv32 gdn-cycles attn attn32k step remat step-states cp-parity cp-step cp2 cp2-attn cp2-gdn)"
        false
        ;;
    esac || status=1
done
tar czf "$OUT/device_suite.tgz" -C "$W" .
echo "== done at ${SECONDS} s, status $status (logs: $OUT/device_suite.tgz)"
exit $status
