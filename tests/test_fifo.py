"""test_fifo.py — every file ringscan reads must be a regular file: open() of a FIFO waits for a writer forever,
so each reader opens through fsio_open_regular (O_NONBLOCK, then fstat) and refuses anything else, naming the
file and what it is. Each case once hung (issue 35, item 7); here each must end within its timeout with exit 2
(or, for ckpt/LATEST, fall back to scanning ckpt/ as it does for a missing LATEST)."""
import os
import shutil

import pytest

from conftest import ROOT, run

TINY = ["--set", "parallel.cp=1", "--set", "data.seq_len=128", "--set", "data.micro_batch=2",
        "--set", "train.warmup_steps=1", "--set", "checkpoint.every=0"]
LIMIT = 60  # seconds: far above what each command needs, far below a hang


@pytest.fixture(scope="module")
def a_run(ringscan, recall_tok, tmp_path_factory):
    out = tmp_path_factory.mktemp("fifo") / "run"
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={recall_tok}",
             "--set", "train.steps=2", "--set", f"run.out_dir={out}"])
    assert r.returncode == 0, r.stderr
    return out


def with_fifo(a_run, tmp_path, name):
    """A copy of the run with `name` replaced by a FIFO."""
    d = tmp_path / "r"
    shutil.copytree(a_run, d)
    os.remove(d / name)
    os.mkfifo(d / name)
    return d


@pytest.mark.parametrize("sub", [["check"], ["inspect", "--sample", "0", "--seq-len", "128"]])
def test_data_tools_on_a_fifo(ringscan, tmp_path, sub):
    os.mkfifo(tmp_path / "f.tok")
    r = run([ringscan, "data", sub[0], tmp_path / "f.tok", *sub[1:]], timeout=LIMIT)
    assert r.returncode == 2 and "is not a regular file" in r.stderr, r.stderr


def test_data_check_of_a_prefix_whose_idx_is_a_fifo(ringscan, tmp_path):
    """PREFIX.idx a FIFO: refused naming the FIFO, not "PREFIX does not exist"."""
    os.mkfifo(tmp_path / "d.idx")
    (tmp_path / "d.bin").write_bytes(b"\0" * 64)
    r = run([ringscan, "data", "check", tmp_path / "d"], timeout=LIMIT)
    assert r.returncode == 2 and "d.idx" in r.stderr and "FIFO" in r.stderr, r.stderr


def test_plot_with_metrics_a_fifo(ringscan, a_run, tmp_path):
    d = with_fifo(a_run, tmp_path, "metrics.jsonl")
    r = run([ringscan, "plot", d], timeout=LIMIT)
    assert r.returncode == 2 and "metrics.jsonl: expected a regular file, found a FIFO" in r.stderr, r.stderr
    assert not (d / "plot.png").exists()


def test_resume_with_config_a_fifo(ringscan, a_run, tmp_path):
    d = with_fifo(a_run, tmp_path, "config.resolved.yaml")
    r = run([ringscan, "resume", d, "--set", "train.steps=3"], timeout=LIMIT)
    assert r.returncode == 2 and "config.resolved.yaml: expected a regular file, found a FIFO" in r.stderr, r.stderr


def test_latest_a_fifo_is_scanned_past(ringscan, a_run, tmp_path, recall_tok):
    """ckpt/LATEST a FIFO is treated as a LATEST that cannot be read: a warning, and the newest verified
    checkpoint found by scanning ckpt/ (export, eval and resume alike), never a wait."""
    d = with_fifo(a_run, tmp_path, "ckpt/LATEST")
    r = run([ringscan, "export", d, tmp_path / "out"], timeout=LIMIT)
    assert r.returncode == 0, r.stderr
    assert "LATEST: expected a regular file, found a FIFO" in r.stderr and "(step 2)" in r.stdout, r.stdout + r.stderr
    r = run([ringscan, "eval", d, "--data", recall_tok, "--tokens", "4096"], timeout=LIMIT)
    assert r.returncode == 0 and "found a FIFO" in r.stderr, r.stderr
    r = run([ringscan, "resume", d, "--set", "train.steps=3"], timeout=LIMIT)
    assert r.returncode == 0 and "found a FIFO" in r.stderr, r.stdout[-1000:] + r.stderr


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_run_lock_that_is_not_a_file(ringscan, a_run, tmp_path, kind):
    """RUN/.lock is written in place (the holder's name): a .lock that is a symlink to a user's file was
    followed and truncated by `resume`, a FIFO or a directory failed with exit 1 and errno's words. Each is
    refused with exit 2 naming the lock and what it is, and the symlink's target is left as it was."""
    d = tmp_path / "r"
    shutil.copytree(a_run, d)
    os.remove(d / ".lock")
    victim = tmp_path / "precious.txt"
    victim.write_text("a user's file\n")
    {"symlink": lambda: os.symlink(victim, d / ".lock"), "fifo": lambda: os.mkfifo(d / ".lock"),
     "directory": lambda: os.mkdir(d / ".lock")}[kind]()
    r = run([ringscan, "resume", d, "--set", "train.steps=3"], timeout=LIMIT)
    assert r.returncode == 2 and f"the run lock {d}/.lock is a" in r.stderr, r.stderr
    assert victim.read_text() == "a user's file\n"
    assert not (d / "ckpt/step_00000003").exists()
