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
#   gdn-base   ringscan bench gdn at 32k and 128k (16 and 64 heads, 1 and many documents) of GDN_BASE_BIN (a binary
#              built at an earlier commit) and of build/ringscan, alternated twice on the same GPU
#   gdn-states ringscan bench gdn --gdn-keep states (ours only: the kept chunk states, GDN v4.4)
#   gdn32k     ringscan bench gdn at T = 32768, 16 and 64 heads, 1 and 16 documents (ours only), and the
#              same with --profile 1 (the time of every kernel, in the log)
#   gdn32k-dwg, gdn32k-sfbv32, gdn32k-dwg-sfbv32   gdn32k with --gdn-tune dual_wgmma=1 / state_fwd_wgmma_cols=32 / both
#              (GDN v4.5: the dual launch's many-document form on wgmma; the wgmma forward pass in
#              32-column blocks)
#   gdn-cycles the state passes' cycles per phase (--profile 2, block 0) at 32k, one document: the wgmma
#              passes (--gdn-tune state_fwd_wgmma=1,state_bwd_wgmma=1) at 64 and 32 columns, 16 and 64 heads; mma.sync at 16
#   attn       ringscan bench attn --peer (every shape, SDPA flash and cuDNN beside)
#   attn32k    the same at T = 32768 only
#   attn-cudnn (issue 19) the cuDNN attention route: the cuda_attention_cudnn_* cases with RS_CUDNN_REQUIRED=1
#              (parity against the cpu oracle, the route, a ring's pieces, determinism), then ringscan bench attn
#              at 32k and 128k, 16/16/128 and 16/2/128: --attn-impl cudnn with SDPA flash and cuDNN beside (--peer),
#              then ours alone on the same shapes (attn-cudnn-ours.json); and attn-auto's checks
#   attn-auto  device.attention_kernel auto, the default: train (no attention_kernel set) 2 steps with cuDNN
#              (cudnn) and, given a wrong cudnn_library, with ours, saying which; on a two-GPU machine also
#              dp 2 with the wrong library on rank 1 only: ours on both ranks, said. ~30 s
#   attn-cudnn-det  what determinism costs: bench attn at 8k and 16k (cudnn_det's workspace, Tq Tk nh 2 bytes,
#              fits there only), 16/16/128 and 16/2/128, with cuDNN's backward (cudnn), its deterministic one
#              (cudnn_det) and ours, alternated twice; a table of f+b ms and cudnn_det / cudnn; then cudnn_det at
#              128k: it stops naming the workspace asked, or runs on an engine whose workspace fits (said). ~2 min
#   attn-cudnn-wide  the cuDNN route where attn-cudnn did not look: bench attn --attn-impl cudnn at hd 256
#              (16/16/256, 16/2/256) and at hd 128 with documents (--doc-len 2048: document-masked calls go
#              to our kernel by design, the routed counts say so), 32k and 128k, SDPA flash and cuDNN beside
#              (per document with documents). ~5 min
#   step-cudnn the 1B step (bench step, 32k tokens, ours only) under none and under remat, each with our
#              attention kernel and with device.attention_kernel=cudnn, side by side (cudnn_det's workspace
#              does not fit at 32k beside the step). ~4 min
#   step       ringscan bench step --peer, checkpoint.activations=none (transformers+FLA beside); fails unless
#              our row's block_recomputes and chunk_recomputes are 0 (none reruns nothing)
#   remat      ringscan bench step, remat (ours only)
#   step-states  ringscan bench step, none, checkpoint.gdn_keep=states (ours only)
#   cp-parity  tests/cuda/cp_gpu_check.sh (two GPUs): cuda cp 2 / dp 2 against one GPU and the cpu oracle,
#              50-step curves, remat counters, resume under cp 2
#   cp-step    ringscan train of the 1B config, remat: 128k tokens on one GPU, then 256k at cp 2 on two GPUs
#              with communication overlapped and forced serial (parallel.overlap_comm: false) (CP_STEP_SET: more
#              --set options for all three, e.g. "--set device.attention_kernel=cudnn"): ms/step,
#              tokens/s, MFU, peak memory beside plan
#   cp2-attn   cp2's ring attention at 128k and 256k with torch's context_parallel beside it
#   cp2-gdn    cp2's GDN layer, ours only (FLA's CP autotunes for more than 240 s cold)
#   cp2-ring-calls  cp2's ring attention at 128k (MHA, GQA; where v0.6 missed 99%), ours only, with the zigzag
#              rule's calls one by one (--ring-calls pairs) and auto (one call per step with our kernel),
#              alternated RING_ROUNDS (2) times: what one launch per step buys. ~2 min
#   cp2-ring-calls-cudnn  the same through cuDNN (auto: one call per step, every one cuDNN's). ~4 min
#   attn-cudnn-parity  the cuDNN route's parity cases of test_cuda alone (part of attn-cudnn). ~1 min
#   ring2-calls  one GPU: our kernel's calls of the cp 2 ring at 128k (MHA, GQA 16/2) one by one, each rank's own
#              block and dense rectangle beside the one-GPU call (RS_ATTN_TIMING=5 test_cuda attention_timing):
#              the ring's CP efficiency from the kernel calls alone, without communication. ~1 min
#   cp2-ring-kv  cp2's ring attention at 128k (MHA, GQA) with the backward reading the K|V its forward kept
#              (--ring-kv kept, the default) against passing it again (passed), through cuDNN then ours,
#              alternated RING_ROUNDS (2) times. ~4 min
#   cp2-ring-ab  the same 128k ring (MHA, GQA) through cuDNN and through ours, this build against
#              RING_BASE_BIN (another ringscan: a schedule change's A/B), alternated RING_ROUNDS (2) times. ~3 min
#   cp2-ring-dq  the same 128k ring (steps) with our backward's dQ in key-block order (the built-in, deterministic)
#              and by plain atomics (--attn-tune dq_atomic=1), alternated twice: whether the ordered dQ is what
#              slows the dense-rectangle step's backward (v0.10: ~158 ms against ~140 for the causal step). ~2 min
#   cp2-gdn-chain  cp2's GDN layer (GDN_CASES, default 64k and 128k at 64 heads), ours only, with the staged
#              chain (parallel.gdn_chain_staged, the default) and each fragment's pass whole (--gdn-chain whole),
#              alternated CHAIN_ROUNDS (2) times: what the staged chain buys. ~1 min a run
#   cp2-gdn-peer  cp2's GDN layer with FLA's CP beside it, the peer given all but 200 s of the call
#              (its Triton autotuning, ~300 s per shape cold; TRITON_CACHE_SAVE keeps the cache for the next
#              call); GDN_CASES: bench cp options choosing the shapes (e.g. "--gdn-T 65536 --heads 64"),
#              GDN_OURS_S: the seconds kept for ours and the parts after it (default 200)
#   cp2-512k   cp2's ring attention at 512k (MHA and GQA, 2 timed runs) with torch's context_parallel
#   cp2-attn-cudnn  cp2's ring attention through the cuDNN route (bench cp --attn-impl cudnn: the causal
#              diagonals and dense rectangles on cuDNN, by the ring's host hints, no read-back) at 128k, 256k and
#              512k, MHA and GQA, 3 timed runs, with torch's context_parallel (cuDNN) beside and the route's
#              own one-GPU rows for CP efficiency. ~7 min: run it alone in a call
#   cp4-attn   (4 GPUs, issue 21) ring attention at cp 4, 128k / 512k / 1M, 16 heads, hd 128, torch beside
#              (CP4_REPS timed runs, default 2; CP4_PEER_S the peer's seconds, default 300)
#   cp4-gdn    (4 GPUs) the GDN layer at cp 4, 128k, 64 heads, FLA's CP beside (give it a warm Triton cache)
#   cp4-gdn-nopeer  the same, ours only
#   cp4-parity (4 GPUs) cp_gpu_check.sh's part 6 alone (FOUR_ONLY=1): cuda cp 4 and dp 2 x cp 2 against the cpu
#              oracle, the 50-step curve of dp 2 x cp 2 against dp 1 x cp 4
#   cp4-step   (4 GPUs) ringscan train: the 1M config at cp 4 (CP4_CONFIG, default the h200x4 one, the h100x4
#              one on H100s; CP_STEPS 4),
#              and at 256k dp 1 x cp 4 (grad_accum 2) beside dp 2 x cp 2 overlapped and serial (cp4-1m: the 1M
#              run alone)
#              (cp-parity on 4 GPUs adds dp 2 x cp 2 and cp 4 against the cpu oracle and their curves)
#   cp2        mpirun -np 2 ringscan bench cp --peer on the machine's 2 GPUs (NCCL_NVLS_ENABLE=0): ring
#              attention at 128k/256k/512k and the GDN layer at 64k/128k beside torch's context_parallel
#              (cuDNN) and FLA's CP, one-GPU times and CP efficiencies, the serial schedule, per-step
#              compute and communication (issue 22)
#   hf         the Hugging Face export against transformers (tests/parity/hf_check.py, issue 20): a tiny-cpu
#              run trained 100 steps on the GPU, exported; transformers' loss and every parameter gradient
#              on fixed single-sequence and document-packed batches, mixers x1 and x30, against ringscan's
#              (cpu, fp32); then the same with a wrong GDN layout in transformers' copy, which must FAIL;
#              and `ringscan eval` of the run on cuda (one GPU, cp 2 on two) against the cpu oracle
#   long-parity  tests/cuda/long_gpu_check.sh (two GPUs): row chunks (100 and 7 rows) against the unchunked
#              run and the cpu oracle (compare_bf16 bounds), offload against none (bitwise), one GPU and
#              cp 2; and build/test_cuda cuda_copyq_order (the copy queue's ordering). ~1 min
#   long-1m    ringscan train of configs/hybrid-1b-1m-h100x2.yaml, 3 optimizer steps of 1,048,576 tokens (one
#              causal document) on two GPUs under mpirun (cp 2, chunked, offload host): s/step, tokens/s,
#              MFU (attention causal), peak device memory (the backend's count and cudaMemGetInfo) and host
#              memory in use (sampled every 2 s) beside plan. ~100 s a step from the FLOPs (attention
#              51.5 GFLOP/token causal: 27 PFLOP per GPU a step at ~300 TFLOP/s = 90 s, the rest ~10 s)
#              + ~40 s start: ~6 min; then torch context_parallel + cuDNN alone, one attention layer (16 heads,
#              hd 128) fwd+bwd at 1M on the same two GPUs and on one (~2 min; LONG_1M_PEER=0 skips it); run it
#              alone in a call
#   long-1m-cudnn  long-1m's training (3 steps, two GPUs, cp 2) with device.attention_kernel=cudnn: s/step,
#              MFU, memory beside plan (which counts the route's 3.28 GiB workspace; cuDNN's own plan workspace
#              is printed in the log). ~70 s a step if the attention runs at v0.7's 1.6x: ~5 min; run it alone
#              in a call (on 80 GB H100s plan is 75.1 GiB of 79.2 before cuDNN's own workspace)
#   long-1gpu  (issue 18) the same model on ONE GPU at the longest sample plan fits in 79 GiB with room for the
#              ~2% the device has measured above plan: LONG_1GPU_T, default 720,896 tokens with gdn_keep none
#              (LONG_1GPU_KEEP; plan 74.31 GiB; with states 589,824 at 75.65), 2 optimizer steps: s/step, memory
#              beside plan. ~4 min (run it with AS_H100=1 on H200s)
#   long-256k  the same model at 262,144 tokens on two GPUs, 4 steps each: unchunked without offload
#              (chunk_rows 65536 = the fragment), chunked (plan's 8,384 rows), chunked + offload; the cost
#              of each as a ratio of ms/step, and the offloaded run's losses bitwise the chunked run's.
#              ~7.5 s a step (attention 1.7 PFLOP per GPU a step), ~50 s a run: ~3 min
# Environment:
#   OUT       where device_suite.tgz goes (default $OUT of the device tool, else runs/device)
#   PEER      the folder holding FLA's `fla` package (default .dev/peer; git-ignored, never committed)
#   MPI_LIB   a folder with libmpi.so.40 and its libraries, used when the machine has none (ringscan
#             links Open MPI; the device machine may lack it)
#   TRITON_CACHE_TAR  a .tar.xz of a Triton cache to unpack first (FLA's autotuning takes minutes cold)
#   LIMIT_S   seconds after which no further part starts (default 560: the device tool's 600 s per call)
#   AS_H100   1: every GPU keeps only an 80 GB H100's memory free for the call (tests/cuda/as_h100.py holds the
#             rest), so an H200 machine proves what fits an H100; "in use" figures then include the ballast
#   TRITON_CACHE_SAVE  a .tar.xz path to write the Triton autotuners' choices to at the end
#             (TRITON_CACHE_AUTOTUNING=1; give it back as TRITON_CACHE_TAR so FLA skips its autotuning)
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
if [ -n "${TRITON_CACHE_TAR:-}${TRITON_CACHE_SAVE:-}" ]; then
    export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
    export TRITON_CACHE_AUTOTUNING=1
    mkdir -p "$TRITON_CACHE_DIR"
fi
if [ -n "${TRITON_CACHE_TAR:-}" ]; then
    mkdir -p "$TRITON_CACHE_DIR" && tar xJf "$TRITON_CACHE_TAR" -C "$TRITON_CACHE_DIR"
fi
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader 2>&1 | head -2 || true
if [ "${AS_H100:-0}" = 1 ]; then  # every GPU left with an 80 GB H100's memory for the whole call (as_h100.py)
    ${PYTHON:-python3} tests/cuda/as_h100.py "$W/as_h100.txt" &
    ballast=$!
    trap 'kill $ballast 2> /dev/null' EXIT
    for _ in $(seq 120); do [ -s "$W/as_h100.txt" ] && break; sleep 0.5; done
    [ -s "$W/as_h100.txt" ] || { echo "as_h100.py did not get ready"; exit 2; }
    sed 's/^/AS_H100: /' "$W/as_h100.txt" | tee "$L/as_h100.log"
fi
build/ringscan --version 2>&1 | head -1
status=0

# the seconds a part may still take
left() { echo $((LIMIT_S + 30 - SECONDS)); }

# suite_parity [PATTERN]: the test_cuda cases matching PATTERN (every case but timing / bench / sweep / the
# cuda_big_* ones if none, and then model_check beside them); each distinct failed check is printed once
suite_parity() {
    local mc="" cases ngpu g log=$L/parity${1:+-$1}.log pids=() rc=0 mrc=0
    ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
    [ "$ngpu" -ge 1 ] || ngpu=1
    if [ -z "${1:-}" ]; then  # on the last GPU, beside the cases
        CUDA_VISIBLE_DEVICES=$((ngpu - 1)) STEPS=20 TRAIN_STEPS=20 timeout "$(left)" tests/cuda/model_check.sh build \
            /tmp/device_suite_mc > "$L/model_check.log" 2>&1 &
        mc=$!
    fi
    mapfile -t cases < <(build/test_cuda --list | grep -v -E "timing|bench|sweep|_big_" | grep -E "${1:-.}")
    # the cases dealt round-robin over the machine's GPUs, one test_cuda process each; the GPU machine has
    # cuDNN: its cases must run there, not print SKIP and pass
    for ((g = 0; g < ngpu; g++)); do
        local mine=()
        for ((i = g; i < ${#cases[@]}; i += ngpu)); do mine+=("${cases[i]}"); done
        [ ${#mine[@]} -gt 0 ] || continue
        CUDA_VISIBLE_DEVICES=$g RS_CUDNN_REQUIRED=${RS_CUDNN_REQUIRED:-1} timeout "$(left)" build/test_cuda "${mine[@]}" \
            > "$log.$g" 2>&1 &
        pids+=($!)
    done
    for g in "${pids[@]}"; do wait "$g" || rc=1; done
    cat "$log".* > "$log" && rm -f "$log".*
    echo "parity${1:+ ($1)} rc=$rc cases=${#cases[@]} on $ngpu GPU(s) checks_ok=$(grep -c ' ok$' "$log")" \
        "failed=$(grep -c FAIL "$log") skipped=$(grep -c SKIP "$log");" \
        "slowest: $(grep -E '^== .*: (ok|FAILED) \(' "$log" | sort -t'(' -k2 -g -r | head -3 | sed 's/^== //' | tr '\n' ' ')"
    grep FAIL "$log" | sed 's/: [a-zA-Z_|]* differs between two runs/: ... differs/' | sort | uniq -c | head -20
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
# the GDN layer of a baseline binary (GDN_BASE_BIN, e.g. one built at an earlier commit) and of build/ringscan on
# the same GPU, alternated twice (base, ours, base, ours): a kernel change measured against what it replaced
suite_gdn_base() {
    local rc=0 r b
    [ -x "${GDN_BASE_BIN:-}" ] || { echo "gdn-base: GDN_BASE_BIN '${GDN_BASE_BIN:-}' is not an executable"; return 1; }
    for r in 1 2; do
        for b in "$GDN_BASE_BIN" build/ringscan; do
            timeout "$(left)" "$b" bench gdn --T 32768,131072 --heads 16,64 --doc-len 0,2048 \
                --out "/tmp/device_suite_gdn-base" > "$L/gdn-base-$r-$(basename "$(dirname "$b")").log" 2>&1 || rc=1
            echo "gdn-base round $r: $b ($("$b" --version | sed -n 2p | tr -s ' '))"
            sed -n '/^case /,/^$/p' "$L/gdn-base-$r-$(basename "$(dirname "$b")").log" | head -10
        done
    done
    return $rc
}

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
            timeout "$(left)" build/ringscan bench gdn --gdn-tune state_fwd_wgmma=1,state_bwd_wgmma=1,state_fwd_wgmma_cols=$bv --profile 2 \
                --T 32768 --heads $h --doc-len 0 --reps 1 --out /tmp/device_suite_cyc > "$L/cycles-wg$bv-h$h.log" 2>&1 || rc=1
            echo "wgmma, $bv columns forward, $h heads:"
            grep "gdn cycles" "$L/cycles-wg$bv-h$h.log" | tail -2
        done
    done
    timeout "$(left)" build/ringscan bench gdn --gdn-tune state_fwd_wgmma=2,state_bwd_wgmma=2 --profile 2 --T 32768 --heads 16 \
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
        ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} ${TRITON_CACHE_DIR:+-x TRITON_CACHE_DIR -x TRITON_CACHE_AUTOTUNING} \
        "${RS_BIN:-build/ringscan}" bench cp "$@" --out "/tmp/device_suite_$name" > "$L/$name.log" 2>&1
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

# the 1B step under none beside transformers+FLA; our row must say the step reran nothing (issue 18: none
# keeps every per-token tensor its backward reads, so no block and no row chunk runs again)
suite_step_none() {
    local rc=0
    suite_bench step step --profile 1 --peer --peer-timeout 240 --set checkpoint.activations=none || rc=1
    python3 - "$W/step.json" <<'EOF' || rc=1
import json, sys
for r in json.load(open(sys.argv[1]))["step"]["ringscan"]:
    got = (r.get("block_recomputes"), r.get("chunk_recomputes"))
    print(f"step {r.get('case')}: none reran {got[0]} blocks, {got[1]} per-token forwards (want 0, 0)")
    if got != (0, 0):
        sys.exit("step: checkpoint.activations none recomputed")
EOF
    return $rc
}

# device.attention_kernel auto (the default): cudnn where cuDNN loads, ours where not, one kernel for all ranks
suite_attn_auto() {
    local rc=0
    # no attention_kernel set: cudnn here (cuDNN loads), ours where it cannot load (a wrong path), said
    local w=/tmp/device_suite_auto lib
    rm -rf $w && mkdir -p $w && build/ringscan data synth $w/d.tok --seed 1 > /dev/null || rc=1
    for lib in "" /nonexistent/libcudnn.so.9; do
        timeout "$(left)" build/ringscan train configs/tiny-cpu.yaml --set device.kind=cuda --set parallel.cp=1 \
            ${lib:+--set device.cudnn_library=$lib} --set train.steps=2 --set train.warmup_steps=1 \
            --set data.path=$w/d.tok --set run.out_dir=$w/run${lib:+-nolib} > "$L/attn-auto${lib:+-nolib}.log" 2>&1 || rc=1
        local want="cudnn, cuDNN loaded"
        [ -n "$lib" ] && want="attention: ours, not cuDNN's"
        if grep -q "$want" "$L/attn-auto${lib:+-nolib}.log" && grep -q "^step *2/2" "$L/attn-auto${lib:+-nolib}.log"; then
            echo "auto${lib:+ with cudnn_library $lib}: '$want', 2 steps: ok"
        else
            echo "auto${lib:+ with cudnn_library $lib}: FAIL (no '$want' or no step 2)"; rc=1
            tail -3 "$L/attn-auto${lib:+-nolib}.log"
        fi
    done
    # two ranks (two GPUs), cuDNN loadable on rank 0 only: auto agrees on ours for both, rank 1 named
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
        local a=(train configs/tiny-cpu.yaml --set device.kind=cuda --set parallel.cp=1 --set parallel.dp=2
            --set slurm.gpus_per_node=2 --set device.attention_kernel=auto --set train.steps=2
            --set train.warmup_steps=1 --set data.path=$w/d.tok --set run.out_dir=$w/run-ranks)
        timeout "$(left)" mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
            -np 1 build/ringscan "${a[@]}" : -np 1 build/ringscan "${a[@]}" \
            --set device.cudnn_library=/nonexistent/libcudnn.so.9 > "$L/attn-auto-ranks.log" 2>&1 || rc=1
        if grep -q "ours on every rank .*cuDNN did not load on 1 of 2 ranks; rank 1 on" "$L/attn-auto-ranks.log" &&
            grep -q "^step *2/2" "$L/attn-auto-ranks.log"; then
            echo "auto over 2 ranks, cuDNN on rank 0 only: ours on both, rank 1 named, 2 steps: ok"
        else
            echo "auto over 2 ranks, cuDNN on rank 0 only: FAIL"; rc=1
            grep -E "attention|error" "$L/attn-auto-ranks.log" | head -5
        fi
    fi
    return $rc
}
# the cuDNN attention route (issue 19): parity cases (cuDNN required), then the benchmark beside ours and SDPA
# the cuDNN route's parity cases of test_cuda (cuDNN required)
suite_attn_cudnn_parity() {
    local rc=0
    RS_CUDNN_REQUIRED=1 timeout "$(left)" build/test_cuda $(build/test_cuda --list | grep -E "^cuda_attention_cudnn_") \
        > "$L/attn-cudnn-parity.log" 2>&1 || rc=1
    echo "attn-cudnn parity rc=$rc checks_ok=$(grep -c ' ok$' "$L/attn-cudnn-parity.log")" \
        "failed=$(grep -c FAIL "$L/attn-cudnn-parity.log")"
    grep -E "FAIL|error|cuDNN|SKIP|calls on|calls each way|bitwise|DIFFER|hint" "$L/attn-cudnn-parity.log" | head -40
    return $rc
}

suite_attn_cudnn() {
    local rc=0
    suite_attn_cudnn_parity || rc=1
    suite_attn_auto || rc=1
    local shapes="--T 32768,131072 --attn-shapes 16/16/128,16/2/128"
    suite_bench attn-cudnn attn $shapes --attn-impl cudnn --peer --peer-timeout 150 || rc=1
    grep -E "attention kernel|cuDNN attention plan|routed" "$L/attn-cudnn.log" | head -12
    suite_bench attn-cudnn-ours attn $shapes || rc=1
    return $rc
}

# the cuDNN route at hd 256 and with documents, SDPA beside
suite_attn_cudnn_wide() {
    local rc=0 T="--T 32768,131072"
    suite_bench attn-cudnn-hd256 attn $T --attn-shapes 16/16/256,16/2/256 --attn-impl cudnn --peer \
        --peer-timeout 150 || rc=1
    grep -E "routed|cuDNN attention plan" "$L/attn-cudnn-hd256.log" | head -8
    suite_bench attn-cudnn-docs attn $T --attn-shapes 16/16/128,16/2/128 --doc-len 2048 --attn-impl cudnn --peer \
        --peer-timeout 150 || rc=1
    grep -E "routed" "$L/attn-cudnn-docs.log" | head -4
    return $rc
}

# cuDNN's two backwards and ours on the same shapes, alternated twice, one table (issue 19's default)
suite_attn_cudnn_det() {
    local rc=0 k i
    for i in 1 2; do
        for k in cudnn cudnn_det ringscan; do
            suite_bench "attn-det-$k-$i" attn --T 8192,16384 --attn-shapes 16/16/128,16/2/128 --attn-impl $k \
                > /dev/null || rc=1
        done
    done
    grep -hE "cuDNN attention plan: backward" "$L"/attn-det-cudnn*-1.log | sort -u | head -8
    # at 128k the deterministic engine v0.10 met asks 512 GiB (Tq Tk nh 2 bytes): passed over, the run stops saying
    # so, unless cuDNN offers another deterministic engine whose workspace fits (then it runs: its plan line says)
    if suite_bench "attn-cudnn-det-refused" attn --T 131072 --attn-shapes 16/16/128 --attn-impl cudnn_det > /dev/null; then
        echo "attn-cudnn-det: 128k ran with another deterministic engine:"
        grep -m2 "cuDNN attention plan: backward" "$L/attn-cudnn-det-refused.log"
    elif grep -q "does not fit this GPU" "$L/attn-cudnn-det-refused.log"; then
        echo "attn-cudnn-det: 128k refused: $(grep -m1 -o 'ask a workspace of at least [0-9]* MiB, [0-9]* MiB could' \
            "$L/attn-cudnn-det-refused.log")"
    else
        echo "attn-cudnn-det: FAIL: cudnn_det at 128k failed without naming its workspace"; rc=1
        tail -3 "$L/attn-cudnn-det-refused.log"
    fi
    python3 - "$W" <<'PYEOF' || rc=1
import json, sys, glob, os
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "attn-det-*.json"))):
    k, i = os.path.basename(f)[len("attn-det-"):-len(".json")].rsplit("-", 1)
    for r in json.load(open(f))["attn"]["ringscan"]:  # a failed case has no time: left out, shown as "-"
        if "ms_fwdbwd" in r:
            rows.setdefault(r["case"], {}).setdefault(k, []).append(r["ms_fwdbwd"])
print(f"{'case':28s} {'cudnn f+b ms':>18s} {'cudnn_det':>18s} {'ours':>18s} {'det/cudnn':>9s} {'ours/det':>8s}")
for c, m in rows.items():
    best = {k: min(v) for k, v in m.items()}
    cell = lambda k: ", ".join(f"{x:.2f}" for x in m.get(k, [])) or "-"
    ratio = lambda a, b: f"{best[a] / best[b]:.3f}" if a in best and b in best else "-"
    print(f"{c:28s} {cell('cudnn'):>18s} {cell('cudnn_det'):>18s} {cell('ringscan'):>18s} "
          f"{ratio('cudnn_det', 'cudnn'):>9s} {ratio('ringscan', 'cudnn_det'):>8s}")
PYEOF
    return $rc
}

# the 1B step with our attention kernel and with the cuDNN route, under none and remat
suite_step_cudnn() {
    local rc=0 pol k
    for pol in none remat; do
        for k in ringscan cudnn; do
            suite_bench "step-$pol-$k" step --profile 1 --set checkpoint.activations=$pol \
                --set device.attention_kernel=$k || rc=1
        done
    done
    return $rc
}

# long-1m's training with the cuDNN route
suite_long_1m_cudnn() {
    local cfg=configs/hybrid-1b-1m-h100x2.yaml rc=0 k=(--set device.attention_kernel=cudnn)
    build/ringscan plan $cfg "${k[@]}" | grep -E "^  total|cuDNN attention workspace|verdict"
    suite_train long-1m-cudnn 2 3 $cfg "${k[@]}" || rc=1
    grep -E "cuDNN attention plan|^attention:" "$L/long-1m-cudnn.log" | sort | uniq -c | head -10
    rm -rf $TRAIN_DIR
    return $rc
}

# suite_train NAME NP STEPS CONFIG [--set k=v ...]: ringscan train of CONFIG on NP GPUs (mpirun when NP > 1),
# every sample one causal document (synthetic tokens, documents longer than any sample: attention's full
# cost), STEPS steps (the first is the warm-up), the run left in $TRAIN_DIR/NAME (metrics.jsonl; callers
# remove $TRAIN_DIR): its memory and step lines printed, and the host memory in use sampled every 2 s
# on disk, not /dev/shm: tmpfs pages count as host memory in use, and the sampler of suite_train reads that
TRAIN_DIR=/tmp/device_suite_train
suite_train() {
    local name=$1 np=$2 steps=$3 cfg=$4 d=$TRAIN_DIR rc=0
    shift 4
    mkdir -p $d
    if [ ! -s $d/synth.tok ]; then
        build/ringscan data synth $d/synth.tok --vocab 151936 --tokens 8388608 --min-doc 8388608 --max-doc 8388608 \
            --seed 1 > "$L/train-data.log" 2>&1 || return 1
    fi
    local args=(train "$cfg" --set data.format=flat --set data.path=$d/synth.tok --set train.steps="$steps"
        --set train.warmup_steps=1 --set device.kind=cuda --set device.peak_tflops=989 --set checkpoint.every=0
        --set slurm.gpus_per_node="$np" --set run.out_dir=$d/$name "$@")
    (while sleep 2; do free -b | awk '/^Mem:/ {print $3}'; done) > "$L/$name-host.log" &
    local sampler=$!
    if [ "$np" -gt 1 ]; then
        timeout "$(left)" mpirun --allow-run-as-root --bind-to none -np "$np" -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH \
            build/ringscan "${args[@]}" > "$L/$name.log" 2>&1 || rc=1
    else
        timeout "$(left)" build/ringscan "${args[@]}" > "$L/$name.log" 2>&1 || rc=1
    fi
    kill $sampler 2> /dev/null
    echo "$name: $np GPU(s), $* (rc $rc):"
    grep -E "^memory|^step" "$L/$name.log" | tail -$((steps + 1))
    sort -n "$L/$name-host.log" | tail -1 | awk '{printf "  host memory in use, peak sampled every 2 s: %.2f GiB\n", $1 / 2^30}'
    return $rc
}

# the 1B config's training step: one GPU at 128k, two GPUs at cp 2 and 256k (overlapped, serial)
suite_cp_step() {
    local cfg=configs/hybrid-1b-256k-h200x4.yaml rc=0 n=${CP_STEPS:-6} c=(--set train.grad_accum=1 ${CP_STEP_SET:-})
    suite_train cp-step-1gpu 1 $n $cfg "${c[@]}" --set data.seq_len=131072 --set parallel.cp=1 || rc=1
    suite_train cp-step-cp2-overlapped 2 $n $cfg "${c[@]}" --set data.seq_len=262144 --set parallel.cp=2 \
        --set parallel.overlap_comm=true || rc=1
    suite_train cp-step-cp2-serial 2 $n $cfg "${c[@]}" --set data.seq_len=262144 --set parallel.cp=2 \
        --set parallel.overlap_comm=false || rc=1
    rm -rf $TRAIN_DIR
    return $rc
}

# four GPUs (issue 21): the 1M config at cp 4, and dp 2 x cp 2 with communication overlapped and serial (the
# gradient buckets' overlap) beside dp 1 x cp 4 at 256k
suite_cp4_1m() {
    local c1m=configs/hybrid-1b-1m-h200x4.yaml
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && c1m=configs/hybrid-1b-1m-h100x4.yaml
    suite_train cp4-1m 4 ${CP_STEPS:-4} "${CP4_CONFIG:-$c1m}" --set train.grad_accum=1 \
        --set parallel.cp=4 --set parallel.dp=1
}

suite_cp4_step() {
    local rc=0 c256=configs/hybrid-1b-256k-h200x4.yaml n=${CP_STEPS:-4} s=(--set data.seq_len=262144)
    suite_cp4_1m || rc=1
    suite_train cp4-256k 4 $n $c256 "${s[@]}" --set parallel.cp=4 --set parallel.dp=1 --set train.grad_accum=2 || rc=1
    suite_train dp2cp2-256k-overlapped 4 $n $c256 "${s[@]}" --set parallel.cp=2 --set parallel.dp=2 \
        --set train.grad_accum=1 || rc=1
    suite_train dp2cp2-256k-serial 4 $n $c256 "${s[@]}" --set parallel.cp=2 --set parallel.dp=2 --set train.grad_accum=1 \
        --set parallel.overlap_comm=false || rc=1
    rm -rf $TRAIN_DIR
    return $rc
}

# the export against transformers (torch path on CPU: fla off PYTHONPATH); the wrong layouts must fail
suite_hf() {
    local w=/tmp/device_suite_hf PY=${PYTHON:-python3} rc=0 b
    rm -rf "$w" && mkdir -p "$w"
    build/ringscan data synth "$w/recall.tok" --seed 1 > "$L/hf-train.log" 2>&1 &&
        timeout "$(left)" build/ringscan train configs/tiny-cpu.yaml --set parallel.cp=1 --set device.kind=cuda \
            --set train.steps=100 --set data.path="$w/recall.tok" --set run.out_dir="$w/run" >> "$L/hf-train.log" 2>&1
    if [ $? -ne 0 ]; then
        echo "hf: training the tiny run failed"; tail -5 "$L/hf-train.log"; return 1
    fi
    grep -E "^step +100/" "$L/hf-train.log"
    # ringscan eval of the same run on cuda (one GPU, and cp 2 when there are two) against the cpu oracle:
    # the overall loss and every context bucket's within 1e-2 relative (bf16 activations against fp32)
    local ev=(build/ringscan eval "$w/run" --data "$w/recall.tok" --tokens 32768)
    timeout "$(left)" "${ev[@]}" --out "$w/eval-cpu.json" --set device.kind=cpu > "$L/hf-eval.log" 2>&1 &&
        timeout "$(left)" "${ev[@]}" --out "$w/eval-cuda.json" --set device.kind=cuda >> "$L/hf-eval.log" 2>&1 || rc=1
    if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
        timeout "$(left)" mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH \
            "${ev[@]}" --out "$w/eval-cuda-cp2.json" --set device.kind=cuda --set parallel.cp=2 --set parallel.dp=1 \
            >> "$L/hf-eval.log" 2>&1 || rc=1
    fi
    "$PY" - "$w" <<'EOF' || rc=1
import glob, json, sys
w = sys.argv[1]
ref = json.load(open(f"{w}/eval-cpu.json"))
ok = True
for f in sorted(glob.glob(f"{w}/eval-cuda*.json")):
    got = json.load(open(f))
    worst = max([abs(got["loss"] - ref["loss"]) / ref["loss"]] +
                [abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(got["buckets"], ref["buckets"])])
    same = [(a["from"], a["tokens"]) for a in got["buckets"]] == [(b["from"], b["tokens"]) for b in ref["buckets"]]
    ok &= same and worst <= 1e-2
    print(f"eval {f.split('/')[-1]}: loss {got['loss']:.6f} vs cpu {ref['loss']:.6f}, worst bucket rel {worst:.2e} "
          f"(bound 1e-2), buckets {'the same' if same else 'DIFFER'}: {'ok' if same and worst <= 1e-2 else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF
    env -u PYTHONPATH timeout "$(left)" "$PY" tests/parity/hf_check.py "$w/run" "$w/recall.tok" "$w/check" \
        > "$L/hf.log" 2>&1 || rc=1
    grep -E "single:|packed:|^hf_check" "$L/hf.log" | tail -6
    for b in swap-v-heads deinterleave; do
        env -u PYTHONPATH timeout "$(left)" "$PY" tests/parity/hf_check.py "$w/run" "$w/recall.tok" "$w/check" \
            --break "$b" --scale 30 --top 1 > "$L/hf-break-$b.log" 2>&1
        local brc=$?
        grep -E "FAIL|PASS" "$L/hf-break-$b.log" | tail -3
        [ $brc -eq 1 ] && grep -q "^hf_check: FAIL" "$L/hf-break-$b.log" ||
            { echo "hf: --break $b did not fail its comparisons (rc $brc)"; tail -3 "$L/hf-break-$b.log"; rc=1; }
    done
    return $rc
}

# suite_long_parity: tests/cuda/long_gpu_check.sh and the copy queue's test_cuda case
suite_long_parity() {
    local rc=0
    timeout "$(left)" tests/cuda/long_gpu_check.sh build /tmp/device_suite_long > "$L/long_gpu_check.log" 2>&1 || rc=1
    grep -E "^==|^-- |^  cuda|^parity_step|long_gpu_check:|FAIL" "$L/long_gpu_check.log" | tail -40
    build/test_cuda cuda_copyq_order > "$L/test_cuda_copyq.log" 2>&1 || rc=1
    tail -3 "$L/test_cuda_copyq.log"
    return $rc
}

# the 1B at 1M tokens on two GPUs (issue 18): its plan, then 3 steps
suite_long_1m() {
    local cfg=configs/hybrid-1b-1m-h100x2.yaml rc=0
    build/ringscan plan $cfg | grep -E "^  total|^  kept|^  \(kept|verdict"
    free -g | head -2
    suite_train long-1m 2 3 $cfg || rc=1
    rm -rf $TRAIN_DIR
    # the peer beside it: torch context_parallel + cuDNN, one attention layer (16 heads, hd 128) fwd+bwd at 1M
    [ "${LONG_1M_PEER:-1}" = 0 ] && return $rc
    local d=/tmp/device_suite_long-1m-torch
    mpirun -np 2 --allow-run-as-root build/ringscan bench cp --parts attn --T 1048576 --attn-shapes 16/16/128 \
        --warmup 1 --reps 1 --write-requests --out $d > "$L/long-1m-torch.log" 2>&1 || rc=1
    timeout "$(left)" python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/peer/cp_attn_torch.py \
        --request $d/request_cp_attn.json --out "$W/long-1m-torch.json" >> "$L/long-1m-torch.log" 2>&1 || rc=1
    python3 -c "import json,sys; [print('  torch 1M:', r) for r in json.load(open(sys.argv[1]))['results']]" \
        "$W/long-1m-torch.json" || rc=1
    return $rc
}

# the longest sample plan fits on one 80 GB GPU with room for the ~2% measured above plan (LONG_1GPU_T, default
# 720,896 tokens with gdn_keep none: 74.31 GiB of 79 under remat, offload host), 2 optimizer steps on GPU 0
suite_long_1gpu() {
    local cfg=configs/hybrid-1b-1m-h100x2.yaml rc=0 s=(--set parallel.cp=1 --set data.seq_len=${LONG_1GPU_T:-720896}
        --set checkpoint.gdn_keep=${LONG_1GPU_KEEP:-none})
    build/ringscan plan $cfg "${s[@]}" --set slurm.gpus_per_node=1 | grep -E "^  total  |verdict"
    suite_train long-1gpu 1 2 $cfg "${s[@]}" || rc=1
    rm -rf $TRAIN_DIR
    return $rc
}

suite_long_256k() {
    local cfg=configs/hybrid-1b-1m-h100x2.yaml rc=0 s=(--set data.seq_len=262144)
    suite_train long-256k-whole 2 4 $cfg "${s[@]}" --set checkpoint.chunk_rows=65536 --set checkpoint.offload=none ||
        rc=1
    suite_train long-256k-chunked 2 4 $cfg "${s[@]}" --set checkpoint.offload=none || rc=1
    suite_train long-256k-offload 2 4 $cfg "${s[@]}" || rc=1
    python3 - $TRAIN_DIR <<'EOF' || rc=1
import json, sys
d = sys.argv[1]
runs = {n: [json.loads(l) for l in open(f"{d}/long-256k-{n}/metrics.jsonl")] for n in ("whole", "chunked", "offload")}
# the steps after the first (warm-up: allocator, cuBLASLt plans, NCCL)
ms = {n: sum(r["ms"] for r in rs[1:]) / max(len(rs) - 1, 1) for n, rs in runs.items()}
print(f"256k, ms/step after step 1: whole {ms['whole']:.0f}, chunked {ms['chunked']:.0f} "
      f"(x{ms['chunked'] / ms['whole']:.3f}), chunked + offload {ms['offload']:.0f} "
      f"(x{ms['offload'] / ms['chunked']:.3f} of chunked, x{ms['offload'] / ms['whole']:.3f} of whole)")
same = all(a["loss"] == b["loss"] for a, b in zip(runs["offload"], runs["chunked"]))
close = max(abs(a["loss"] - b["loss"]) for a, b in zip(runs["chunked"], runs["whole"]))
print(f"losses: offload vs chunked {'bitwise equal' if same else 'DIFFER'}; chunked vs whole max |diff| {close:.2e}")
sys.exit(0 if same and close < 1e-2 else 1)
EOF
    rm -rf $TRAIN_DIR
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
    gdn-base) suite_gdn_base ;;
    gdn32k-dwg) suite_gdn32k gdn32k-dwg --gdn-tune dual_wgmma=1 ;;
    gdn32k-sfbv32) suite_gdn32k gdn32k-sfbv32 --gdn-tune state_fwd_wgmma_cols=32 ;;
    gdn32k-dwg-sfbv32) suite_gdn32k gdn32k-dwg-sfbv32 --gdn-tune dual_wgmma=1,state_fwd_wgmma_cols=32 ;;
    gdn-cycles) suite_gdn_cycles ;;
    attn) suite_bench attn attn --peer --peer-timeout 200 ;;
    attn32k) suite_bench attn32k attn --T 32768 --peer --peer-timeout 120 ;;
    attn-cudnn) suite_attn_cudnn ;;
    attn-auto) suite_attn_auto ;;
    attn-cudnn-det) suite_attn_cudnn_det ;;
    attn-cudnn-wide) suite_attn_cudnn_wide ;;
    step-cudnn) suite_step_cudnn ;;
    step) suite_step_none ;;
    remat) suite_bench remat step --profile 1 ;;
    cp-parity)
        timeout "$(left)" tests/cuda/cp_gpu_check.sh build /tmp/device_suite_cp > "$L/cp-parity.log" 2>&1
        r=$?
        grep -E "^==|^--|FAIL|within|ok$|resume|counters|curve|worst|cp_gpu_check" "$L/cp-parity.log" | head -60
        [ $r -eq 0 ]
        ;;
    cp4-parity)
        FOUR_ONLY=1 timeout "$(left)" tests/cuda/cp_gpu_check.sh build /tmp/device_suite_cp4 > "$L/cp4-parity.log" 2>&1
        r=$?
        grep -E "^==|^--|FAIL|within|ok$|curve|worst|cp_gpu_check" "$L/cp4-parity.log" | grep -v "^model" | head -60
        [ $r -eq 0 ]
        ;;
    cp-step) suite_cp_step ;;
    long-parity) suite_long_parity ;;
    long-1m) suite_long_1m ;;
    long-256k) suite_long_256k ;;
    long-1gpu) suite_long_1gpu ;;
    long-1m-cudnn) suite_long_1m_cudnn ;;
    step-states)
        suite_bench step-states step --profile 1 --set checkpoint.activations=none --set checkpoint.gdn_keep=states
        ;;
    cp2) suite_cp cp2 2 --peer --peer-timeout 240 ;;
    cp2-attn) suite_cp cp2-attn 2 --parts attn --T 131072,262144 --peer --peer-timeout 150 ;;
    cp2-gdn) suite_cp cp2-gdn 2 --parts gdn ;;
    cp2-ring-calls|cp2-ring-calls-cudnn)
        impl=ringscan
        [ "$part" = cp2-ring-calls-cudnn ] && impl=cudnn
        for i in $(seq "${RING_ROUNDS:-2}"); do
            for how in pairs auto; do
                suite_cp "cp2-ring-$impl-$how-$i" 2 --parts attn --T 131072 --attn-impl $impl --ring-calls $how || status=1
            done
        done ;;
    attn-cudnn-parity) suite_attn_cudnn_parity || status=1 ;;
    ring2-calls)
        RS_ATTN_TIMING=5 timeout "$(left)" build/test_cuda cuda_attention_timing > "$L/ring2-calls.log" 2>&1
        r=$?
        grep -E "^ring2|ok|FAIL" "$L/ring2-calls.log"
        [ $r -eq 0 ]
        ;;
    cp2-ring-kv)  # the backward from the forward's K|V (kept) against passing it again, cuDNN then ours
        for impl in cudnn ringscan; do
            for i in $(seq "${RING_ROUNDS:-2}"); do
                for kv in passed kept; do
                    suite_cp "cp2-ring-$impl-$kv-$i" 2 --parts attn --T 131072 --attn-impl $impl --ring-kv $kv || status=1
                done
            done
        done ;;
    cp2-ring-dq)
        for i in 1 2; do
            for dq in 0 1; do
                suite_cp "cp2-ring-dq$dq-$i" 2 --parts attn --T 131072 --attn-tune dq_atomic=$dq || status=1
            done
        done ;;
    cp2-ring-ab)  # this build against RING_BASE_BIN, both kernels, alternated
        [ -x "${RING_BASE_BIN:-}" ] || { echo "cp2-ring-ab: RING_BASE_BIN (a ringscan to compare with) not set"; status=1; }
        for i in $(seq "${RING_ROUNDS:-2}"); do
            for k in cudnn ringscan; do
                for bin in base new; do
                    [ $bin = base ] && [ ! -x "${RING_BASE_BIN:-}" ] && continue
                    RS_BIN=$([ $bin = base ] && echo "$RING_BASE_BIN" || echo build/ringscan) \
                        suite_cp "cp2-ring-$k-$bin-$i" 2 --parts attn --T 131072 --attn-impl $k || status=1
                done
            done
        done ;;
    cp2-gdn-chain)
        for i in $(seq "${CHAIN_ROUNDS:-2}"); do
            for how in staged whole; do
                suite_cp "cp2-gdn-$how-$i" 2 --parts gdn ${GDN_CASES:---gdn-T 65536,131072 --heads 64} --gdn-chain $how \
                    || status=1
            done
        done ;;
    cp2-gdn-peer) suite_cp cp2-gdn-peer 2 --parts gdn ${GDN_CASES:-} --peer --peer-timeout $(($(left) - ${GDN_OURS_S:-200})) ;;
    cp2-512k) suite_cp cp2-512k 2 --parts attn --T 524288 --reps 2 --peer --peer-timeout 240 ;;
    cp2-attn-cudnn) suite_cp cp2-attn-cudnn 2 --parts attn --attn-impl cudnn --T 131072,262144,524288 --reps 3 --peer \
        --peer-timeout 240 ;;
    cp4-attn) suite_cp cp4-attn 4 --parts attn --T 131072,524288,1048576 --attn-shapes 16/16/128 --reps "${CP4_REPS:-2}" \
        --peer --peer-timeout "${CP4_PEER_S:-300}" ;;
    cp4-gdn) suite_cp cp4-gdn 4 --parts gdn --gdn-T 131072 --heads 64 --peer --peer-timeout $(($(left) - 120)) ;;
    cp4-gdn-nopeer) suite_cp cp4-gdn-nopeer 4 --parts gdn --gdn-T 131072 --heads 64 ;;
    cp4-step) suite_cp4_step ;;
    cp4-1m) suite_cp4_1m ;;
    hf) suite_hf ;;
    *)
        echo "unknown part '$part' (parity parity-gdn big gdn gdn-nopeer gdn-states gdn32k gdn32k-dwg gdn32k-sfbv32"
        echo "  gdn32k-dwg-sfbv32 gdn-cycles gdn-base attn attn32k attn-cudnn attn-cudnn-det attn-cudnn-wide step"
        echo "  remat step-states step-cudnn cp-parity cp-step cp2 cp2-attn cp2-attn-cudnn cp2-gdn cp2-gdn-chain cp2-gdn-peer cp2-ring-calls"
        echo "  cp2-ring-calls-cudnn cp2-ring-kv attn-cudnn-parity ring2-calls"
        echo "  cp2-ring-dq cp2-ring-ab cp2-512k cp4-parity cp4-attn cp4-gdn cp4-gdn-nopeer cp4-step cp4-1m hf long-parity long-1m long-1m-cudnn long-256k long-1gpu)"
        false
        ;;
    esac || status=1
    tar czf "$OUT/device_suite.tgz" -C "$W" .  # after every part: a call cut off still brings back the logs so far
done
tar czf "$OUT/device_suite.tgz" -C "$W" .
# the autotuners' choices only (TRITON_CACHE_AUTOTUNING=1 writes them as *.autotune.json): the compiled
# kernels of every tried configuration made the whole cache too big to come back from the device tool
[ -n "${TRITON_CACHE_SAVE:-}" ] && (cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar cJf "$TRITON_CACHE_SAVE" -T -)
echo "== done at ${SECONDS} s, status $status (logs: $OUT/device_suite.tgz)"
exit $status
