#!/bin/bash
# stop.sh — stops the cluster that slurm/gpu-cluster/start.sh DIR started: cancels its jobs, then ends each
# daemon by the pid start.sh recorded in DIR/pids (only while that pid is still the named daemon: a stale
# pid never kills another process), the slurmd first and munged last; the job steps a stopped slurmd left
# behind (processes whose environment holds this cluster's SLURM_CONF) are killed too. DIR stays (logs).
#
#   slurm/gpu-cluster/stop.sh DIR
set -u
DIR=${1:?usage: stop.sh DIR}
[ -e "$DIR/pids" ] || { echo "stop.sh: $DIR holds no started cluster (no $DIR/pids)"; exit 0; }
DIR=$(cd "$DIR" && pwd)
export PATH=$PATH:/usr/sbin:/sbin
conf=$DIR/slurm.conf  # not exported: this script's own processes must not match the search below
ids=$(SLURM_CONF=$conf squeue -h -o %i 2> /dev/null)
if [ -n "$ids" ]; then
    SLURM_CONF=$conf scancel $ids
    for _ in $(seq 60); do [ -z "$(SLURM_CONF=$conf squeue -h -o %i 2> /dev/null)" ] && break; sleep 0.5; done
fi
is() { [ "$(cat /proc/$2/comm 2> /dev/null)" = "$1" ] && ! grep -q '^State:.*Z' /proc/$2/status 2> /dev/null; }
tac "$DIR/pids" | while read -r name pid; do
    is "$name" "$pid" || continue
    kill -TERM "$pid"
    for _ in $(seq 100); do is "$name" "$pid" || break; sleep 0.1; done
    is "$name" "$pid" && kill -KILL "$pid"
done
for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = $$ ] && continue
    if { tr '\0' '\n' < "$p/environ"; } 2> /dev/null | grep -qx "SLURM_CONF=$DIR/slurm.conf"; then
        echo "stop.sh: killing ${p#/proc/} ($(cat "$p/comm" 2> /dev/null)), left by the cluster"
        kill -KILL "${p#/proc/}" 2> /dev/null
    fi
done
mv "$DIR/pids" "$DIR/pids.stopped"
echo "stop.sh: stopped the cluster in $DIR"
