"""test_run_safety.py — where ringscan writes, and what it does when a write fails (issue 35, items 3, 5, 8, 9, 10).

Every output path (export OUT_DIR, eval --out, data synth/bytes OUT, plot --out, run.out_dir) is checked before any
work: not inside a run's ckpt/ tree (symlinks resolved), not a dangling symlink, not of the wrong kind. `submit`
refuses a directory holding what ringscan did not write, by train's rule. Paths reach YAML and JSON through one
quoting function each. A failed write to the run directory stops the run, says so, and leaves no torn line."""
import json
import os
import shutil

import pytest

from conftest import ROOT, run

TINY = ["--set", "parallel.cp=1", "--set", "data.seq_len=128", "--set", "data.micro_batch=2",
        "--set", "train.warmup_steps=1"]


def train_args(ringscan, data, out, steps, *extra):
    return [ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={data}",
            "--set", f"train.steps={steps}", "--set", f"run.out_dir={out}", *extra]


@pytest.fixture(scope="module")
def a_run(ringscan, recall_tok, tmp_path_factory):
    """A finished run of 2 steps with checkpoints at steps 1 and 2."""
    out = tmp_path_factory.mktemp("safety") / "U"
    r = run(train_args(ringscan, recall_tok, out, 2, "--set", "checkpoint.every=1", "--set", "checkpoint.keep=2"))
    assert r.returncode == 0, r.stderr
    return out


def tree(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


# ---- item 5: no output inside a checkpoint tree ----------------------------------------------------------------


def test_export_into_its_own_checkpoint_is_refused(ringscan, a_run, tmp_path):
    ck = a_run / "ckpt/step_00000002"
    before = tree(a_run)
    r = run([ringscan, "export", ck, ck / "hf"])
    assert r.returncode == 2 and "lies inside the checkpoint directory" in r.stderr, r.stderr
    assert "export:" not in r.stdout, r.stdout  # refused before any work
    # through a symlink to ckpt/, and into ckpt/ itself
    (tmp_path / "lnk").symlink_to(a_run / "ckpt")
    r = run([ringscan, "export", a_run, tmp_path / "lnk/hf"])
    assert r.returncode == 2 and f"resolves to {a_run}/ckpt/hf" in r.stderr, r.stderr
    r = run([ringscan, "export", a_run, a_run / "ckpt"])
    assert r.returncode == 2 and "inside the checkpoint directory" in r.stderr, r.stderr
    assert tree(a_run) == before


def test_other_outputs_inside_ckpt_are_refused(ringscan, a_run, recall_tok, tmp_path):
    before = tree(a_run)
    ck = a_run / "ckpt"
    r = run([ringscan, "eval", a_run, "--data", recall_tok, "--tokens", "256", "--out", ck / "e.json"])
    assert r.returncode == 2 and "eval --out" in r.stderr and "inside the checkpoint" in r.stderr, r.stderr
    assert "loss" not in r.stdout
    r = run([ringscan, "data", "synth", ck / "step_00000001/x.tok", "--tokens", "1000"])
    assert r.returncode == 2 and "inside the checkpoint" in r.stderr, r.stderr
    r = run([ringscan, "plot", a_run, "--out", ck / "p.png"])
    assert r.returncode == 2 and "inside the checkpoint" in r.stderr, r.stderr
    r = run(train_args(ringscan, recall_tok, ck / "nested", 1))
    assert r.returncode == 2 and "run.out_dir" in r.stderr and "inside the checkpoint" in r.stderr, r.stderr
    r = run([ringscan, "submit", ROOT / "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}",
             "--set", f"run.out_dir={ck}/job"], env={"PATH": "/nonexistent"})
    assert r.returncode == 2 and "inside the checkpoint" in r.stderr, r.stderr
    assert tree(a_run) == before


# ---- item 8: submit into a directory ringscan did not write ----------------------------------------------------


def test_submit_refuses_a_foreign_directory(ringscan, recall_tok, tmp_path):
    """A copy of /etc-like files gets no job.sbatch, config.submitted.yaml or logs/: the rule `train` applies."""
    d = tmp_path / "etc"
    d.mkdir()
    (d / "hostname").write_text("node\n")
    (d / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    cmd = [ringscan, "submit", ROOT / "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}",
           "--set", f"run.out_dir={d}"]
    r = run(cmd, env={"PATH": "/nonexistent"})
    assert r.returncode == 2, r.stderr
    assert "holds 2 entries that ringscan did not write (hostname, passwd)" in r.stderr, r.stderr
    assert "nothing was written or submitted" in r.stderr and "sbatch" not in r.stderr, r.stderr
    assert sorted(p.name for p in d.iterdir()) == ["hostname", "passwd"]
    r = run([*cmd, "--dry-run"], env={"PATH": "/nonexistent"})
    assert r.returncode == 0 and r.stdout.startswith("#!/bin/bash\n"), r.stderr
    assert "warning:" in r.stderr and "did not write" in r.stderr, r.stderr
    # train says the same of the same directory
    r = run(train_args(ringscan, recall_tok, d, 1))
    assert r.returncode == 2 and "holds 2 entries that ringscan did not write" in r.stderr, r.stderr


# ---- item 10: output paths checked up front --------------------------------------------------------------------


def test_out_dir_naming_a_file_is_bad_input(ringscan, recall_tok, tmp_path):
    f = tmp_path / "afile"
    f.write_text("mine\n")
    r = run(train_args(ringscan, recall_tok, f, 1))
    assert r.returncode == 2 and f"run.out_dir {f} exists and is not a directory" in r.stderr, r.stderr
    assert f.read_text() == "mine\n"


def test_export_to_a_dangling_symlink_is_refused_before_work(ringscan, a_run, tmp_path):
    (tmp_path / "dang").symlink_to(tmp_path / "nowhere")
    r = run([ringscan, "export", a_run, tmp_path / "dang"])
    assert r.returncode == 2 and "dangling symlink" in r.stderr, r.stderr
    assert "export:" not in r.stdout, r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dang"]


def test_eval_out_a_directory_is_refused_before_work(ringscan, a_run, recall_tok, tmp_path):
    r = run([ringscan, "eval", a_run, "--data", recall_tok, "--tokens", "256", "--out", tmp_path])
    assert r.returncode == 2 and "is a directory" in r.stderr, r.stderr
    assert "loss" not in r.stdout, r.stdout


def test_eval_and_plot_out_under_missing_directories(ringscan, a_run, recall_tok, tmp_path):
    """The up-front check accepts an --out whose directories can be created (as export and data synth do), but
    eval and plot did not create them: eval failed with exit 1 after the whole evaluation, plot after drawing."""
    out = tmp_path / "new" / "deeper" / "eval.json"
    r = run([ringscan, "eval", a_run, "--data", recall_tok, "--tokens", "256", "--out", out])
    assert r.returncode == 0 and json.loads(out.read_text())["data"] == str(recall_tok), r.stderr
    png = tmp_path / "other" / "plot.png"
    r = run([ringscan, "plot", a_run, "--out", png])
    assert r.returncode == 0 and png.exists() or "gnuplot is not installed" in r.stderr, r.stderr


# ---- item 9: user strings reach YAML and JSON through one quoting function each --------------------------------


def test_eval_data_path_is_quoted_exactly(ringscan, a_run, recall_tok, tmp_path):
    """`--data 'q"mid.tok'` evaluated the file `q`, and `x\\\\y.tok` opened `x\\y.tok`: the path was spliced into
    YAML text unescaped. Now config_yaml_quote carries it, and eval.json names exactly the file read."""
    shutil.copy(recall_tok, tmp_path / 'q"mid.tok')
    shutil.copy(recall_tok, tmp_path / "x\\y.tok")
    (tmp_path / "q").write_bytes(b"not data")
    for name in ('q"mid.tok', "x\\y.tok"):
        out = tmp_path / "e.json"
        r = run([ringscan, "eval", a_run, "--data", name, "--tokens", "256", "--out", out], cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert json.loads(out.read_text())["data"] == name
    r = run([ringscan, "eval", a_run, "--data", "x\\\\y.tok", "--tokens", "256", "--out", tmp_path / "f.json"],
            cwd=tmp_path)
    assert r.returncode == 2 and "x\\\\y.tok does not exist" in r.stderr, r.stderr


def test_written_config_reads_back_every_string(ringscan, tmp_path):
    """config show writes YAML that loads back to the same values, whatever a string holds."""
    for path in ('a"b', "a\\b", "a\u2028b\u0085c", "sp ace: #x", "'single'"):
        y = tmp_path / "c.yaml"
        r = run([ringscan, "config", "show", ROOT / "configs/tiny-cpu.yaml", "--set", f"data.path={json.dumps(path)}"])
        assert r.returncode == 0, r.stderr
        y.write_text(r.stdout)
        r2 = run([ringscan, "config", "show", y])
        assert r2.returncode == 0 and r2.stdout == r.stdout, r2.stderr


def test_submitted_config_comment_cannot_be_escaped(ringscan, recall_tok, tmp_path):
    """The config's own path goes into a comment of config.submitted.yaml: a newline in it used to end the
    comment and start YAML the job would load."""
    cfg = tmp_path / "c\nbogus: 1\n#.yaml"
    shutil.copy(ROOT / "configs/tiny-cpu.yaml", cfg)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bin_dir / "sbatch").chmod(0o755)
    rd = tmp_path / "job"
    r = run([ringscan, "submit", cfg, "--set", f"data.path={recall_tok}", "--set", f"run.out_dir={rd}"],
            env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout == "4242\n", r.stderr
    r = run([ringscan, "config", "check", rd / "config.submitted.yaml"])
    assert r.returncode == 0, r.stderr


# ---- item 3: a failed write to the run directory stops the run, and leaves no torn line -----------------------


def start_with_file_limit_later(args, watch, lines, limit_of, sigxfsz=None):
    """Starts `args` with SIGXFSZ ignored (a write past RLIMIT_FSIZE then fails with EFBIG, as on a full disk;
    sigxfsz=signal.SIG_DFL: as a shell starts it, where ringscan must ignore it itself),
    waits until `watch` holds `lines` lines, then lowers the process's file size limit to limit_of() bytes.
    (MPI_Init needs files of its own, so the limit cannot be set before the start.)"""
    import resource
    import signal
    import subprocess
    import time
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.Popen([str(a) for a in args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, preexec_fn=lambda: signal.signal(signal.SIGXFSZ, sigxfsz or signal.SIG_IGN))
    while p.poll() is None and not (watch.exists() and watch.read_text().count("\n") >= lines):
        time.sleep(0.01)
    assert p.poll() is None, "the run ended before the limit was set"
    n = limit_of()
    resource.prlimit(p.pid, resource.RLIMIT_FSIZE, (n, n))
    out, err = p.communicate(timeout=600)
    return p.returncode, out, err


def whole_lines(path):
    text = path.read_text()
    assert text.endswith("\n"), f"{path} ends in a partial line: {text[-200:]!r}"
    return text.splitlines()


def test_metrics_write_failure_stops_the_run_and_resume_copes(ringscan, recall_tok, tmp_path):
    rd = tmp_path / "r"
    r = run(train_args(ringscan, recall_tok, rd, 5, "--set", "checkpoint.every=0", "--set", "run.log_every=1000"))
    assert r.returncode == 0, r.stderr
    m = rd / "metrics.jsonl"
    args = [ringscan, "resume", rd, "--set", "train.steps=400"]
    # above log.txt's size, so that metrics.jsonl is the file that fails (and the error still reaches log.txt)
    limit = lambda: max(m.stat().st_size, (rd / "log.txt").stat().st_size) + 1500
    rc, out, err = start_with_file_limit_later(args, m, 8, limit)
    assert rc == 1, err[-2000:]
    assert "metrics.jsonl: write of" in err and "File too large" in err and "the partial record was cut off" in err
    assert "the newest checkpoint, step 5, is intact" in err and f"ringscan resume {rd}" in err, err
    assert "the run directory cannot be written" in (rd / "log.txt").read_text()  # the error reached log.txt too
    steps = [json.loads(line)["step"] for line in whole_lines(m)]
    assert steps == list(range(1, len(steps) + 1)) and 8 <= len(steps) < 400, steps
    r = run([ringscan, "plot", rd])  # no torn line for plot to refuse
    assert r.returncode == 0 or "gnuplot is not installed" in r.stderr, r.stderr
    # the next start continues from the checkpoint: the metrics after it replaced, once each
    r = run([ringscan, "resume", rd, "--set", "train.steps=12"])
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["step"] for line in whole_lines(m)] == list(range(1, 13))


def test_log_write_failure_stops_the_run_with_the_error_on_stderr(ringscan, recall_tok, tmp_path):
    rd = tmp_path / "r"
    log = rd / "log.txt"
    args = train_args(ringscan, recall_tok, rd, 400, "--set", "checkpoint.every=0", "--set", "run.log_every=1")
    rc, out, err = start_with_file_limit_later(args, rd / "metrics.jsonl", 3, lambda: log.stat().st_size)
    assert rc == 1, err[-2000:]
    assert "log.txt: write of" in err and "no checkpoint was written yet" in err, err
    assert "the same `ringscan train` starts the attempt over" in err, err
    whole_lines(log)
    n = len(whole_lines(rd / "metrics.jsonl"))
    assert 3 <= n < 400
    # the next start: an attempt with no checkpoint is started over
    r = run(train_args(ringscan, recall_tok, rd, 3, "--set", "checkpoint.every=0"))
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["step"] for line in whole_lines(rd / "metrics.jsonl")] == [1, 2, 3]


def test_file_size_limit_with_sigxfsz_at_its_default_is_a_named_error(ringscan, recall_tok, tmp_path):
    """`ulimit -f` as a shell leaves it: SIGXFSZ at its default action killed the trainer at the write past the
    limit (exit 153, not a word); ringscan ignores SIGXFSZ, so the write fails with EFBIG and is named."""
    import signal
    rd = tmp_path / "r"
    log = rd / "log.txt"
    args = train_args(ringscan, recall_tok, rd, 400, "--set", "checkpoint.every=0", "--set", "run.log_every=1")
    rc, out, err = start_with_file_limit_later(args, rd / "metrics.jsonl", 3, lambda: log.stat().st_size,
                                               sigxfsz=signal.SIG_DFL)
    assert rc == 1, (rc, err[-2000:])
    assert "log.txt: write of" in err and "File too large" in err, err
    whole_lines(log)


# ---- item 4: a checkpoint that holds non-finite values is not resumed ------------------------------------------


def poke_and_reseal(step_dir, file, prefix, value):
    """Writes `value` into the first element of the first tensor of `file` whose name starts with `prefix`,
    then recomputes the manifest's crc32s as ckpt_save does (the file is then 'as written', but not sound)."""
    import struct
    import zlib
    f = step_dir / file
    b = bytearray(f.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    name = next(k for k in h if k != "__metadata__" and k.startswith(prefix))
    off = 8 + n + h[name]["data_offsets"][0]
    b[off:off + 4] = struct.pack("<f", value)
    f.write_bytes(bytes(b))
    m = json.loads((step_dir / "manifest.json").read_text())
    for e in m["files"]:
        data = (step_dir / e["name"]).read_bytes()
        e["crc32"], e["size"] = zlib.crc32(data), len(data)
    del m["crc32"]
    m["crc32"] = zlib.crc32(json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
    (step_dir / "manifest.json").write_text(json.dumps(m, indent=2))


@pytest.mark.parametrize("file,prefix,value", [("optim.safetensors", "m.", float("nan")),
                                               ("optim.safetensors", "v.", -1.0),
                                               ("model.safetensors", "model.", float("inf"))])
def test_resume_refuses_a_checkpoint_holding_non_finite_values(ringscan, a_run, tmp_path, file, prefix, value):
    """A NaN in the optimizer state passed the crc and the weights' checks: the first step's update made the
    weights NaN, checkpoint.every=1 saved them (rotating a sound checkpoint away), and only the next step's
    loss stopped the run, saying 'the last checkpoint is intact'. Now resume refuses it naming the tensor."""
    d = tmp_path / "r"
    shutil.copytree(a_run, d)
    poke_and_reseal(d / "ckpt/step_00000002", file, prefix, value)
    before = tree(d / "ckpt")
    r = run([ringscan, "resume", d, "--set", "train.steps=4", "--set", "checkpoint.every=1"])
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"tensor {prefix}" in r.stderr and f"in {file} holds 1 value" in r.stderr, r.stderr
    assert tree(d / "ckpt") == before


# ---- item 10: the smaller ones ---------------------------------------------------------------------------------


def test_overwrite_in_place_with_the_old_mtime_restored_is_seen(ringscan, recall_tok, tmp_path):
    """Same size, other bytes, mtime set back: only ctime (which no call can set back) tells."""
    import subprocess
    import time
    mine = tmp_path / "d.tok"
    shutil.copy(recall_tok, mine)
    rd = tmp_path / "r"
    p = subprocess.Popen([str(a) for a in train_args(ringscan, mine, rd, 400, "--set", "checkpoint.every=2")],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    m = rd / "metrics.jsonl"
    while p.poll() is None and not (m.exists() and m.read_text().count("\n") >= 3):
        time.sleep(0.01)
    st = mine.stat()
    with open(mine, "r+b") as f:
        f.seek(st.st_size // 2)
        f.write(bytes(range(0, 128)) * 64)  # valid token ids, other tokens
    os.utime(mine, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert mine.stat().st_mtime_ns == st.st_mtime_ns and mine.stat().st_size == st.st_size
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2, err[-2000:]
    assert f"data file {mine} changed while the run was reading it" in err and "status change time" in err, err


def test_eval_tokens_beyond_the_range_is_refused(ringscan, a_run, recall_tok):
    for v in ("18446744073709551617", "99999999999999999999999", "9223372036854775807", "-1", "0", "1e3"):
        r = run([ringscan, "eval", a_run, "--data", recall_tok, "--tokens", v])
        assert r.returncode == 2 and "--tokens" in r.stderr, (v, r.stdout, r.stderr)
        assert "loss" not in r.stdout and "-" not in r.stdout.split("samples")[0], r.stdout


def test_folder_with_both_model_file_and_index_reads_the_model_file(ringscan, a_run, tmp_path):
    """transformers loads model.safetensors when a folder holds it and an index: so does ringscan."""
    hf = tmp_path / "hf"
    r = run([ringscan, "export", a_run, hf])
    assert r.returncode == 0, r.stderr
    (hf / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    r = run([ringscan, "export", hf, tmp_path / "again"])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "again/model.safetensors").read_bytes() == (hf / "model.safetensors").read_bytes()
