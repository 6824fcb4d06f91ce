#!/bin/bash
# gpu_cluster_check.sh — issue 40: a real two-node Slurm cluster on a machine with 2 GPUs (one GPU per node,
# NCCL over its network transport between them), and a cp 2 GPU job across the nodes as a user submits it.
# From the repository root, with the folder slurm/gpu-cluster/bring.sh made (carried to the GPU machine):
#
#   tests/cuda/gpu_cluster_check.sh [BUNDLE] [OUT_DIR]     (defaults .carry/gpu-cluster, runs/gpu_cluster_check)
#
# Steps, each ending in one PASS or FAIL line (the logs under OUT_DIR):
#   install    slurm/gpu-cluster/install.sh BUNDLE (the carried Debian packages, no network); the machine's
#              facts and its package list (machine-dpkg.txt: bring.sh --listing) are kept in OUT_DIR first
#   cluster    slurm/gpu-cluster/start.sh: munged, slurmctld, slurmd n1 and n2, each owning one GPU (gres)
#   launch     srun --mpi=pmix of mpi_hello over n1 and n2 (one task and one GPU each): Open MPI starts, each
#              node's task sees its own GPU; then the same over UCX (informational: the jobs use UCX when it
#              works, Open MPI's TCP otherwise; slurm/gpu-cluster/site.env)
#   one-node   the reference: plain mpirun on this host, cp 2 over NVLink (NCCL's default transports); first
#              a short run over the network transport (NCCL_P2P/SHM off, outside Slurm) measures a step,
#              and STEPS is set so that a run lasts about RUN_S seconds (the stops below land mid-run)
#   submit     `ringscan submit` of the same run (cp 2, slurm.nodes 2, slurm.gpus_per_node 1,
#              device.attention_kernel ringscan, slurm.site_env slurm/gpu-cluster/site.env): it completes
#              on n[1-2], the job log shows NCCL's network transport (NET/Socket) and no P2P/SHM channel,
#              its losses match the one-node run within the cp checks' curve bound (CURVE_TOL of the first
#              loss, tests/cuda/cp_gpu_check.sh; bitwise equality is said when it holds)
#   preempt    the same job again: the warning signal (scancel --signal=USR1 --batch) mid-run, then
#              `scontrol requeue` (SIGTERM) mid-run of the resumed run: both stops checkpoint, the job
#              requeues and resumes twice, and its losses are bitwise those of `submit`
#   kill       the same job again, checkpoint every STEPS/8 steps: kill -9 of rank 1 (the task on n2)
#              mid-run: rank 0's watchdog names rank 1, every rank ends with 76, the job requeues itself,
#              resumes from the last checkpoint and ends with `submit`'s losses, bitwise
# Environment: UCX=0 (no UCX probe: the jobs use Open MPI's TCP), RUN_S (default 12), STEPS (fixed instead of measured), CURVE_TOL (default 2e-2), KEEP=1
# (leave the cluster running), EXTRA_SETS (more --set KEY=VALUE for every run, e.g. a smaller sample for
# the cpu rehearsal). Exit 0 when every step passed. Needs root, 2 GPUs, python3, Open MPI.
# A rehearsal without GPUs (the script's own logic, on a machine with Slurm installed): DEVICE=cpu
# GPU_FILES="two character devices named like nvidia0 nvidia1" (mknod NAME c 1 3): the same steps on the cpu
# backend, the transport step left out.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
BUNDLE=${1:-.carry/gpu-cluster}
O=${2:-runs/gpu_cluster_check}
RUN_S=${RUN_S:-12}
DEVICE=${DEVICE:-cuda}
CURVE_TOL=${CURVE_TOL:-2e-2}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PATH=$PATH:/usr/sbin:/sbin
mkdir -p "$O" && O=$(cd "$O" && pwd) || exit 2
W=$(mktemp -d /tmp/gpu_cluster.XXXXXX) && chmod 755 "$W"  # munged's socket lies below it
C=$W/cluster
rc=0
T0=$SECONDS
pass() { echo "PASS $1: $2 ($((SECONDS - T0)) s)"; }
fail() { echo "FAIL $1: $2 ($((SECONDS - T0)) s)"; rc=1; }
finish() {
    [ -e "$C/pids" ] && [ "${KEEP:-0}" != 1 ] && slurm/gpu-cluster/stop.sh "$C" > "$O/stop.log" 2>&1
    [ -d "$C/log" ] && cp -r "$C/log" "$O/slurm-logs" 2> /dev/null
    for d in "$W"/runs/*; do
        [ -d "$d" ] || continue
        mkdir -p "$O/runs/$(basename "$d")" && cp -r "$d"/logs "$d"/log.txt "$d"/metrics.jsonl "$d"/.watchdog \
            "$O/runs/$(basename "$d")/" 2> /dev/null
    done
    echo "== gpu_cluster_check: $([ $rc = 0 ] && echo "every step passed" || echo "FAILED") in $((SECONDS - T0)) s (logs: $O)"
    exit $rc
}
trap finish EXIT
trap 'fail interrupted "a signal ended the check"; exit' TERM INT

# ---- install ------------------------------------------------------------------------------------------------
{
    cat /etc/os-release 2> /dev/null
    echo "glibc $(getconf GNU_LIBC_VERSION)"
    nvidia-smi -L
    mpirun --version 2>&1 | head -1
    ompi_info 2> /dev/null | grep -E "MCA (pml|btl|pmix)"
    ldconfig -p | grep -E "libpmix|libucp|libnccl|libmpi\.so"
} > "$O/machine.txt" 2>&1
dpkg-query -W -f '${Package}\t${Version}\n' > "$O/machine-dpkg.txt" 2> /dev/null
head -2 "$O/machine.txt" | tail -1
if PREFIX=$W/prefix slurm/gpu-cluster/install.sh "$BUNDLE" > "$O/install.log" 2>&1; then
    pass install "$(grep -o 'added [0-9]* packages' "$O/install.log"); $(tail -1 "$O/install.log" | cut -c 1-160)"
else
    fail install "$(grep FAILED "$O/install.log")"
    tail -20 "$O/install.log"
    exit
fi
RS=$W/bin/ringscan
mkdir -p "$W/bin"
if [ -s "$BUNDLE/bin/ringscan.gz" ]; then gunzip -c "$BUNDLE/bin/ringscan.gz" > "$RS" && chmod +x "$RS"; else cp build/ringscan "$RS"; fi
"$RS" --version > "$O/ringscan-version.txt" 2>&1
[ "$DEVICE" = cpu ] || grep -q "backends.*cuda" "$O/ringscan-version.txt" || { fail install "no cuda ringscan: $(head -3 "$O/ringscan-version.txt")"; exit; }

# ---- cluster ------------------------------------------------------------------------------------------------
if slurm/gpu-cluster/start.sh "$C" ${GPU_FILES:-} > "$O/start.log" 2>&1; then
    . "$C/env"
    pass cluster "$(sinfo -h -N -o '%N %T %G' | tr '\n' ' ')"
else
    fail cluster "$(grep FAILED "$O/start.log")"
    tail -25 "$O/start.log"
    exit
fi

# ---- launch -------------------------------------------------------------------------------------------------
HELLO=$BUNDLE/bin/mpi_hello
SITE=slurm/gpu-cluster/site.env
launch() { # NAME SECONDS [VAR=VALUE...]: mpi_hello under srun --mpi=pmix on n1 and n2, one GPU each, with site.env
    (. $SITE && env "${@:3}" timeout "$2" srun -N 2 --ntasks-per-node=1 --gpus-per-node=1 --mpi=pmix "$HELLO") \
        > "$O/launch-$1.log" 2>&1
}
LAUNCHER=srun
if launch tcp 60 && [ "$(grep -c 'allreduce 2$' "$O/launch-tcp.log")" = 2 ]; then
    g1=$(grep -E -o 'node n1, CUDA_VISIBLE_DEVICES [0-9]+(,[0-9]+)*' "$O/launch-tcp.log")
    g2=$(grep -E -o 'node n2, CUDA_VISIBLE_DEVICES [0-9]+(,[0-9]+)*' "$O/launch-tcp.log")
    if [ "${g1##* }" = 0 ] && [ "${g2##* }" = 1 ]; then pass launch "srun --mpi=pmix over n1, n2: $g1; $g2"
    else fail launch "each node must see its own GPU: $g1; $g2"; fi
else
    fail launch "srun --mpi=pmix cannot start Open MPI here: $(grep -i -m3 'error\|pmix' "$O/launch-tcp.log" | tr '\n' ' ')"
    echo "  (the jobs below use slurm.launcher=mpirun; the kill step needs srun and is not run)"
    LAUNCHER=mpirun
fi
if [ "${UCX:-1}" = 0 ]; then
    echo "INFO launch: UCX=0: the jobs use Open MPI's TCP (ob1)"
elif [ $LAUNCHER = srun ] && launch ucx 20 OMPI_MCA_pml=ucx UCX_TLS=tcp,self UCX_NET_DEVICES=lo &&
    [ "$(grep -c 'allreduce 2$' "$O/launch-ucx.log")" = 2 ]; then
    export OMPI_MCA_pml=ucx UCX_TLS=tcp,self UCX_NET_DEVICES=lo
    echo "INFO launch: Open MPI over UCX (tcp on lo) works: the jobs use it"
else
    echo "INFO launch: Open MPI over UCX does not start here ($(grep -i -m1 'ucx\|error' "$O/launch-ucx.log" 2> /dev/null |
        cut -c 1-120)); the jobs use Open MPI's TCP (ob1)"
fi

# ---- one-node -----------------------------------------------------------------------------------------------
"$RS" data synth "$W/recall.tok" --seed 1 > "$O/data.log" 2>&1 || { fail one-node "ringscan data synth"; exit; }
sets() { # RUN_DIR STEPS: the run of every step below
    echo --set device.kind=$DEVICE --set parallel.dp=1 --set parallel.cp=2 --set device.attention_kernel=ringscan \
        --set data.path="$W/recall.tok" --set run.out_dir="$1" --set train.steps="$2" --set train.warmup_steps=10 \
        --set checkpoint.every=$(($2 / 8 > 0 ? $2 / 8 : 1)) --set slurm.nodes=2 --set slurm.gpus_per_node=1 \
        --set slurm.time=00:15:00 --set slurm.signal_s=30 --set slurm.site_env=$SITE --set slurm.launcher=$LAUNCHER \
        --set parallel.comm_timeout_s=20 ${EXTRA_SETS:-}
}
plain() { # NAME STEPS [VAR=VALUE...]: mpirun -np 2 on this host, outside Slurm (Open MPI's defaults; the ranks
    # are mpirun's children here and inherit its environment)
    env -u OMPI_MCA_pml -u UCX_TLS -u UCX_NET_DEVICES "${@:3}" timeout 300 mpirun --allow-run-as-root --bind-to none \
        -np 2 "$RS" train configs/tiny-cpu.yaml $(sets "$W/runs/$1" "$2") > "$O/$1.log" 2>&1
}
ms_of() { $PY -c "import json,sys; r=sorted(json.loads(l)['ms'] for l in list(open(sys.argv[1]))[5:]); print('%.1f' % r[len(r)//2])" "$1"; }
if [ -n "${STEPS:-}" ]; then
    echo "INFO one-node: STEPS=$STEPS (given)"
elif plain calibrate 60 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_NET=Socket NCCL_DEBUG=WARN; then
    ms=$(ms_of "$W/runs/calibrate/metrics.jsonl")
    STEPS=$($PY -c "print(max(200, min(4000, int($RUN_S * 1000 / max($ms, 0.1)))))")
    echo "INFO one-node: a step over NCCL's network transport takes $ms ms (median): STEPS=$STEPS (about $RUN_S s a run)"
else
    fail one-node "the measuring run over the network transport failed: $(grep -m2 error "$O/calibrate.log")"
    STEPS=1000
fi
if plain one_node "$STEPS" NCCL_DEBUG=INFO; then
    pass one-node "mpirun cp 2 on this host, $STEPS steps, $(ms_of "$W/runs/one_node/metrics.jsonl") ms a step; NCCL: $(
        grep -m1 -o 'via [A-Za-z/]*' "$O/one_node.log")"
else
    fail one-node "$(grep -m2 error "$O/one_node.log")"
fi

# ---- the jobs -----------------------------------------------------------------------------------------------
submit() { # NAME: submits the run, prints the job id
    "$RS" submit configs/tiny-cpu.yaml $(sets "$W/runs/$1" "$STEPS") --set run.name="$1" 2> "$O/submit-$1.err"
}
state() { scontrol show job -o "$1" 2> /dev/null | grep -o " $2=[^ ]*" | head -1 | cut -d= -f2; }
terminal() { case "$(state "$1" JobState)" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | PREEMPTED | OUT_OF_MEMORY) return 0 ;; esac; return 1; }
wait_job() { # JOB [SECONDS]: until it ends
    local end=$((SECONDS + ${2:-300}))
    while [ $SECONDS -lt $end ] && ! terminal "$1"; do sleep 1; done
    terminal "$1"
}
wait_steps() { # JOB RUN_DIR N RESTART: until run RESTART of the job has started and metrics.jsonl holds N steps
    local end=$((SECONDS + 180))
    while [ $SECONDS -lt $end ]; do
        [ -e "$2/logs/job-$1.$4.log" ] && [ -e "$2/metrics.jsonl" ] && [ "$(wc -l < "$2/metrics.jsonl")" -ge "$3" ] && return 0
        terminal "$1" && return 1
        sleep 0.2
    done
    return 1
}
losses() { $PY -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1/metrics.jsonl"; }
same_losses() { # A B: bitwise, and as many steps
    [ -s "$1/metrics.jsonl" ] && [ "$(losses "$1")" = "$(losses "$2")" ]
}
joblogs() { cat "$1"/logs/job-*.log 2> /dev/null; }

# submit: the uninterrupted job
B=$W/runs/whole
job=$(submit whole) || { fail submit "ringscan submit: $(tail -3 "$O/submit-whole.err")"; exit; }
wait_steps "$job" "$B" 3 0 && nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader \
    > "$O/whole-gpus.txt" 2>&1
wait_job "$job" 600
info="JobState=$(state "$job" JobState) ExitCode=$(state "$job" ExitCode) NodeList=$(state "$job" NodeList)"
joblogs "$B" > "$O/whole-job.log"
if [ "$(state "$job" JobState)" = COMPLETED ] && [ "$(state "$job" NodeList)" = "n[1-2]" ] &&
    [ "$(wc -l < "$B/metrics.jsonl")" = "$STEPS" ]; then
    pass submit "job $job $info, $STEPS steps, $(ms_of "$B/metrics.jsonl") ms a step; GPUs in use: $(
        cut -d, -f2 "$O/whole-gpus.txt" | sort -u | tr '\n' ' ')"
else
    fail submit "job $job $info: $(grep -m3 -i 'error' "$O/whole-job.log" | cut -c 1-200 | tr '\n' ' ')"
fi
if [ "$DEVICE" = cpu ]; then echo "INFO transport: not checked on the cpu backend (no NCCL)"; fi
net=$(grep -c 'via NET/Socket' "$O/whole-job.log")
p2p=$(grep -c -E 'via (P2P|SHM)' "$O/whole-job.log")
if [ "$DEVICE" = cpu ]; then :
elif [ "$net" -gt 0 ] && [ "$p2p" = 0 ] && grep -q "env: NCCL_P2P_DISABLE=1" "$O/whole-job.log"; then
    pass transport "NCCL between n1 and n2 over its network transport: $net channel lines 'via NET/Socket', none via P2P/SHM; $(
        grep -m1 -o 'NET/Socket : Using .*' "$O/whole-job.log" | cut -c 1-100)"
else
    fail transport "NET/Socket lines $net, P2P/SHM lines $p2p; the job log's NCCL lines: $(grep -m3 'NCCL INFO.*via' "$O/whole-job.log")"
fi
if [ -s "$W/runs/one_node/metrics.jsonl" ] && [ -s "$B/metrics.jsonl" ]; then
    if same_losses "$B" "$W/runs/one_node"; then
        pass equivalence "the two-node job's $STEPS losses equal the one-node run's bitwise"
    elif out=$($PY tests/cuda/compare_curves.py "$W/runs/one_node/metrics.jsonl" "$B/metrics.jsonl" --tol "$CURVE_TOL" | tail -1); then
        pass equivalence "two nodes vs one node within $CURVE_TOL of the first loss: $out"
    else
        fail equivalence "two nodes vs one node: $out"
    fi
else
    fail equivalence "a run is missing its metrics"
fi

# preempt: the warning signal, then scontrol requeue (SIGTERM)
P=$W/runs/preempt
job=$(submit preempt) || { fail preempt "ringscan submit: $(tail -3 "$O/submit-preempt.err")"; exit; }
why=""
if wait_steps "$job" "$P" $((STEPS / 5)) 0; then
    scancel --signal=USR1 --batch "$job"
    if wait_steps "$job" "$P" 1 1; then
        k1=$(grep -o -m1 'stopped by signal 10 ([^)]*) after step [0-9]*' "$P/logs/job-$job.0.log" | awk '{print $NF}')
        if [ -n "$k1" ] && wait_steps "$job" "$P" $((k1 + STEPS / 5)) 1; then
            scontrol requeue "$job"
        else why="the resumed run did not reach step $((${k1:-0} + STEPS / 5)) (stop 1 at step ${k1:-?})"; fi
    else why="no second run after the warning signal"; fi
else why="the job did not reach step $((STEPS / 5))"; fi
wait_job "$job" 600
joblogs "$P" > "$O/preempt-job.log"
k2=$(grep -h -o -E 'stopped by signal (10|15) \([^)]*\) after step [0-9]*' "$P/logs/job-$job.1.log" 2> /dev/null | head -1 | awk '{print $NF}')
if [ -z "$why" ] && [ "$(state "$job" JobState)" = COMPLETED ] && [ "$(state "$job" Restarts)" = 2 ] &&
    grep -q "SIGUSR1: the ranks checkpoint" "$P/logs/job-$job.0.log" && grep -q "SIGTERM: the ranks checkpoint" "$P/logs/job-$job.1.log" &&
    grep -q "resumed from $P/ckpt/step_$(printf %08d "${k1:-0}")" "$P/logs/job-$job.1.log" &&
    grep -q "resumed from $P/ckpt/step_$(printf %08d "${k2:-0}")" "$P/logs/job-$job.2.log" && same_losses "$P" "$B"; then
    pass preempt "job $job: warning signal stop after step $k1, requeued, resumed; SIGTERM (scontrol requeue) stop after step $k2, requeued, resumed; $STEPS losses bitwise equal to the uninterrupted job's"
else
    fail preempt "job $job ${why:+($why) }JobState=$(state "$job" JobState) Restarts=$(state "$job" Restarts) stops after ${k1:-?}, ${k2:-?}; losses $(same_losses "$P" "$B" && echo equal || echo DIFFER)"
    grep -E "SIG|stopped|resumed|exited|requeue" "$O/preempt-job.log" | head -12
fi

# kill: kill -9 of rank 1 (n2); the watchdog ends rank 0 with 76; requeue; resume from the last checkpoint
if [ $LAUNCHER != srun ]; then
    fail kill "not run: it needs srun --mpi=pmix (see launch); under mpirun a killed rank ends the job at once"
    exit
fi
K=$W/runs/kill
job=$(submit kill) || { fail kill "ringscan submit: $(tail -3 "$O/submit-kill.err")"; exit; }
why="" victim=""
if wait_steps "$job" "$K" $((STEPS / 3)) 0 && [ -e "$K/ckpt/LATEST" ]; then
    # rank 1 itself (its task's SLURM_PROCID), not a child of it (a rank's signal relay has its command line)
    ranks=$(pgrep -f "ringscan train $K/config.submitted.yaml" | tr '\n' ' ')
    for p in $ranks; do
        case " $ranks " in *" $(awk '{print $4}' /proc/$p/stat 2> /dev/null) "*) continue ;; esac
        tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -qx SLURM_PROCID=1 && victim=$p
    done
    if [ -n "$victim" ]; then
        kstep=$(wc -l < "$K/metrics.jsonl")
        node=$(tr '\0' '\n' < /proc/$victim/environ 2> /dev/null | grep SLURMD_NODENAME | cut -d= -f2)
        kill -9 "$victim"
        echo "INFO kill: kill -9 of rank 1 (pid $victim, node $node) after step $kstep, the newest checkpoint then" \
            "$(cat "$K/ckpt/LATEST" 2> /dev/null)"
    else why="rank 1's process not found"; fi
else why="the job did not reach step $((STEPS / 3)) with a checkpoint"; fi
wait_job "$job" 600
joblogs "$K" > "$O/kill-job.log"
report=$(cat "$K"/.watchdog/*/report.txt 2> /dev/null)
ck=$(grep -o -m1 "resumed from $K/ckpt/step_[0-9]*" "$K/logs/job-$job.1.log" 2> /dev/null | grep -o '[0-9]*$')
if [ -z "$why" ] && grep -q "the ranks' watchdog ended the run (log.txt: exit 76)" "$K/logs/job-$job.0.log" &&
    grep -q "requeueing job $job" "$K/logs/job-$job.0.log" && echo "$report" | grep -q -E "rank 1( \([^)]*\))?: no report" &&
    [ "$(state "$job" JobState)" = COMPLETED ] && [ "$(state "$job" Restarts)" = 1 ] && [ -n "$ck" ] && same_losses "$K" "$B"; then
    pass kill "job $job: rank 0's watchdog named rank 1 ($(echo "$report" | head -1 | cut -c 1-120)), exit 76, requeued, resumed from step $((10#$ck)); $STEPS losses bitwise equal to the uninterrupted job's"
else
    fail kill "job $job ${why:+($why) }JobState=$(state "$job" JobState) Restarts=$(state "$job" Restarts) resumed from ${ck:-none}; losses $(same_losses "$K" "$B" && echo equal || echo DIFFER)"
    grep -E "exited|watchdog|requeue|resumed|error" "$O/kill-job.log" | head -12
    echo "$report" | head -8
fi
