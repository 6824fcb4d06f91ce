#!/bin/bash
# start.sh — a Slurm cluster of NODES nodes on this one host, each node owning one GPU as a generic resource
# (gres gpu:1), from slurm/test-cluster.conf.in (the cpu test cluster's slurm.conf; ../../../shared/
# slurm_local.md explains every setting): munged with its own socket and key, slurmctld, and one
# `slurmd -N nK` per node (own port, spool, log and PMIx directory), everything under DIR, nothing under
# /etc or /run. Waits until `sinfo` shows every node idle; on any failure it says which daemon or node and
# prints the logs' tails, and exits 1.
#
#   slurm/gpu-cluster/start.sh DIR [GPU_FILE...]       e.g.  start.sh /tmp/rs-cluster
#
# GPU_FILE: the device file of each node's GPU, one per node (default /dev/nvidia0 .. /dev/nvidia<NODES-1>);
# gres.conf names it (AutoDetect=off), and Slurm gives a job on node nK CUDA_VISIBLE_DEVICES = that file's
# number. Environment: NODES (default 2), CPUS per node (default 8), PORT (slurmctld's port, default 16817;
# the slurmd use PORT+1 ..), DAEMON_ENV (a file sourced before the slurmd start: install.sh's
# $PREFIX/daemon.env, which points Slurm's PMIx plugin at its own PMIx where the machine's is another
# major version). Writes DIR/slurm.conf, DIR/gres.conf, DIR/cgroup.conf (Slurm 24 on), DIR/munge/, DIR/log/, DIR/pids and DIR/env: `. DIR/env`
# gives a shell SLURM_CONF (sbatch, squeue, ringscan submit). slurm/gpu-cluster/stop.sh DIR stops it.
# Needs root (Slurm runs as root here), slurmctld, slurmd, munged and the clients on PATH or in /usr/sbin.
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${1:?usage: start.sh DIR [GPU_FILE...]}
shift
NODES=${NODES:-2}
CPUS=${CPUS:-8}
PORT=${PORT:-16817}
export PATH=$PATH:/usr/sbin:/sbin

fail() {
    echo "start.sh: FAILED: $*"
    for f in "$DIR"/log/*.log; do [ -e "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
    exit 1
}

GPUS=("$@")
if [ ${#GPUS[@]} -eq 0 ]; then
    for ((i = 0; i < NODES; i++)); do GPUS+=("/dev/nvidia$i"); done
fi
[ ${#GPUS[@]} -eq "$NODES" ] || fail "$NODES nodes need $NODES GPU files, got ${#GPUS[@]}: ${GPUS[*]}"
for g in "${GPUS[@]}"; do [ -e "$g" ] || fail "GPU file $g does not exist (nvidia-smi -L lists the GPUs)"; done
for b in munged slurmctld slurmd sbatch sinfo squeue scontrol srun; do
    command -v $b > /dev/null || fail "$b is not installed: slurm/gpu-cluster/install.sh installs the carried packages"
done
if [ -e "$DIR/pids" ]; then fail "$DIR already holds a cluster (stop it first: slurm/gpu-cluster/stop.sh $DIR)"; fi

mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd) || exit 1
chmod 755 "$DIR"  # munged wants every directory above its socket searchable by all
d=$DIR
while [ "$d" != / ]; do
    d=$(dirname "$d")
    [ "$(( $(stat -c '%a' "$d") & 1 ))" = 1 ] || fail "munged needs every directory above its socket searchable by all: chmod o+x $d"
done
mkdir -p "$DIR"/munge "$DIR"/state "$DIR"/log || fail "cannot create $DIR"
chmod 755 "$DIR/munge"  # munged wants its socket directory searchable by all; the key itself is 0400
NODE_NAMES=()
for ((i = 1; i <= NODES; i++)); do
    NODE_NAMES+=("n$i")
    mkdir -p "$DIR/spool/n$i" "$DIR/tmpfs/n$i"
done

# --- slurm.conf and gres.conf: the cpu test cluster's, with a GPU per node --------------------------------
{
    echo "# the nodes (slurm/gpu-cluster/start.sh): two slurmd on this host, each with one GPU (gres.conf)"
    echo "GresTypes=gpu"
    echo "TaskProlog=$DIR/task-prolog"
    for ((i = 1; i <= NODES; i++)); do
        echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT + i)) CPUs=$CPUS RealMemory=8000 Gres=gpu:1"
    done
} > "$DIR/nodes.conf"
python3 - "$HERE/../test-cluster.conf.in" "$DIR" "$PORT" "$DIR/munge/munge.socket" "$DIR/nodes.conf" \
    > "$DIR/slurm.conf" <<'EOF' || fail "cannot write $DIR/slurm.conf"
import re, sys
tpl, d, port, sock, nodes = sys.argv[1:]
conf = open(tpl).read()
for k, v in {"@NODES@": open(nodes).read().rstrip("\n"), "@DIR@": d, "@CTLD_PORT@": port, "@MUNGE_SOCKET@": sock}.items():
    conf = conf.replace(k, v)
left = re.findall(r"@[A-Z_]+@", conf)
assert not left, f"placeholders of test-cluster.conf.in left: {left}"
sys.stdout.write(conf)
EOF
rm -f "$DIR/nodes.conf"
{
    echo "# gres.conf of slurm/gpu-cluster/start.sh: one GPU per node, named by its device file"
    echo "AutoDetect=off"
    for ((i = 1; i <= NODES; i++)); do echo "NodeName=n$i Name=gpu File=${GPUS[i - 1]}"; done
} > "$DIR/gres.conf"
# cgroup.conf: none below Slurm 24 (the cpu cluster's way: proctrack/linuxproc, task/none). From 24.05 slurmd
# sets up a cgroup for its slurmstepd through systemd even with those plugins, and dies where no systemd
# answers on D-Bus ("systemd scope for slurmstepd could not be set": the lent GPU machine, containers);
# CgroupPlugin=disabled (24.05 on) tells it to leave cgroups alone
major=$(slurmd -V 2> /dev/null | grep -o '[0-9][0-9]*\.[0-9]' | head -1 | cut -d. -f1)
[ -n "$major" ] || fail "slurmd -V names no version: $(slurmd -V 2>&1 | head -1)"
if [ "$major" -ge 24 ]; then
    printf '# cgroup.conf of slurm/gpu-cluster/start.sh (Slurm %s): no cgroups, as the cpu test cluster\nCgroupPlugin=disabled\n' \
        "$major" > "$DIR/cgroup.conf"
fi
# Slurm numbers a node's GPUs from 0 in the order of its gres.conf lines, whatever the device file
# (CUDA_VISIBLE_DEVICES of a GPU is that index, to match CUDA's order on a real node), so on nodes that share
# one host every node's GPU would be "0". The task prolog (every task, the batch script's too) gives each
# task its node's own GPU: CUDA_VISIBLE_DEVICES = the number of that node's device file.
{
    echo '#!/bin/sh'
    echo "# TaskProlog of the cluster in $DIR (slurm/gpu-cluster/start.sh): each node's own GPU"
    echo '[ -n "${CUDA_VISIBLE_DEVICES:-}" ] || exit 0  # no GPU allocated to this job'
    echo 'case "$SLURMD_NODENAME" in'
    for ((i = 1; i <= NODES; i++)); do
        num=$(basename "${GPUS[i - 1]}" | tr -dc 0-9)
        [ -n "$num" ] || fail "GPU file ${GPUS[i - 1]} has no number in its name (like /dev/nvidia1)"
        echo "    n$i) echo export CUDA_VISIBLE_DEVICES=$num ;;"
    done
    echo 'esac'
} > "$DIR/task-prolog" && chmod 755 "$DIR/task-prolog"
echo "export SLURM_CONF=$DIR/slurm.conf" > "$DIR/env"
export SLURM_CONF=$DIR/slurm.conf

# --- daemons: each forks into the background and writes a pid file ----------------------------------------
: > "$DIR/pids"
started() { # NAME PIDFILE
    local k
    for k in $(seq 100); do
        if [ -s "$2" ]; then echo "$1 $(head -1 "$2")" >> "$DIR/pids"; return 0; fi
        sleep 0.05
    done
    fail "$1 wrote no pid file $2"
}
head -c 1024 /dev/urandom > "$DIR/munge/munge.key" && chmod 400 "$DIR/munge/munge.key"
(cd "$DIR" && munged --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --log-file="$DIR/log/munged.log" --pid-file="$DIR/munge/munged.pid" --seed-file="$DIR/munge/munged.seed") ||
    fail "munged did not start"
started munged "$DIR/munge/munged.pid"
(cd "$DIR" && slurmctld) || fail "slurmctld did not start"
started slurmctld "$DIR/slurmctld.pid"
for n in "${NODE_NAMES[@]}"; do
    (
        cd "$DIR" || exit 1
        if [ -n "${DAEMON_ENV:-}" ]; then . "$DAEMON_ENV" || exit 1; fi
        slurmd -N "$n"
    ) || fail "slurmd -N $n did not start"
    started slurmd "$DIR/slurmd-$n.pid"
done

want=$(printf '%s idle\n' "${NODE_NAMES[@]}")
for k in $(seq 120); do
    got=$(sinfo -h -N -o '%N %T' 2> /dev/null | sort)
    [ "$got" = "$want" ] && break
    sleep 0.5
done
[ "$got" = "$want" ] || fail "the nodes never became idle; sinfo: $(sinfo -N -o '%N %T %G %E' 2>&1 | tr '\n' ';')"
sinfo -N -o '%N %T %c %G'
echo "start.sh: cluster up in $DIR (. $DIR/env gives SLURM_CONF): nodes ${NODE_NAMES[*]}, GPU files ${GPUS[*]}"
