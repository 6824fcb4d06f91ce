"""test_train.py — the trainer end to end on the cpu backend, with real
processes, real files and real signals: learning, metrics, exact resume,
kill -9 during checkpoints, corrupt checkpoints, refusals, bad data, SIGTERM.

Runs use configs/tiny-cpu.yaml shrunk by --set (256-token samples) so each
step takes a fraction of a second; the synthetic recall data is made once.
"""
import fcntl
import json
import math
import os
import random
import shutil
import signal
import subprocess
import time

import pytest

from conftest import RINGSCAN, ROOT, run

SMALL = ["--set", "data.seq_len=256", "--set", "data.micro_batch=1", "--set", "parallel.dp=1",
         "--set", "parallel.cp=1", "--set", "train.warmup_steps=2"]


@pytest.fixture(scope="module")
def data(recall_tok):
    return recall_tok  # conftest.py: 300k tokens of the recall task, seed 7, made once per session


def train(run_dir, data, *sets, steps=6, expect=0, mpirun=0):
    args = [RINGSCAN, "train", "configs/tiny-cpu.yaml", *SMALL, "--set", f"data.path={data}",
            "--set", f"run.out_dir={run_dir}", "--set", f"train.steps={steps}", *sets]
    if mpirun:
        args = ["mpirun", "-np", str(mpirun), "--oversubscribe", *args]
    r = run(args, timeout=900)
    assert r.returncode == expect, r.stdout + r.stderr
    return r


def metrics(run_dir):
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def losses(run_dir):
    return [m["loss"] for m in metrics(run_dir)]


def test_loss_falls(tmp_path, data):
    train(tmp_path / "r", data, "--set", "data.micro_batch=2", steps=30)
    ls = losses(tmp_path / "r")
    assert len(ls) == 30
    assert ls[0] > 5.0, ls[0]                      # ~ln(256) at init
    assert sum(ls[-5:]) / 5 < ls[0] - 1.5, ls      # clearly learning


def test_metrics_and_schedule(tmp_path, data):
    for sched in ("cosine", "wsd", "constant"):
        rd = tmp_path / sched
        train(rd, data, "--set", f"train.schedule={sched}", "--set", "train.decay_steps=3", steps=8)
        ms = metrics(rd)
        lr, min_lr, warm, steps = 3e-3, 3e-4, 2, 8
        for m in ms:
            for key in ("step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s"):
                assert key in m, key
            s = m["step"]
            assert m["tokens"] == s * 256
            if s <= warm:
                want = lr * s / warm
            elif sched == "constant":
                want = lr
            elif sched == "wsd":
                want = lr if s <= steps - 3 else lr + (min_lr - lr) * (s - (steps - 3)) / 3
            else:
                want = min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * (s - warm) / (steps - warm)))
            assert abs(m["lr"] - want) < 1e-9, (sched, s, m["lr"], want)
        assert [m["step"] for m in ms] == list(range(1, steps + 1))
    log = (tmp_path / "cosine" / "log.txt").read_text()
    assert "step 8/8 | loss" in log and "tok/s" in log and "ETA" in log and "gnorm" in log


def test_exact_resume(tmp_path, data):
    """20 steps straight vs 10 steps + `ringscan resume` to 20: bitwise-equal losses. The second run keeps its
    last 2 of 4 layers whole (checkpoint.keep_layers 2: the same bits as remat, half the block recomputes), and the
    resumed half still does."""
    train(tmp_path / "a", data, "--set", "checkpoint.every=5", steps=20)
    train(tmp_path / "b", data, "--set", "checkpoint.every=5", "--set", "run.stop_after_step=10",
          "--set", "checkpoint.keep_layers=2", steps=20)
    assert len(losses(tmp_path / "b")) == 10
    r = run([RINGSCAN, "resume", tmp_path / "b"])
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout
    assert losses(tmp_path / "a") == losses(tmp_path / "b")  # exact float equality
    ra = [m["counters"]["block_recomputes"] for m in metrics(tmp_path / "a")]
    rb = [m["counters"]["block_recomputes"] for m in metrics(tmp_path / "b")]
    assert len(rb) == 20 and ra[0] > 0 and all(a == ra[0] for a in ra) and all(2 * b == ra[0] for b in rb), (ra, rb)


def test_grad_accumulation_and_dp_match(tmp_path, data):
    """The same global batch as 1x2 micro-batches, 2 accumulated micro-batches, or 2 dp ranks."""
    train(tmp_path / "mb", data, "--set", "data.micro_batch=2", steps=4)
    train(tmp_path / "acc", data, "--set", "train.grad_accum=2", steps=4)
    train(tmp_path / "dp", data, "--set", "parallel.dp=2", steps=4, mpirun=2)
    ref = losses(tmp_path / "mb")
    for other in ("acc", "dp"):
        for a, b in zip(ref, losses(tmp_path / other)):
            assert abs(a - b) / abs(a) < 1e-5, (other, ref, losses(tmp_path / other))


def test_kill9_during_checkpoints_never_breaks_latest(tmp_path, data):
    """Checkpoint every step; kill -9 at random moments; after every kill LATEST loads, and resuming
    after all the kills ends with exactly the losses of an uninterrupted run."""
    steps = 14
    train(tmp_path / "straight", data, "--set", "checkpoint.every=1", steps=steps)
    rd = tmp_path / "killed"
    rng = random.Random(11)
    env = dict(os.environ)
    started = False
    for attempt in range(40):
        if started:
            cmd = [RINGSCAN, "resume", rd]
        else:
            cmd = [RINGSCAN, "train", "configs/tiny-cpu.yaml", *SMALL, "--set", f"data.path={data}",
                   "--set", f"run.out_dir={rd}", "--set", f"train.steps={steps}", "--set", "checkpoint.every=1"]
        m = rd / "metrics.jsonl"
        lines0 = len(m.read_text().splitlines()) if m.exists() else 0
        p = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        # kill once this attempt has trained a step (so a loaded machine's slow start-up does not
        # make every kill land before the first checkpoint), at a random moment of what follows:
        # inside a checkpoint, between two, or inside a step
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            if m.exists() and len(m.read_text().splitlines()) > lines0:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.6))
        p.send_signal(signal.SIGKILL)
        p.wait()
        if (rd / "ckpt" / "LATEST").exists():
            started = True
            r = run([RINGSCAN, "resume", rd, "--dry-run"])
            if "nothing left to run" in r.stderr:
                break
            assert r.returncode == 0, r.stdout + r.stderr
            assert "would continue from" in r.stdout
    assert started
    r = run([RINGSCAN, "resume", rd])
    assert r.returncode in (0, 2), r.stderr  # 2: the kills already reached the last step
    assert losses(rd) == losses(tmp_path / "straight")


def test_corrupt_newest_checkpoint_falls_back(tmp_path, data):
    rd = tmp_path / "r"
    train(rd, data, "--set", "checkpoint.every=2", "--set", "checkpoint.keep=3", steps=6)
    newest = rd / "ckpt" / "step_00000006" / "model.safetensors"
    b = bytearray(newest.read_bytes())
    b[len(b) // 2] ^= 0x40
    newest.write_bytes(bytes(b))
    r = run([RINGSCAN, "resume", rd, "--dry-run", "--set", "train.steps=8"])
    assert r.returncode == 0, r.stderr
    assert "step_00000006" in r.stderr and "warning" in r.stderr
    assert "would continue from" in r.stdout and "step_00000004" in r.stdout
    # the warning reaches the run's log too (it is printed before log.txt opens, and kept until then)
    r = run([RINGSCAN, "resume", rd, "--set", "train.steps=5"])
    assert r.returncode == 0, r.stderr
    warned = [line for line in (rd / "log.txt").read_text().splitlines() if line.startswith("ringscan: warning")]
    assert warned and "step_00000006" in warned[0] and "failed verification" in warned[0], warned


def test_resume_refuses_changed_model_with_diff(tmp_path, data):
    rd = tmp_path / "r"
    train(rd, data, steps=3, expect=0)
    r = run([RINGSCAN, "resume", rd, "--set", "train.steps=5", "--set", "model.intermediate_size=256",
             "--set", "data.seq_len=384"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "resume refuses" in r.stderr
    assert "model.intermediate_size: 512 -> 256" in r.stderr
    assert "data.seq_len: 256 -> 384" in r.stderr
    # keys that do not define the model or data may change
    r = run([RINGSCAN, "resume", rd, "--set", "train.steps=4", "--set", "train.lr=1e-3"])
    assert r.returncode == 0, r.stderr
    assert [m["step"] for m in metrics(rd)] == [1, 2, 3, 4]


def test_train_refuses_existing_run(tmp_path, data):
    rd = tmp_path / "r"
    train(rd, data, steps=2)
    before = (rd / "metrics.jsonl").read_bytes()
    r = train(rd, data, steps=2, expect=2)
    assert "already holds a run" in r.stderr and "ringscan resume" in r.stderr
    assert (rd / "metrics.jsonl").read_bytes() == before


def train_cmd(run_dir, data, *sets, steps=6):
    return [str(c) for c in [RINGSCAN, "train", "configs/tiny-cpu.yaml", *SMALL, "--set", f"data.path={data}",
                             "--set", f"run.out_dir={run_dir}", "--set", f"train.steps={steps}", *sets]]


def start_and_wait_for_steps(cmd, run_dir, n):
    """Starts `cmd` and returns its Popen once metrics.jsonl holds n steps."""
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    m = run_dir / "metrics.jsonl"
    while time.time() < deadline and p.poll() is None:
        if m.exists() and len(m.read_text().splitlines()) >= n:
            return p
        time.sleep(0.05)
    p.kill()
    raise AssertionError(f"{cmd} did not reach step {n}: " + "".join(p.communicate()))


def tree(d):
    """{relative path: bytes (None for a directory)} of everything under d."""
    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), d)] = None
        for name in files:
            out[os.path.relpath(os.path.join(root, name), d)] = open(os.path.join(root, name), "rb").read()
    return out


def test_one_trainer_per_run_directory(tmp_path, data):
    """While a run trains, a second `train` (one process, or two ranks under mpirun), a `resume` and a
    `resume --dry-run` into its directory are refused naming the holder (issue 17 item 1: before the run
    lock, the second train exited 0 and replaced the first run's metrics and resolved config)."""
    rd = tmp_path / "r"
    first = start_and_wait_for_steps(train_cmd(rd, data, steps=400), rd, 2)
    resolved = (rd / "config.resolved.yaml").read_bytes()
    try:
        for how in ("train", "mpirun", "resume", "dry-run"):
            if how == "train":
                r = train(rd, data, "--set", "train.lr=0.001", steps=5, expect=2)
            elif how == "mpirun":
                r = train(rd, data, "--set", "train.lr=0.001", "--set", "parallel.dp=2", steps=5, expect=2,
                          mpirun=2)
            else:
                r = run([RINGSCAN, "resume", rd] + (["--dry-run"] if how == "dry-run" else []))
                assert r.returncode == 2, how + r.stdout + r.stderr
            assert f"run directory {rd} is in use" in r.stderr, (how, r.stderr)
            assert f"pid {first.pid} on host {os.uname().nodename}" in r.stderr, (how, r.stderr)
            assert first.poll() is None, "the first run ended before the test finished: raise its steps"
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=120)
    assert first.returncode == 75, out + err
    assert (rd / "config.resolved.yaml").read_bytes() == resolved
    ms = metrics(rd)
    assert [m["step"] for m in ms] == list(range(1, len(ms) + 1)) and len(ms) >= 2
    assert all(abs(m["lr"] - 0.001) > 1e-12 for m in ms)
    # the lock went with the process: resume now continues the first run
    r = run([RINGSCAN, "resume", rd, "--set", f"train.steps={len(ms) + 1}"])
    assert r.returncode == 0, r.stderr
    assert [m["step"] for m in metrics(rd)] == list(range(1, len(ms) + 2))


def test_train_restarts_an_attempt_without_checkpoint(tmp_path, data):
    """A run killed before its first checkpoint left its marker, metrics and log lines but nothing to
    resume: `train` starts it over (what a requeued Slurm job does) instead of refusing forever."""
    rd = tmp_path / "r"
    p = start_and_wait_for_steps(train_cmd(rd, data, steps=400), rd, 3)
    p.kill()
    p.communicate()
    assert not (rd / "ckpt").exists() and len(metrics(rd)) >= 3
    old = metrics(rd)
    r = train(rd, data, "--set", "train.lr=0.002", steps=2)
    assert "stopped before its first checkpoint" in r.stdout
    ms = metrics(rd)
    assert [m["step"] for m in ms] == [1, 2] and ms[1]["loss"] != old[1]["loss"]
    assert "lr: 0.002" in (rd / "config.resolved.yaml").read_text()


def test_train_refuses_what_it_did_not_write(tmp_path, data):
    """Issue 17 item 3: an out_dir holding a foreign file, or ringscan's file names without a ringscan
    run's marker, is refused with nothing written; `/` and an empty out_dir are refused by validation;
    what `ringscan submit` wrote is accepted."""
    cases = {
        "notes": {"notes.txt": b"mine\n"},
        "metrics": {"metrics.jsonl": b'{"step": 1, "loss": 9.0}\n'},
        "resolved": {"config.resolved.yaml": b"train: {lr: 1}\n"},
        "ckpt-foreign": {".lock": b"ringscan run lock of x\n", "ckpt/weights.bin": b"x"},
        "lock-foreign": {".lock": b"pid 12\n"},
    }
    for name, files in cases.items():
        rd = tmp_path / name
        for rel, content in files.items():
            (rd / rel).parent.mkdir(parents=True, exist_ok=True)
            (rd / rel).write_bytes(content)
        before = tree(rd)
        r = train(rd, data, steps=2, expect=2)
        assert f"run.out_dir {rd} holds" in r.stderr, (name, r.stderr)
        if name in ("notes", "ckpt-foreign", "lock-foreign"):
            assert "that ringscan did not write" in r.stderr and list(files)[-1] in r.stderr, r.stderr
        else:
            assert "not the marker of a ringscan run" in r.stderr, r.stderr
        assert tree(rd) == before, name
    root_before = sorted(os.listdir("/"))
    for bad, words in (("/", "file system root"), ("//.", "file system root"), ("", "run.out_dir is empty")):
        r = train(bad, data, steps=2, expect=2)
        assert words in r.stderr and "nothing was run or written" in r.stderr, r.stderr
    assert sorted(os.listdir("/")) == root_before
    # a directory `ringscan submit` prepared (job script, submitted config, Slurm logs) trains
    rd = tmp_path / "submitted"
    (rd / "logs").mkdir(parents=True)
    for rel in ("job.sbatch", "config.submitted.yaml", "logs/slurm-7.out"):
        (rd / rel).write_text("x\n")
    train(rd, data, steps=2)
    assert len(metrics(rd)) == 2 and (rd / "job.sbatch").read_text() == "x\n"


def test_failed_checkpoint_is_an_error_in_the_log(tmp_path, data):
    """Issue 17 item 4: a checkpoint save that fails stops the run with an error naming the cause and a
    non-zero exit, and log.txt ends with that error (it used to end on a step line, the message being a
    warning on stderr only). Causes: another process holding ckpt/.lock, and a full disk (a 12 MiB tmpfs,
    where this machine lets root mount one)."""
    rd = tmp_path / "r"
    train(rd, data, steps=2)
    with open(rd / "ckpt" / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = run([RINGSCAN, "resume", rd, "--set", "train.steps=4", "--set", "checkpoint.every=1"])
    assert r.returncode == 2, r.stdout + r.stderr
    err = [line for line in r.stderr.splitlines() if line.startswith("ringscan: ")]
    assert err[-1].startswith("ringscan: error") and "checkpoint of step 3 failed" in err[-1], r.stderr
    assert "another process is saving checkpoints" in err[-1]
    assert "step 2, is intact" in r.stderr
    log = [line for line in (rd / "log.txt").read_text().splitlines() if not line.startswith("  hint:")]
    assert log[-1] == err[-1], log[-3:]
    assert "step 3/4 | loss" in log[-2]
    assert (rd / "ckpt" / "LATEST").read_text() == "step_00000002\n"

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)], capture_output=True)
    if m.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root?): the full-disk case is not run")
    try:
        rd = mnt / "r"
        r = train(rd, data, steps=2, expect=1)
        err = [line for line in r.stderr.splitlines() if line.startswith("ringscan: ")]
        assert err[-1].startswith("ringscan: error") and "checkpoint of step 2 failed" in err[-1], r.stderr
        assert "No space left on device" in err[-1] and "no checkpoint was written before" in r.stderr
        log = (rd / "log.txt").read_text().splitlines()
        assert [line for line in log if not line.startswith("  hint:")][-1] == err[-1]
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_resume_refuses_options_it_cannot_honour(tmp_path, data):
    """Issue 17 item 5: run.out_dir (was ignored and recorded), a run.stop_after_step at or before the
    checkpoint (was ignored) and a changed global batch (was taken silently) are refused with nothing
    written; --allow-batch-change takes the new batch and says so; a copied run directory records where
    it is."""
    rd = tmp_path / "r"
    train(rd, data, steps=4)
    before = tree(rd)
    before.pop(".lock", None)  # the lock file names its last holder, a refused resume included
    refusals = [
        (["--set", f"run.out_dir={tmp_path / 'elsewhere'}"], "resume refuses run.out_dir"),
        (["--set", "run.stop_after_step=3"], "resume refuses run.stop_after_step = 3"),
        (["--set", "run.stop_after_step=4"], "checkpoint " + str(rd / "ckpt" / "step_00000004") + " is at step 4"),
        (["--set", "train.grad_accum=2"], "1 x 1 x 1 = 1 samples per step in checkpoint"),
        (["--set", "data.micro_batch=2"], "= 2 now"),
    ]
    for sets, words in refusals:
        r = run([RINGSCAN, "resume", rd, "--set", "train.steps=6", *sets])
        assert r.returncode == 2, sets + [r.stdout, r.stderr]
        assert words in r.stderr, (sets, r.stderr)
    after = tree(rd)
    lock = after.pop(".lock", b"")
    assert after == before and not (tmp_path / "elsewhere").exists()
    assert lock.startswith(b"ringscan run lock of ")

    r = run([RINGSCAN, "resume", rd, "--set", "train.steps=5", "--set", "train.grad_accum=2",
             "--allow-batch-change"])
    assert r.returncode == 0, r.stderr
    assert "global batch: 1 samples per step up to step 4, 2 from step 5 on" in r.stdout
    ms = metrics(rd)
    assert [m["step"] for m in ms] == [1, 2, 3, 4, 5] and ms[-1]["tokens"] == 6 * 256

    copy = tmp_path / "copy"
    shutil.copytree(rd, copy)
    r = run([RINGSCAN, "resume", str(copy) + "/", "--set", "train.steps=6", "--set", f"run.out_dir={copy}"])
    assert r.returncode == 0, r.stderr
    assert f'out_dir: "{copy}"' in (copy / "config.resolved.yaml").read_text()
    assert len(metrics(rd)) == 5 and len(metrics(copy)) == 6


def test_resume_on_another_number_of_ranks(tmp_path, data):
    """dp 2 stopped at step 4, resumed as one process with grad_accum 2 (the same 2 samples per step):
    the losses of the uninterrupted dp 2 run. The first resumed step is bitwise equal (the same weights
    and samples, each sample's forward computed alone and the two losses summed in the same order);
    later steps within 1e-6 relative (measured <= 1e-8): the all-reduce adds the two ranks' gradients
    while accumulation adds the second micro-batch into the buffer holding the first, which rounds
    differently in fp32. Reading other samples or losing the AdamW state moves the loss by > 1e-3."""
    train(tmp_path / "straight", data, "--set", "parallel.dp=2", steps=8, mpirun=2)
    rd = tmp_path / "r"
    train(rd, data, "--set", "parallel.dp=2", "--set", "run.stop_after_step=4", steps=8, mpirun=2)
    r = run([RINGSCAN, "resume", rd, "--set", "parallel.dp=1", "--set", "train.grad_accum=2"])
    assert r.returncode == 0, r.stderr
    assert "world 1 = dp 1 x cp 1" in r.stdout
    ref, got = metrics(tmp_path / "straight"), metrics(rd)
    assert [m["step"] for m in got] == list(range(1, 9))
    assert [m["tokens"] for m in got] == [m["tokens"] for m in ref]
    assert [m["loss"] for m in got[:5]] == [m["loss"] for m in ref[:5]]
    for a, b in zip(ref[5:], got[5:]):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]), (a, b)


def test_bad_data_writes_nothing(tmp_path, data):
    bad = tmp_path / "bad.tok"
    bad.write_bytes(b"NOTATOKENFILE" + bytes(100))
    for path, words in ((tmp_path / "missing.tok", "missing.tok"), (bad, "bad.tok")):
        rd = tmp_path / "run-must-not-exist"
        r = train(rd, path, steps=2, expect=2)
        assert words in r.stderr, r.stderr
        assert not rd.exists()


def test_fifo_as_data_is_refused_not_waited_on(tmp_path):
    """open() of a FIFO as data.path blocked forever: it is refused from stat, and nothing is written."""
    fifo = tmp_path / "pipe.tok"
    os.mkfifo(fifo)
    rd = tmp_path / "run-must-not-exist"
    r = train(rd, fifo, steps=2, expect=2)
    assert f"data file {fifo} is not a regular file: it is a FIFO" in r.stderr, r.stderr
    assert not rd.exists()


def test_run_directory_blocked_by_a_file(tmp_path, data):
    """run.out_dir that is a file, or lies under one: bad input (exit 2, issue 35 item 10), refused with the path
    named before anything starts (fsio_mkdirs used to take an existing file for the directory), and the file
    left as it was."""
    (tmp_path / "f").write_text("a file\n")
    r = train(tmp_path / "f", data, steps=2, expect=2)
    assert f"run.out_dir {tmp_path}/f exists and is not a directory" in r.stderr, r.stderr
    r = train(tmp_path / "f" / "r", data, steps=2, expect=2)
    assert f"{tmp_path}/f is not a directory, so {tmp_path}/f/r cannot be created under it" in r.stderr, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["f"] and (tmp_path / "f").read_text() == "a file\n"


def test_token_ids_beyond_vocab(tmp_path, data):
    rd = tmp_path / "r"
    r = train(rd, data, "--set", "model.vocab_size=64", steps=2, expect=2)
    assert "recall.tok" in r.stderr and "64" in r.stderr


def test_sigterm_checkpoints_exits_75_and_resumes_exactly(tmp_path, data):
    steps = 12
    train(tmp_path / "straight", data, steps=steps)
    rd = tmp_path / "r"
    cmd = [RINGSCAN, "train", "configs/tiny-cpu.yaml", *SMALL, "--set", f"data.path={data}",
           "--set", f"run.out_dir={rd}", "--set", f"train.steps={steps}"]
    p = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        if (rd / "metrics.jsonl").exists() and len(open(rd / "metrics.jsonl").readlines()) >= 3:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 75, out + err
    assert "stopped by signal" in out
    done = len(losses(rd))
    assert 3 <= done < steps
    assert (rd / "ckpt" / f"step_{done:08d}").is_dir()
    r = run([RINGSCAN, "resume", rd])
    assert r.returncode == 0, r.stderr
    assert losses(rd) == losses(tmp_path / "straight")


def test_cuda_ranks_without_a_gpu_are_one_clear_error(tmp_path, data):
    # under mpirun with cp 2 on cuda and no GPU (CI): rank 0 alone says so (every rank knows: the GPU
    # counts are gathered first), every rank exits 2, nothing is written
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is visible here: device.kind cuda trains")
    r = train(tmp_path / "r", data, "--set", "device.kind=cuda", "--set", "parallel.cp=2", steps=2, expect=2,
              mpirun=2)
    assert r.stderr.count("device.kind = cuda") == 1, r.stderr
    assert "rank 0" in r.stderr and ("sees no GPU" in r.stderr or "built without the cuda backend" in r.stderr)
    assert not (tmp_path / "r").exists()


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path, data):
    # on a machine with no usable GPU (CI), device.kind: cuda stops with a usage error naming the
    # key, before anything is written (a build without nvcc says so the same way)
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is visible here: device.kind cuda trains")
    r = train(tmp_path / "r", data, "--set", "device.kind=cuda", steps=2, expect=2)
    assert "device.kind = cuda" in r.stderr
    assert not (tmp_path / "r").exists()


# ---- data that changes underfoot (issue 17, item 2) -----------------------------------------------

def start_train(rd, data, *sets, steps=400):
    cmd = [RINGSCAN, "train", "configs/tiny-cpu.yaml", *SMALL, "--set", f"data.path={data}",
           "--set", f"run.out_dir={rd}", "--set", f"train.steps={steps}", *sets]
    # SIGHUP at its default in the child whatever the caller runs under (nohup ignores it, and ringscan keeps an
    # ignored SIGHUP ignored: test_sighup_ignored_by_nohup_stays_ignored)
    return subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))


def wait_for_steps(p, rd, n, limit=120):
    deadline = time.time() + limit
    while time.time() < deadline and p.poll() is None:
        if (rd / "metrics.jsonl").exists() and len(open(rd / "metrics.jsonl").readlines()) >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"{rd}: fewer than {n} steps")


@pytest.mark.parametrize("change", ["truncate", "overwrite"])
def test_data_changed_during_a_run_stops_it_clearly(tmp_path, data, change):
    """Truncating the data file during a run used to kill it with SIGBUS (a shared mapping) and an
    overwrite in place gave garbage token ranges: now the next read names the file and what changed,
    the run exits 2, and its last checkpoint is intact (resume on the restored file continues)."""
    mine = tmp_path / "d.tok"
    shutil.copy(data, mine)
    rd = tmp_path / "r"
    p = start_train(rd, mine, "--set", "checkpoint.every=2")
    wait_for_steps(p, rd, 5)
    size = mine.stat().st_size
    if change == "truncate":
        os.truncate(mine, size // 2)
    else:
        with open(mine, "r+b") as f:  # same size, other tokens (still valid ids: 0..255)
            f.seek(size // 2)
            f.write(bytes(random.Random(5).randrange(0, 256) if i % 2 == 0 else 0 for i in range(1 << 16)))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, out + err
    assert f"data file {mine} changed while the run was reading it" in err, err
    assert ("truncated" if change == "truncate" else "overwritten") in err
    assert "last checkpoint is intact" in err
    assert "Bus error" not in err and "token range" not in err
    done = len(losses(rd))
    assert 5 <= done < 400
    shutil.copy(data, mine)  # the original content back (another mtime: a note, not a refusal)
    r = run([RINGSCAN, "resume", rd, "--dry-run"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "would continue from" in r.stdout and "another mtime" in r.stdout


def test_resume_refuses_replaced_data_unless_accepted(tmp_path, ringscan, data):
    """A different file at the same path (other seed, other size) no longer resumes silently: the
    checkpoint's fingerprint differs. --set data.accept_changed=true on the resume's command line
    accepts it; the same value read back from config.resolved.yaml does not accept the next change."""
    mine = tmp_path / "d.tok"
    shutil.copy(data, mine)
    rd = tmp_path / "r"
    train(rd, mine, steps=3)
    state = json.loads((rd / "ckpt" / "step_00000003" / "manifest.json").read_text())["state"]
    fp = state["data"]
    assert fp["path"] == str(mine) and fp["bytes"] == mine.stat().st_size and len(fp["fingerprint"]) == 16
    other = tmp_path / "other.tok"
    r = run([ringscan, "data", "synth", other, "--tokens", "290000", "--seed", "8"])
    assert r.returncode == 0, r.stderr
    os.replace(other, mine)
    r = run([RINGSCAN, "resume", rd, "--set", "train.steps=5"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"resume refuses: data file {mine} is not the data of checkpoint" in r.stderr
    assert "fingerprint: " + fp["fingerprint"] + " -> " in r.stderr and f"bytes: {fp['bytes']} -> " in r.stderr
    assert "data.accept_changed=true" in r.stderr
    assert len(losses(rd)) == 3  # nothing ran
    # same size, same documents, other tokens in place: the sampled blocks see it
    b = bytearray(data.read_bytes())
    for i in range(len(b) - 4096, len(b), 2):
        b[i] = (b[i] + 1) % 256
    mine.write_bytes(bytes(b))
    r = run([RINGSCAN, "resume", rd, "--dry-run", "--set", "train.steps=5"])
    assert r.returncode == 2 and "fingerprint: " in r.stderr and "bytes:" not in r.stderr, r.stderr
    # accepted when asked on the command line
    r = run([RINGSCAN, "resume", rd, "--set", "train.steps=5", "--set", "data.accept_changed=true"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "continuing on it as --set data.accept_changed=true asks" in r.stdout
    assert [m["step"] for m in metrics(rd)] == [1, 2, 3, 4, 5]
    assert "accept_changed: true" in (rd / "config.resolved.yaml").read_text()
    # ... once: the resolved config's true is not a --set, so the next change is refused again
    shutil.copy(data, mine)
    r = run([RINGSCAN, "resume", rd, "--set", "train.steps=6"])
    assert r.returncode == 2 and "resume refuses: data file" in r.stderr, r.stdout + r.stderr


# ---- signals (issue 17, item 6) ------------------------------------------------------------------

@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_sigint_and_sighup_finish_the_step_checkpoint_and_exit_128_plus_signal(tmp_path, data, sig, code):
    """Ctrl-C and a closed terminal used to kill the run with no checkpoint: now they stop it like
    SIGTERM (finish the step, checkpoint), with exit 128 + signal, which the job script does not requeue."""
    rd = tmp_path / "r"
    p = start_train(rd, data, steps=200)
    wait_for_steps(p, rd, 3)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == code, out + err
    assert f"stopped by signal {int(sig)}" in out and f"exit {code}" in out
    done = len(losses(rd))
    assert 3 <= done < 200
    assert (rd / "ckpt" / f"step_{done:08d}").is_dir()
    r = run([RINGSCAN, "resume", rd, "--dry-run"])
    assert r.returncode == 0 and f"step {done} of 200" in r.stdout, r.stdout + r.stderr


def test_sighup_ignored_by_nohup_stays_ignored(tmp_path, data):
    """`nohup ringscan train ...` starts with SIGHUP ignored, so that closing the terminal leaves the run going;
    ringscan installed its handler over that and stopped (exit 129). Now the ignored SIGHUP stays ignored: a
    SIGHUP, then a SIGINT, stop the run as the SIGINT alone would (before: the SIGHUP's stop and 129, or the
    SIGINT taken as a second interrupt, exit at once without a checkpoint)."""
    rd = tmp_path / "r"
    cmd = [RINGSCAN, "train", "configs/tiny-cpu.yaml", *SMALL, "--set", f"data.path={data}",
           "--set", f"run.out_dir={rd}", "--set", "train.steps=200"]
    p = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    wait_for_steps(p, rd, 3)
    p.send_signal(signal.SIGHUP)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, out + err
    assert "stopped by signal 2" in out and "checkpoint written" in out, out + err
    done = len(losses(rd))
    assert (rd / "ckpt" / f"step_{done:08d}").is_dir()


def test_second_sigint_exits_at_once(tmp_path, data):
    rd = tmp_path / "r"
    # steps of 8 x 1024 tokens (about a second here), so the second Ctrl-C lands inside the step
    p = start_train(rd, data, "--set", "checkpoint.every=1", "--set", "data.seq_len=1024", "--set",
                    "data.micro_batch=8", steps=200)
    wait_for_steps(p, rd, 2)
    p.send_signal(signal.SIGINT)
    time.sleep(0.1)  # two signals sent at once arrive as one
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert "second interrupt: exiting now, without a checkpoint" in err
    assert "stopped by signal" not in out  # it did not wait for the step
    r = run([RINGSCAN, "resume", rd, "--dry-run"])  # the checkpoints written before are intact
    assert r.returncode == 0 and "would continue from" in r.stdout, r.stdout + r.stderr


def signal_handler_installed(p, sig, limit=30):
    """Waits until process p catches `sig` (its SigCgt mask in /proc): main's first act."""
    deadline = time.time() + limit
    while time.time() < deadline and p.poll() is None:
        for line in open(f"/proc/{p.pid}/status"):
            if line.startswith("SigCgt:") and int(line.split()[1], 16) >> (int(sig) - 1) & 1:
                return
        time.sleep(0.0005)
    raise AssertionError(f"process {p.pid} did not install a handler of {sig}")


@pytest.mark.parametrize("delay_ms", [10, 30, 60])
def test_stop_signal_while_starting_is_kept_not_fatal(tmp_path, data, delay_ms):
    """SIGUSR1 in the first ~80 ms (before the handlers were installed, after MPI_Init) killed the
    process; now main installs them first, and a stop before the first step exits 75 with nothing
    trained (or, if the step was reached, after its checkpoint). The delay counts from main's handler
    (/proc's SigCgt): before main the dynamic loader runs, which no code of ours can cover (about
    0.2 ms for a cpu-only build, tens of ms when cuBLASLt and NCCL are linked)."""
    rd = tmp_path / "r"
    p = start_train(rd, data, steps=50)
    signal_handler_installed(p, signal.SIGUSR1)
    time.sleep(delay_ms / 1000)
    p.send_signal(signal.SIGUSR1)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 75, f"exit {p.returncode}\n{out}{err}"
    assert "stopped by signal 10" in out
    if "before step 1" in out:
        assert not (rd / "ckpt").exists() or not any((rd / "ckpt").iterdir())
    # and a resume, too
    if (rd / "ckpt" / "LATEST").exists():
        p = subprocess.Popen([str(RINGSCAN), "resume", str(rd)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        signal_handler_installed(p, signal.SIGUSR1)
        time.sleep(delay_ms / 1000)
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 75, f"exit {p.returncode}\n{out}{err}"


def rewrite_manifest(path, edit):
    """Edits a checkpoint manifest and stores a matching crc32 (ckpt.c: crc32 of the compact,
    key-sorted JSON without the crc32 field), so only the edited value is wrong."""
    import zlib
    m = json.loads(path.read_text())
    edit(m)
    m.pop("crc32", None)
    text = json.dumps(m, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    m["crc32"] = zlib.crc32(text.encode())
    path.write_text(json.dumps(m, indent=2))


def test_edited_manifest_values_are_named(tmp_path, data):
    """A step of 2^62 was reported as "manifest says step -1", and a negative samples_consumed
    failed later in the data reader without naming the checkpoint."""
    rd = tmp_path / "r"
    train(rd, data, steps=2)
    man = rd / "ckpt" / "step_00000002" / "manifest.json"
    original = man.read_text()
    rewrite_manifest(man, lambda m: m["state"].update(samples_consumed=-5))
    r = run([RINGSCAN, "resume", rd, "--set", "train.steps=4"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{rd}/ckpt/step_00000002/manifest.json: the state says step 2, samples_consumed -5" in r.stderr, r.stderr
    man.write_text(original)
    rewrite_manifest(man, lambda m: m.update(step=2 ** 62))
    r = run([RINGSCAN, "resume", rd, "--set", "train.steps=4"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "\"step\" is missing or outside 0..99999999 (the directory name says 2)" in r.stderr, r.stderr
    assert "step -1" not in r.stderr


# ---- weight decay of the plain-scale GDN norm (issue 17, item 9) -----------------------------------

def read_f32(path, name):
    """One fp32 tensor of a safetensors file (header: u64 length, JSON; then the data)."""
    import struct
    import numpy as np
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])[name]
    a, b = h["data_offsets"]
    return np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4")


@pytest.mark.parametrize("decay", [False, True])
def test_gdn_norm_scale_is_not_decayed_toward_zero_unless_asked(tmp_path, data, decay):
    """linear_attn.norm is a plain scale initialised to 1: weight decay pulled it toward 0 (the
    zero-centred norms decay toward scale 1, as meant). It is now its own group, norm_scale, decayed
    only with train.decay_norm_scales. One AdamW step with lr 0.01 and weight_decay 10 moves each
    element by at most lr from the update, and by lr x wd x 1 = 0.1 more when decayed."""
    rd = tmp_path / "r"
    train(rd, data, "--set", "train.warmup_steps=0", "--set", "train.lr=0.01", "--set", "train.min_lr=0.01",
          "--set", "train.weight_decay=10", "--set", f"train.decay_norm_scales={str(decay).lower()}", steps=1)
    w = read_f32(rd / "ckpt" / "step_00000001" / "model.safetensors", "model.layers.0.linear_attn.norm")
    assert w.shape == (64,)
    shift = 0.1 if decay else 0.0
    dev = abs(w - (1.0 - shift))
    assert dev.max() <= 0.0101, (decay, w.min(), w.max())
    # the zero-centred norms still decay (toward 0 = scale 1), and matrices always
    q = read_f32(rd / "ckpt" / "step_00000001" / "model.safetensors", "model.layers.3.self_attn.q_norm")
    assert abs(q).max() <= 0.0101


def test_plan_counts_the_norm_scale_group(ringscan):
    r = run([ringscan, "plan", "configs/tiny-cpu.yaml", "--json"])
    groups = json.loads(r.stdout)["parameters"]["groups"]
    assert groups["norm_scale"] == 3 * 64  # three GDN layers, linear_value_head_dim 64
    assert groups["norm"] == 4 * 2 * 256 + 256 + 2 * 64  # layer norms, final norm, q_norm and k_norm


# ---- a bad config exits 2 and writes nothing (issue 17, item 7) -----------------------------------

def test_cpu_head_dim_limit_is_validated_and_real(tmp_path, data):
    """head_dim 1024 passed validation and plan and then failed in the cpu attention kernel with a
    run directory made; now validation names the key. 512, the kernel's limit, trains."""
    r = train(tmp_path / "big", data, "--set", "model.head_dim=1024", steps=2, expect=2)
    assert "model.head_dim = 1024 (--set" in r.stderr and "up to 512" in r.stderr, r.stderr
    assert not (tmp_path / "big").exists()
    train(tmp_path / "ok", data, "--set", "model.head_dim=512", steps=2)
    assert len(losses(tmp_path / "ok")) == 2


def test_train_applies_the_fit_verdict_before_allocating(tmp_path, data):
    """`train` used to allocate whatever plan called too big (dying in calloc); now it refuses with
    plan's numbers, exit 2, nothing written: against device.memory_gib, and on cpu against this
    host's memory shared by its ranks."""
    rd = tmp_path / "r"
    r = train(rd, data, "--set", "device.memory_gib=0.01", steps=2, expect=2)
    assert "the run does not fit: plan needs 0.0" in r.stderr and "device.memory_gib = 0.01" in r.stderr, r.stderr
    assert not rd.exists()
    # 16M-token vocabulary: ~130 GB of weights and AdamW state, more than this host has
    t0 = time.time()
    r = train(rd, data, "--set", "model.vocab_size=16000000", "--set", "device.memory_gib=100000", steps=2, expect=2)
    assert "does not fit this host: plan needs" in r.stderr and "for 1 rank" in r.stderr, r.stderr
    assert time.time() - t0 < 20 and not rd.exists()


def test_attention_pairs_model_flops_and_mfu(tmp_path, data):
    """metrics.jsonl counts the (query, key) pairs attention computes under the causal and document masks,
    and the step's model FLOPs and MFU from them: a sample inside one document has T(T+1)/2 pairs, packed
    short documents fewer, cp 2 the same as cp 1; model_flops = plan's FLOPs per token without attention x
    tokens + plan's non-causal attention FLOPs per key x pairs."""
    T = 256
    one = tmp_path / "one.tok"
    r = run([RINGSCAN, "data", "synth", one, "--tokens", "20000", "--min-doc", "100000", "--max-doc", "100000"])
    assert r.returncode == 0, r.stderr
    train(tmp_path / "one", one, "--set", "device.peak_tflops=0.001", steps=3)
    train(tmp_path / "docs", data, steps=3)
    train(tmp_path / "docs_cp2", data, "--set", "parallel.cp=2", steps=3, mpirun=2)
    plan = run([RINGSCAN, "plan", "configs/tiny-cpu.yaml", *SMALL, "--json"])
    fl = json.loads(plan.stdout)["flops_per_token"]
    for m in metrics(tmp_path / "one"):
        assert m["attention_pairs"] == T * (T + 1) // 2, m
        want = (fl["model"] - fl["attention_causal"]) * T + fl["attention_noncausal"] / T * m["attention_pairs"]
        assert abs(m["model_flops"] - want) <= 1e-9 * want, (m["model_flops"], want)
        assert abs(m["mfu"] - m["model_flops"] / (m["ms"] / 1e3) / 1e9) <= 1e-3 * m["mfu"], m
    docs, cp2 = metrics(tmp_path / "docs"), metrics(tmp_path / "docs_cp2")
    assert all(T <= m["attention_pairs"] <= T * (T + 1) // 2 for m in docs)
    assert any(m["attention_pairs"] < T * (T + 1) // 2 * 0.9 for m in docs), [m["attention_pairs"] for m in docs]
    assert [m["attention_pairs"] for m in docs] == [m["attention_pairs"] for m in cp2]
    assert "mfu" not in docs[0]  # device.peak_tflops unset: no MFU
