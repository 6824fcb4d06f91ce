"""test_watchdog.py — the communication watchdog (lib/comm/comm_watchdog.c) under mpirun on the cpu
backend: one rank made to stall on purpose (debug.stall_*, a test-only config section) must end
the run with exit 76 within the timeout plus a few seconds, and one report that names the
collective, the step and layer, and the stalled rank; a run where nothing hangs is unaffected
(bitwise the same losses as with the watchdog off, the thread there during the run, nothing
written).
"""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import RINGSCAN, ROOT, run

TIMEOUT = 3  # parallel.comm_timeout_s of the stall runs: tick 1 s, grace 2 s
BASE = ["--set", "data.seq_len=256", "--set", "data.micro_batch=1", "--set", "train.warmup_steps=2"]


@pytest.fixture(scope="module")
def data(recall_tok):
    return recall_tok


def train_args(run_dir, data, dp, cp, steps, *sets):
    return ["mpirun", "-np", str(dp * cp), "--oversubscribe", RINGSCAN, "train", "configs/tiny-cpu.yaml", *BASE,
            "--set", f"parallel.dp={dp}", "--set", f"parallel.cp={cp}", "--set", f"data.path={data}",
            "--set", f"run.out_dir={run_dir}", "--set", f"train.steps={steps}", *sets]


def stall(run_dir, data, dp, cp, rank, step, layer):
    t0 = time.time()
    r = run(train_args(run_dir, data, dp, cp, 6, "--set", f"parallel.comm_timeout_s={TIMEOUT}",
                       "--set", f"debug.stall_rank={rank}", "--set", f"debug.stall_step={step}",
                       "--set", f"debug.stall_layer={layer}"), timeout=300)
    return r, time.time() - t0


def report_of(run_dir):
    (attempt,) = list((run_dir / ".watchdog").iterdir())
    return (attempt / "report.txt").read_text()


def test_stalled_rank_is_named(tmp_path, data):
    """cp 2: rank 1 stops before its conv halo all-gather of layer 1 (GDN) in step 2; rank 0 waits there."""
    rd = tmp_path / "r"
    r, elapsed = stall(rd, data, 1, 2, 1, 2, 1)
    assert r.returncode == 76, r.stdout + r.stderr
    err = r.stderr
    head = re.search(r"rank 0 \(\S+\) has waited ([0-9.]+) s in iallgather over cp group 0 \(ranks 0-1\) at step 2, "
                     r"layer 1 \(conv halo forward\)", err)
    assert head, err
    assert "not arrived: rank 1 (1 of the 2 ranks of cp group 0)" in err, err
    busy = re.search(r"rank 1 \(\S+\): busy outside any wait at step 2, layer 1 \(conv halo forward\) for ([0-9.]+) s",
                     err)
    assert busy, err
    assert "arrived and waiting: rank 0 " in err, err
    assert err.count("has waited") == 1, err  # one report, from one rank
    # time to abort: the waiting rank's wait and the stalled rank's stall when the report was made
    # (records are refreshed every tick) lie between the timeout and timeout + tick + grace + slack
    waited, stalled = float(head.group(1)), float(busy.group(1))
    assert TIMEOUT <= waited <= TIMEOUT + 1 + 2 + 1.5, waited
    assert TIMEOUT - 1 <= stalled <= TIMEOUT + 1 + 2 + 1.5, stalled
    assert elapsed < 90, elapsed
    rep = report_of(rd)
    assert "not arrived: rank 1 " in rep and "conv halo forward" in rep
    # the run stopped inside step 2: step 1's metrics only
    assert [json.loads(l)["step"] for l in open(rd / "metrics.jsonl")] == [1]


def test_a_rank_stalled_before_mpi_init_ends_the_start_up(tmp_path, data):
    """Rank 1 stops before MPI_Init (debug.stall_step = 0): rank 0 waits in MPI_Init, where no watchdog runs yet;
    both start-up guards end their rank with 76 after parallel.startup_timeout_s, each saying where it is; nothing
    is written. Then a start-up longer than the guard's time, every rank healthy but the set-up after MPI_Init
    (initialising a 210M-parameter model takes longer than its 4 s), ends the same way through MPI_Abort, into log.txt too."""
    rd = tmp_path / "r"
    t0 = time.time()
    r = run(train_args(rd, data, 1, 2, 3, "--set", "parallel.startup_timeout_s=3", "--set", "debug.stall_rank=1",
                       "--set", "debug.stall_step=0"), timeout=120)
    assert r.returncode == 76, r.stdout + r.stderr
    assert time.time() - t0 < 3 + 30
    guard = r"error \[rank {}@\S+\] \S+: the start-up did not finish within parallel.startup_timeout_s = {} s: this rank is still {}; every rank ends with exit 76"
    assert re.search(guard.format(1, 3, r"stalled before MPI_Init \(debug.stall_step = 0\)"), r.stderr), r.stderr
    assert re.search(guard.format(0, 3, "in MPI_Init"), r.stderr), r.stderr
    assert not rd.exists()
    big = ["--set", "model.hidden_size=2048", "--set", "model.intermediate_size=8192"]
    r = run(train_args(rd, data, 1, 2, 3, "--set", "parallel.startup_timeout_s=4", *big), timeout=120)
    assert r.returncode == 76, r.stdout + r.stderr
    assert re.search(guard.format(r"\d", 4, "in the set-up after MPI_Init"), r.stderr), r.stderr
    assert "every rank ends with exit 76" in (rd / "log.txt").read_text()
    assert not (rd / "metrics.jsonl").exists() or not (rd / "metrics.jsonl").read_text()


def test_a_hang_before_the_first_checkpoint_does_not_block_the_restart(tmp_path, data):
    """The watchdog's records (.watchdog/, ringscan's own) stay in the run directory after exit 76; the same
    `train` then restarts the attempt (no checkpoint yet) instead of refusing a foreign entry, and keeps the
    records of the hang beside its own."""
    rd = tmp_path / "r"
    r, _ = stall(rd, data, 1, 2, 1, 2, 1)
    assert r.returncode == 76, r.stdout + r.stderr
    assert not (rd / "ckpt" / "LATEST").exists()
    hang = list((rd / ".watchdog").iterdir())
    assert len(hang) == 1 and (hang[0] / "report.txt").exists()
    r = run(train_args(rd, data, 1, 2, 3, "--set", f"parallel.comm_timeout_s={TIMEOUT * 20}"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "did not write" not in r.stderr
    assert [json.loads(l)["step"] for l in open(rd / "metrics.jsonl")] == [1, 2, 3]
    assert (hang[0] / "report.txt").exists()


def test_a_foreign_watchdog_folder_still_needs_the_run_marker(tmp_path, data):
    """.watchdog is a ringscan name, not a pass: in a directory without ringscan's run marker (.lock) it is
    refused like the other ringscan names, nothing written."""
    rd = tmp_path / "r"
    (rd / ".watchdog" / "x").mkdir(parents=True)
    r = run(train_args(rd, data, 1, 2, 2), timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "not the marker of a ringscan run" in r.stderr, r.stderr
    assert sorted(p.name for p in rd.iterdir()) == [".watchdog"]


def test_report_follows_the_chain_to_the_stalled_rank(tmp_path, data):
    """dp 2 x cp 2: rank 3 stops in the ring attention of layer 3 (step 2). Rank 2 waits for it in the
    ring; ranks 0-1 finish their backward and wait for everyone in the gradient all-reduce. The report
    is about the ring of cp group 1, whichever rank timed out first, and lists ranks 0-1 apart."""
    rd = tmp_path / "r"
    r, elapsed = stall(rd, data, 2, 2, 3, 2, 3)
    assert r.returncode == 76, r.stdout + r.stderr
    err = r.stderr
    assert re.search(r"rank 2 \(\S+\) has waited [0-9.]+ s in isendrecv over cp group 1 \(ranks 2-3\) at step 2, "
                     r"layer 3 \(ring attention forward\)", err), err
    assert "not arrived: rank 3 (1 of the 2 ranks of cp group 1)" in err, err
    assert re.search(r"rank 3 \(\S+\): busy outside any wait at step 2, layer 3 \(ring attention forward\)", err), err
    assert "ranks 0-1: waiting in iallreduce over world at step 2 (gradient all-reduce)" in err, err
    assert err.count("has waited") == 1, err
    assert elapsed < 120, elapsed


def watchdog_threads(run_dir):
    """Threads named rs-watchdog in the processes whose command line names run_dir."""
    n = 0
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if str(run_dir).encode() not in (p / "cmdline").read_bytes():
                continue
            n += sum((t / "comm").read_text().strip() == "rs-watchdog" for t in (p / "task").iterdir())
        except OSError:
            continue
    return n


def test_nothing_hangs_nothing_changes(tmp_path, data):
    """The same cp 2 run with the watchdog on (a timeout no healthy wait reaches on a loaded machine)
    and off: bitwise the same losses; with it on each rank runs the thread, with it off none does;
    neither writes a .watchdog directory."""
    seen = {}
    for name, timeout in (("on", 60), ("off", 0)):
        rd = tmp_path / name
        args = [str(a) for a in train_args(rd, data, 1, 2, 5, "--set", f"parallel.comm_timeout_s={timeout}")]
        p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        most = 0
        while p.poll() is None:
            most = max(most, watchdog_threads(rd))
            time.sleep(0.1)
        out, err = p.communicate()
        assert p.returncode == 0, out + err
        seen[name] = most
        assert not (rd / ".watchdog").exists()
    assert seen == {"on": 2, "off": 0}, seen
    losses = {n: [json.loads(l)["loss"] for l in open(tmp_path / n / "metrics.jsonl")] for n in ("on", "off")}
    assert len(losses["on"]) == 5 and losses["on"] == losses["off"], losses


@pytest.mark.parametrize("sets,words", [
    (["parallel.comm_timeout_s=0", "debug.stall_rank=1"], "nothing would end the stalled run"),
    (["parallel.startup_timeout_s=0", "debug.stall_rank=1", "debug.stall_step=0"],
     "debug.stall_rank = 1 (--set #3) with parallel.startup_timeout_s = 0.0 (--set #2): nothing would end the stalled run"),
    (["debug.stall_rank=2"], "debug.stall_rank = 2 (--set #2) is not a rank of the world of 2"),
    (["debug.stall_rank=1", "debug.stall_layer=4"], "is not a layer of the 4"),
    (["parallel.cp=1", "debug.stall_rank=0"], "in a world of one rank"),
])
def test_stall_needs_a_watchdog_and_a_real_place(tmp_path, sets, words):
    args = [RINGSCAN, "config", "check", "configs/tiny-cpu.yaml", "--set", "parallel.cp=2"]
    for s in sets:
        args += ["--set", s]
    r = run(args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in r.stderr, r.stderr
