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
#
# On your own cluster (--site): two GPU nodes of a Slurm cluster you can submit to, from its login node
#
#   SITE_ENV=my-site.env [PARTITION=gpu] [ACCOUNT=proj] tests/cuda/gpu_cluster_check.sh --site [OUT_DIR]
#
# nothing is installed or started: sbatch, srun and scontrol reach the cluster they reach (SLURM_CONF as you
# have it), and the login node needs no GPU. The steps, with the same PASS/FAIL lines and judgements:
#   setup      SITE_ENV (your filled-in copy of slurm/site.env: slurm.site_env of every job) and RINGSCAN
#              (default build/ringscan, cuda) exist; the binary is copied into the work directory, a new
#              folder under WORK_DIR (default OUT_DIR), which MUST be on a file system the compute nodes
#              share with the login node (not /tmp): the jobs run, write and resume there
#   cluster    sinfo answers and names the partition (PARTITION, default the cluster's default partition)
#   launch     one task on each of two nodes (srun, one GPU each): two distinct nodes, each sees a GPU and the
#              work directory; then mpi_hello under srun --mpi=SRUN_MPI (built with mpicc, or MPI_HELLO)
#   one-node   the reference is a job too (the login node has no GPU): slurm.nodes 1, slurm.gpus_per_node 2;
#              without STEPS a two-node job of 60 steps first measures a step
#   submit     as above, on two distinct nodes (scontrol show hostnames), the transport step on any NCCL
#              network transport ('via NET/IB' or 'via NET/Socket') and none via P2P/SHM; then equivalence
#   preempt    as above
#   kill       rank 1 runs on the other node: a step inside the running job (srun --jobid=JOB --overlap, one
#              task per node) finds its process by SLURM_PROCID on its node and kills it there; a site that
#              refuses such steps gets a FAIL line saying so
# Environment: PARTITION, ACCOUNT, QOS (slurm.partition, .account, .qos and srun's -p, -A, -q), SRUN_MPI
# (default pmix: slurm.srun_mpi), QUEUE_S (default 1800: how long a job may wait in the queue, on top of each
# step's own time), and RUN_S, STEPS, CURVE_TOL, EXTRA_SETS as above (paths in EXTRA_SETS absolute: the jobs
# are submitted from the work directory). The checks' output, logs and runs stay in OUT_DIR.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
MODE=fake
if [ "${1:-}" = --site ]; then
    MODE=site
    O=${2:-runs/gpu_cluster_check}
else
    BUNDLE=${1:-.carry/gpu-cluster}
    O=${2:-runs/gpu_cluster_check}
fi
RUN_S=${RUN_S:-12}
DEVICE=${DEVICE:-cuda}
CURVE_TOL=${CURVE_TOL:-2e-2}
PY=${PYTHON:-python3}
SRUN_MPI=${SRUN_MPI:-pmix}
QUEUE_S=${QUEUE_S:-1800}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PATH=$PATH:/usr/sbin:/sbin
mkdir -p "$O" && O=$(cd "$O" && pwd) || exit 2
if [ $MODE = fake ]; then
    W=$(mktemp -d /tmp/gpu_cluster.XXXXXX) && chmod 755 "$W"  # munged's socket lies below it
    C=$W/cluster
    SUBMIT_DIR=. CONFIG=configs/tiny-cpu.yaml
else # the jobs' run directories, data and binary: on the file system the nodes share
    mkdir -p "${WORK_DIR:-$O}" && W=$(mktemp -d "$(cd "${WORK_DIR:-$O}" && pwd)/work.XXXXXX") && chmod 755 "$W" ||
        { echo "FAIL setup: cannot make a folder under WORK_DIR ${WORK_DIR:-$O}"; exit 1; }
    C=$W/no-cluster  # none started: nothing to stop
    SUBMIT_DIR=$W CONFIG=$PWD/configs/tiny-cpu.yaml
    export NCCL_DEBUG=${NCCL_DEBUG:-INFO}  # the transport step reads NCCL's channel lines in the job log
fi
rc=0
T0=$SECONDS
pass() { echo "PASS $1: $2 ($((SECONDS - T0)) s)"; }
fail() { echo "FAIL $1: $2 ($((SECONDS - T0)) s)"; rc=1; }
finish() {
    [ -e "$C/pids" ] && [ "${KEEP:-0}" != 1 ] && slurm/gpu-cluster/stop.sh "$C" > "$O/stop.log" 2>&1
    [ -d "$C/log" ] && cp -r "$C/log" "$O/slurm-logs" 2> /dev/null
    for d in "$W"/runs/*; do
        case "$W/" in "$O"/*) break ;; esac  # --site: in OUT_DIR already
        [ -d "$d" ] || continue
        mkdir -p "$O/runs/$(basename "$d")" && cp -r "$d"/logs "$d"/log.txt "$d"/metrics.jsonl "$d"/.watchdog \
            "$O/runs/$(basename "$d")/" 2> /dev/null
    done
    echo "== gpu_cluster_check: $([ $rc = 0 ] && echo "every step passed" || echo "FAILED") in $((SECONDS - T0)) s (logs: $O)"
    exit $rc
}
trap finish EXIT
trap 'fail interrupted "a signal ended the check"; exit' TERM INT

# ---- setup (--site) -------------------------------------------------------------------------------------------
site_setup() {
    local v
    for v in $(compgen -e | grep '^SLURM_' | grep -v -x SLURM_CONF); do unset "$v"; done  # not inside salloc's job
    [ -n "${SITE_ENV:-}" ] || { fail setup "SITE_ENV is not set: your filled-in copy of slurm/site.env (the jobs' slurm.site_env)"; exit; }
    [ -f "$SITE_ENV" ] || { fail setup "SITE_ENV $SITE_ENV does not exist"; exit; }
    SITE=$(cd "$(dirname "$SITE_ENV")" && pwd)/$(basename "$SITE_ENV")
    local src=${RINGSCAN:-build/ringscan}
    [ -f "$src" ] && [ -x "$src" ] || { fail setup "RINGSCAN $src does not exist or is not executable (make build/ringscan)"; exit; }
    mkdir -p "$W/bin" && cp "$src" "$RS" || { fail setup "cannot copy $src into $W/bin"; exit; }
    "$RS" --version > "$O/ringscan-version.txt" 2>&1
    [ "$DEVICE" = cpu ] || grep -q "backends.*cuda" "$O/ringscan-version.txt" ||
        { fail setup "no cuda ringscan: $src: $(head -3 "$O/ringscan-version.txt" | tr '\n' ' ')"; exit; }
    pass setup "$(grep -m1 -o 'git .*' "$O/ringscan-version.txt" | tr -s ' '), $(grep -m1 -o 'backends.*' "$O/ringscan-version.txt" |
        tr -s ' '); SITE_ENV $SITE; work directory $W (the compute nodes must see it: a shared file system)"
    # the cluster: sinfo answers, and names the partition
    local info parts
    if [ -n "${SLURM_CONF:-}" ] && [ ! -f "$SLURM_CONF" ]; then # (sinfo would retry a minute)
        fail cluster "SLURM_CONF $SLURM_CONF does not exist"
        exit
    elif ! parts=$(timeout 120 sinfo -h -o '%P' 2> "$O/sinfo.err"); then
        fail cluster "sinfo does not answer (SLURM_CONF=${SLURM_CONF:-unset}): $(head -2 "$O/sinfo.err" | tr '\n' ' ')"
        exit
    fi
    PART=${PARTITION:-$(echo "$parts" | grep -m1 '\*$' | tr -d '*')}
    [ -n "$PART" ] || { fail cluster "no default partition: set PARTITION (sinfo lists: $(echo $parts))"; exit; }
    info=$(sinfo -h -p "$PART" -o '%a, %D nodes, gres %G, time limit %l' 2> /dev/null | head -1)
    [ -n "$info" ] || { fail cluster "sinfo names no partition $PART (it lists: $(echo $parts))"; exit; }
    pass cluster "SLURM_CONF ${SLURM_CONF:-(the default)}, partition $PART: $info"
    {
        echo "login node $(hostname)"
        cat /etc/os-release 2> /dev/null
        sinfo --version
        scontrol show config 2> /dev/null | grep -E '^(ClusterName|SLURM_VERSION|MpiDefault|ProctrackType|TaskPlugin|SelectType) '
        mpirun --version 2>&1 | head -1
    } > "$O/machine.txt" 2>&1
    # what every job and srun below asks for beyond its nodes: the partition, account and QOS given
    SRUN_ARGS=() SITE_SETS=""
    [ -n "${PARTITION:-}" ] && SRUN_ARGS+=(-p "$PARTITION") && SITE_SETS+=" --set slurm.partition=$PARTITION"
    [ -n "${ACCOUNT:-}" ] && SRUN_ARGS+=(-A "$ACCOUNT") && SITE_SETS+=" --set slurm.account=$ACCOUNT"
    [ -n "${QOS:-}" ] && SRUN_ARGS+=(-q "$QOS") && SITE_SETS+=" --set slurm.qos=$QOS"
    SITE_SETS+=" --set slurm.srun_mpi=$SRUN_MPI"
}

# ---- launch (--site) ------------------------------------------------------------------------------------------
site_launch() {
    local gpus="" probe n1 n2 hello
    [ "$DEVICE" = cpu ] || gpus=--gpus-per-node=1
    # each task: its node, its host, its GPUs, and whether it sees the work directory and the binary
    probe="echo probe: node \$SLURMD_NODENAME host \$(hostname) CUDA_VISIBLE_DEVICES \${CUDA_VISIBLE_DEVICES:-none} \
work \$(touch $W/seen.\$SLURMD_NODENAME && echo seen || echo MISSING) ringscan \$([ -x $RS ] && echo seen || echo MISSING)"
    timeout $((QUEUE_S + 120)) srun -N 2 --ntasks-per-node=1 $gpus --time=00:05:00 "${SRUN_ARGS[@]}" \
        bash -c "$probe" > "$O/launch-nodes.log" 2>&1
    n1=$(grep -m1 '^probe:' "$O/launch-nodes.log" | cut -d' ' -f3)
    n2=$(grep '^probe:' "$O/launch-nodes.log" | sed -n 2p | cut -d' ' -f3)
    if [ "$(grep -c '^probe:' "$O/launch-nodes.log")" != 2 ] || [ "$n1" = "$n2" ]; then
        fail launch "srun -N 2 did not start one task on each of two nodes: $(head -3 "$O/launch-nodes.log" | cut -c 1-160 | tr '\n' ' ')"
        exit
    elif grep -q MISSING "$O/launch-nodes.log" || [ ! -e "$W/seen.$n1" ] || [ ! -e "$W/seen.$n2" ]; then
        fail launch "a node does not see the work directory or the binary (WORK_DIR must be on a shared file system): $(
            grep MISSING "$O/launch-nodes.log" | tr '\n' ' ')$(cd "$W" && ls seen.* 2> /dev/null | tr '\n' ' ')seen here)"
        exit
    elif [ -n "$gpus" ] && grep -q 'CUDA_VISIBLE_DEVICES none' "$O/launch-nodes.log"; then
        fail launch "a node's task sees no GPU under --gpus-per-node=1: $(grep '^probe:' "$O/launch-nodes.log" | tr '\n' ' ')"
        exit
    fi
    pass launch "srun over two nodes: $(grep '^probe:' "$O/launch-nodes.log" | cut -d' ' -f3-7 | sort | paste -sd ';'); each sees the work directory"
    LAUNCHER=srun
    hello=${MPI_HELLO:-}
    if [ -z "$hello" ] && command -v mpicc > /dev/null; then
        hello=$W/bin/mpi_hello
        mpicc -O2 -o "$hello" slurm/gpu-cluster/mpi_hello.c > "$O/mpicc.log" 2>&1 || hello=""
    fi
    if [ -z "$hello" ]; then
        echo "INFO launch: no mpicc here (nor MPI_HELLO): Open MPI under srun --mpi=$SRUN_MPI is first tried by the jobs"
    elif (. "$SITE" && timeout $((QUEUE_S + 120)) srun -N 2 --ntasks-per-node=1 $gpus --time=00:05:00 "${SRUN_ARGS[@]}" \
        --mpi="$SRUN_MPI" "$hello") > "$O/launch-mpi.log" 2>&1 && [ "$(grep -c 'allreduce 2$' "$O/launch-mpi.log")" = 2 ]; then
        echo "INFO launch: Open MPI starts under srun --mpi=$SRUN_MPI with SITE_ENV: $(grep -o 'rank.*' "$O/launch-mpi.log" |
            cut -d, -f1 | paste -sd ';')"
    else
        fail launch "srun --mpi=$SRUN_MPI cannot start Open MPI with SITE_ENV: $(grep -i -m3 'error\|pmix' "$O/launch-mpi.log" | tr '\n' ' ')"
        echo "  (the jobs below use slurm.launcher=mpirun; the kill step needs srun and is not run)"
        LAUNCHER=mpirun
    fi
}

if [ $MODE = fake ]; then
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
    elif [ $LAUNCHER = srun ] && launch ucx 20 OMPI_MCA_pml=ucx OMPI_MCA_pml_ucx_tls=any OMPI_MCA_pml_ucx_devices=any \
        UCX_TLS=tcp,self UCX_NET_DEVICES=lo && [ "$(grep -c 'allreduce 2$' "$O/launch-ucx.log")" = 2 ]; then
        export OMPI_MCA_pml=ucx OMPI_MCA_pml_ucx_tls=any OMPI_MCA_pml_ucx_devices=any UCX_TLS=tcp,self UCX_NET_DEVICES=lo
        echo "INFO launch: Open MPI over UCX (tcp on lo) works: the jobs use it"
    else
        echo "INFO launch: Open MPI over UCX does not start here ($(grep -i -m1 'ucx\|error' "$O/launch-ucx.log" 2> /dev/null |
            cut -c 1-120)); the jobs use Open MPI's TCP (ob1)"
    fi
else
    RS=$W/bin/ringscan
    site_setup
    site_launch
fi

# ---- one-node -----------------------------------------------------------------------------------------------
"$RS" data synth "$W/recall.tok" --seed 1 > "$O/data.log" 2>&1 || { fail one-node "ringscan data synth"; exit; }
sets() { # RUN_DIR STEPS [NODES GPUS_PER_NODE]: the run of every step below (default 2 nodes of 1 GPU)
    echo --set device.kind=$DEVICE --set parallel.dp=1 --set parallel.cp=2 --set device.attention_kernel=ringscan \
        --set data.path="$W/recall.tok" --set run.out_dir="$1" --set train.steps="$2" --set train.warmup_steps=10 \
        --set checkpoint.every=$(($2 / 8 > 0 ? $2 / 8 : 1)) --set slurm.nodes=${3:-2} --set slurm.gpus_per_node=${4:-1} \
        --set slurm.time=00:15:00 --set slurm.signal_s=30 --set slurm.site_env=$SITE --set slurm.launcher=$LAUNCHER \
        --set parallel.comm_timeout_s=20 ${SITE_SETS:-} ${EXTRA_SETS:-}
}
plain() { # NAME STEPS [VAR=VALUE...]: mpirun -np 2 on this host, outside Slurm (Open MPI's defaults; the ranks
    # are mpirun's children here and inherit its environment)
    env -u OMPI_MCA_pml -u OMPI_MCA_pml_ucx_tls -u OMPI_MCA_pml_ucx_devices -u UCX_TLS -u UCX_NET_DEVICES "${@:3}" \
        timeout 300 mpirun --allow-run-as-root --bind-to none -np 2 "$RS" train configs/tiny-cpu.yaml \
        $(sets "$W/runs/$1" "$2") > "$O/$1.log" 2>&1
}
ms_of() { $PY -c "import json,sys; r=sorted(json.loads(l)['ms'] for l in list(open(sys.argv[1]))[5:]); print('%.1f' % r[len(r)//2])" "$1"; }
# the jobs -----------------------------------------------------------------------------------------------------
submit() { # NAME [STEPS [NODES GPUS_PER_NODE]]: submits the run (default: $STEPS steps, 2 nodes of 1 GPU), prints
    # the job id. --site submits from the work directory: the job's working directory is then on the shared file system
    (cd "$SUBMIT_DIR" && "$RS" submit "$CONFIG" $(sets "$W/runs/$1" "${2:-$STEPS}" "${3:-2}" "${4:-1}") --set run.name="$1") \
        2> "$O/submit-$1.err"
}
state() { scontrol show job -o "$1" 2> /dev/null | grep -o " $2=[^ ]*" | head -1 | cut -d= -f2; }
terminal() { case "$(state "$1" JobState)" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | PREEMPTED | OUT_OF_MEMORY) return 0 ;; esac; return 1; }
queued() { # JOB: --site: it waits in the queue (the time a step allows starts when it runs), at most QUEUE_S
    [ $MODE = site ] || return 1
    case "$(state "$1" JobState)" in PENDING | CONFIGURING | REQUEUED) return 0 ;; esac
    return 1
}
wait_job() { # JOB [SECONDS]: until it ends
    local t=${2:-300} q=$((SECONDS + QUEUE_S)) end
    end=$((SECONDS + t))
    while [ $SECONDS -lt $end ] && ! terminal "$1"; do
        queued "$1" && [ $SECONDS -lt $q ] && end=$((SECONDS + t))
        sleep 1
    done
    terminal "$1"
}
wait_steps() { # JOB RUN_DIR N RESTART: until run RESTART of the job has started and metrics.jsonl holds N steps
    local end=$((SECONDS + 180)) q=$((SECONDS + QUEUE_S))
    while [ $SECONDS -lt $end ]; do
        queued "$1" && [ $SECONDS -lt $q ] && end=$((SECONDS + 180))
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
hosts() { scontrol show hostnames "$(state "$1" NodeList)" 2> /dev/null | paste -sd, -; }  # JOB: its nodes, a comma list
two_nodes() { # JOB: it ran on the two nodes (on this machine's cluster: n1 and n2; --site: any two distinct ones)
    if [ $MODE = fake ]; then [ "$(state "$1" NodeList)" = "n[1-2]" ]; else [ "$(hosts "$1" | tr , '\n' | sort -u | wc -l)" = 2 ]; fi
}
in_job() { # JOB NODES CMD...: --site: CMD as one task on each of NODES (a comma list), a step inside the running job
    # beside its ranks (srun --overlap); a site may refuse such steps
    timeout 120 srun --jobid="$1" --overlap -w "$2" -N "$(echo "$2" | tr , '\n' | wc -l)" --ntasks-per-node=1 "${@:3}"
}

if [ $MODE = fake ]; then
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
else # --site: the reference is a job on one node of two GPUs (the login node has none)
    if [ -n "${STEPS:-}" ]; then
        echo "INFO one-node: STEPS=$STEPS (given)"
    elif job=$(submit calibrate 60) && wait_job "$job" 600 && [ "$(state "$job" JobState)" = COMPLETED ]; then
        ms=$(ms_of "$W/runs/calibrate/metrics.jsonl")
        STEPS=$($PY -c "print(max(200, min(4000, int($RUN_S * 1000 / max($ms, 0.1)))))")
        echo "INFO one-node: a step of a two-node job (job $job on $(state "$job" NodeList)) takes $ms ms (median): STEPS=$STEPS (about $RUN_S s a run)"
    else
        joblogs "$W/runs/calibrate" > "$O/calibrate.log"
        fail one-node "the measuring two-node job ${job:-(not submitted: $(tail -1 "$O/submit-calibrate.err"))} failed: JobState=$(
            state "${job:-0}" JobState) $(grep -m2 -i error "$O/calibrate.log" | cut -c 1-160 | tr '\n' ' ')"
        STEPS=1000
    fi
    job=$(submit one_node "$STEPS" 1 2) || { fail one-node "ringscan submit: $(tail -3 "$O/submit-one_node.err")"; exit; }
    wait_job "$job" 600
    joblogs "$W/runs/one_node" > "$O/one_node.log"
    if [ "$(state "$job" JobState)" = COMPLETED ] && [ "$(wc -l < "$W/runs/one_node/metrics.jsonl")" = "$STEPS" ]; then
        pass one-node "job $job on $(state "$job" NodeList) (one node, two GPUs), cp 2, $STEPS steps, $(ms_of "$W/runs/one_node/metrics.jsonl") ms a step; NCCL: $(
            grep -m1 -o 'via [A-Za-z/]*' "$O/one_node.log")"
    else
        fail one-node "job $job JobState=$(state "$job" JobState) ExitCode=$(state "$job" ExitCode): $(
            grep -m2 -i error "$O/one_node.log" | cut -c 1-160 | tr '\n' ' ')"
    fi
fi

# submit: the uninterrupted job
B=$W/runs/whole
job=$(submit whole) || { fail submit "ringscan submit: $(tail -3 "$O/submit-whole.err")"; exit; }
if [ $MODE = fake ]; then
    wait_steps "$job" "$B" 3 0 && nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader \
        > "$O/whole-gpus.txt" 2>&1
elif [ "$DEVICE" != cpu ]; then # each node's GPU in use, its bus id after the node's name
    wait_steps "$job" "$B" 3 0 && in_job "$job" "$(hosts "$job")" bash -c 'nvidia-smi \
        --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader | sed "s/, /, $SLURMD_NODENAME:/"' \
        > "$O/whole-gpus.txt" 2>&1
fi
wait_job "$job" 600
info="JobState=$(state "$job" JobState) ExitCode=$(state "$job" ExitCode) NodeList=$(state "$job" NodeList)"
joblogs "$B" > "$O/whole-job.log"
if [ "$(state "$job" JobState)" = COMPLETED ] && two_nodes "$job" &&
    [ "$(wc -l < "$B/metrics.jsonl")" = "$STEPS" ]; then
    pass submit "job $job $info, $STEPS steps, $(ms_of "$B/metrics.jsonl") ms a step; GPUs in use: $(
        cut -d, -f2 "$O/whole-gpus.txt" 2> /dev/null | sort -u | tr '\n' ' ')"
else
    fail submit "job $job $info: $(grep -m3 -i 'error' "$O/whole-job.log" | cut -c 1-200 | tr '\n' ' ')"
fi
if [ "$DEVICE" = cpu ]; then echo "INFO transport: not checked on the cpu backend (no NCCL)"; fi
net=$(grep -c 'via NET/Socket' "$O/whole-job.log")
p2p=$(grep -c -E 'via (P2P|SHM)' "$O/whole-job.log")
if [ "$DEVICE" = cpu ]; then :
elif [ $MODE = site ]; then # whichever network transport the site has (NET/IB, NET/Socket, a plugin's)
    net=$(grep -c 'via NET/' "$O/whole-job.log")
    if [ "$net" -gt 0 ] && [ "$p2p" = 0 ]; then
        pass transport "NCCL between $(hosts "$job") over its network transport: $net channel lines $(
            grep -o 'via NET/[A-Za-z]*' "$O/whole-job.log" | sort | uniq -c | awk '{printf "%s x %s %s, ", $1, $2, $3}')none via P2P/SHM; $(
            grep -m1 -o 'NET/[A-Za-z]* : Using .*' "$O/whole-job.log" | cut -c 1-100)"
    else
        fail transport "NET/ lines $net, P2P/SHM lines $p2p; the job log's NCCL lines: $(grep -m3 'NCCL INFO.*via' "$O/whole-job.log")$(
            grep -q 'NCCL INFO' "$O/whole-job.log" || echo "none: NCCL_DEBUG=INFO is exported here; does SITE_ENV set another?")"
    fi
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

# kill: kill -9 of rank 1 (n2; --site: the job's second node); the watchdog ends rank 0 with 76; requeue; resume from the last checkpoint
if [ $LAUNCHER != srun ]; then
    fail kill "not run: it needs srun --mpi=pmix (see launch); under mpirun a killed rank ends the job at once"
    exit
fi
K=$W/runs/kill
job=$(submit kill) || { fail kill "ringscan submit: $(tail -3 "$O/submit-kill.err")"; exit; }
why="" victim=""
if wait_steps "$job" "$K" $((STEPS / 3)) 0 && [ -e "$K/ckpt/LATEST" ]; then
    if [ $MODE = fake ]; then
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
    else # --site: rank 1 is on another node: one step of the job on each node looks for it there and kills it
        cat > "$W/bin/kill_rank.sh" << 'EOF'
#!/bin/bash
# kill_rank.sh RUN_DIR RANK: run as a step inside the job (one task a node): kill -9 of that rank's process where it
# runs on this task's node, and prints "rank RANK pid PID node NODE host HOST: killed". The rank's process is the
# one of `ringscan train RUN_DIR/...` whose task is SLURM_PROCID=RANK on this node (its node's name too: fake
# nodes share a host), not a child of it (a rank's signal relay has its command line)
ranks=$(pgrep -f "ringscan train $1/config.submitted.yaml" | tr '\n' ' ')
for p in $ranks; do
    case " $ranks " in *" $(awk '{print $4}' /proc/$p/stat 2> /dev/null) "*) continue ;; esac
    env=$(tr '\0' '\n' < /proc/$p/environ 2> /dev/null)
    if echo "$env" | grep -qx "SLURM_PROCID=$2" && echo "$env" | grep -qx "SLURMD_NODENAME=$SLURMD_NODENAME"; then
        kill -9 "$p" && echo "rank $2 pid $p node $SLURMD_NODENAME host $(hostname): killed"
    fi
done
exit 0
EOF
        nodes=$(hosts "$job")
        if ! in_job "$job" "$nodes" bash "$W/bin/kill_rank.sh" "$K" 1 > "$O/kill-step.log" 2>&1; then
            why="the site refuses a step inside the running job (srun --jobid=$job --overlap -w $nodes): $(
                grep -v '^rank' "$O/kill-step.log" | head -2 | tr '\n' ' ')"
        elif read -r _ _ _ victim _ node _ < <(grep -m1 '^rank 1 pid .*: killed$' "$O/kill-step.log") && [ -n "$victim" ]; then
            kstep=$(wc -l < "$K/metrics.jsonl")  # rank 0 completes no step without rank 1
            echo "INFO kill: kill -9 of rank 1 (pid $victim, node $node, by srun --jobid=$job --overlap -w $nodes) after" \
                "step $kstep, the newest checkpoint then $(cat "$K/ckpt/LATEST" 2> /dev/null)"
        else why="rank 1's process not found on $nodes: $(head -3 "$O/kill-step.log" | tr '\n' ' ')"; fi
    fi
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
