"""test_slurm.py — `ringscan submit` against a real Slurm cluster started here.

The module starts munged, slurmctld and slurmd on localhost in a private temp
directory (slurm/test-cluster.conf.in, recipe ../shared/slurm_local.md), with
their own ports, munge socket and SLURM_CONF, so nothing under /etc or /run is
touched. Every daemon is stopped by the PID it wrote, in a finalizer that runs
even when a test or the start-up fails. Missing Slurm binaries are a failure,
not a skip: CI installs them with `make deps`.

What is checked, each with a real job of configs/tiny-cpu.yaml made small:
  - a submitted run trains to the end, under both launchers (srun --mpi=pmix
    and mpirun inside the allocation), with the losses of a plain mpirun run;
  - the warning signal mid-run (`scancel --signal=USR1 --batch`, what
    --signal=B:USR1@N delivers): the ranks checkpoint, the job exits 75,
    requeues itself, resumes and finishes with losses bitwise equal to an
    uninterrupted run; slurm.max_restarts = 0 stops the loop (exit 75);
  - injection attempts in every string that reaches the job script are
    refused (exit 2, the key named, nothing written, nothing submitted);
  - --dry-run prints the script and writes nothing, and only warns about a
    run directory that a real submit refuses; slurm/README.md's GPU example
    is what the binary renders.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import RINGSCAN, ROOT, run

# The layout of the submitted runs: two context-parallel ranks (the zigzag layout over MPI)
LAYOUT = {"parallel.dp": 1, "parallel.cp": 2}
WORLD = LAYOUT["parallel.dp"] * LAYOUT["parallel.cp"]

SMALL = ["--set", "data.seq_len=256", "--set", "data.micro_batch=1", "--set", "train.warmup_steps=2",
         "--set", "slurm.time=5", "--set", "slurm.signal_s=30"]
for _k, _v in LAYOUT.items():
    SMALL += ["--set", f"{_k}={_v}"]

DAEMONS = ["munged", "slurmctld", "slurmd"]
CLIENTS = ["sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun"]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}


def find_binary(name):
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin"
    return shutil.which(name, path=path)


def running(pid, name):
    """True while `pid` is a live `name` (not a zombie: daemons are reparented to an init that may reap late;
    not another program: a stale pid must never make us kill someone else's process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm == name and stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One slurmctld + one slurmd (node `localhost`, 8 CPUs) + their munged."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="ringscan-slurm-"))
        self.dir.chmod(0o755)  # munged wants every directory above its socket searchable
        self.conf = self.dir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), OMPI_ALLOW_RUN_AS_ROOT="1",
                        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        self.pids = {}  # daemon name -> pid, read from the pid file it wrote

    def _daemon(self, name, args, pid_file):
        r = subprocess.run([find_binary(name), *args], env=self.env, cwd=self.dir, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, f"{name} did not start: {r.stdout}{r.stderr}\n{self.logs()}"
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text().strip():
                self.pids[name] = int(pid_file.read_text().split()[0])
                return
            time.sleep(0.05)
        raise AssertionError(f"{name} wrote no pid file {pid_file}\n{self.logs()}")

    def start(self):
        d = self.dir
        for sub in ("munge", "state", "spool/localhost", "tmpfs", "log"):
            (d / sub).mkdir(parents=True)
        (d / "munge").chmod(0o755)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = d / "munge" / "munge.socket"
        self._daemon("munged", [f"--socket={sock}", f"--key-file={key}", f"--log-file={d}/log/munged.log",
                                f"--pid-file={d}/munge/munged.pid", f"--seed-file={d}/munge/munged.seed"],
                     d / "munge" / "munged.pid")
        conf = (ROOT / "slurm" / "test-cluster.conf.in").read_text()
        for k, v in {"@DIR@": d, "@CTLD_PORT@": free_port(), "@SLURMD_PORT@": free_port(),
                     "@MUNGE_SOCKET@": sock, "@CPUS@": 8}.items():
            conf = conf.replace(k, str(v))
        self.conf.write_text(conf)
        self._daemon("slurmctld", [], d / "slurmctld.pid")
        self._daemon("slurmd", [], d / "slurmd-localhost.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            r = self.cmd("sinfo", "-h", "-o", "%T", check=False)
            if r.returncode == 0 and r.stdout.split() == ["idle"]:
                return
            time.sleep(0.3)
        raise AssertionError(f"the node never became idle: {r.stdout}{r.stderr}\n{self.logs()}")

    def cmd(self, name, *args, check=True, timeout=60):
        r = subprocess.run([find_binary(name), *map(str, args)], env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check:
            assert r.returncode == 0, f"{name} {args}: {r.stdout}{r.stderr}\n{self.logs()}"
        return r

    def jobs(self):
        r = self.cmd("squeue", "-h", "-o", "%i", check=False)
        return r.stdout.split() if r.returncode == 0 else []

    def logs(self, lines=25):
        out = []
        for f in sorted((self.dir / "log").glob("*.log")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def _ours(self):
        """PIDs of processes running with our SLURM_CONF (job steps a killed slurmd would leave)."""
        want = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) == os.getpid():
                continue
            try:
                if want in (p / "environ").read_bytes().split(b"\0"):
                    pids.append(int(p.name))
            except OSError:
                pass
        return pids

    def stop(self):
        """Cancels every job, then stops the daemons by PID (slurmd, slurmctld, munged) and removes the dir."""
        try:
            if "slurmctld" in self.pids:
                ids = self.jobs()
                if ids:
                    self.cmd("scancel", *ids, check=False)
                deadline = time.time() + 30
                while self.jobs() and time.time() < deadline:
                    time.sleep(0.5)
        finally:
            for name in ("slurmd", "slurmctld", "munged"):
                pid = self.pids.get(name)
                if pid is None or not running(pid, name):
                    continue
                os.kill(pid, signal.SIGTERM)
                for _ in range(100):
                    if not running(pid, name):
                        break
                    time.sleep(0.1)
                else:
                    os.kill(pid, signal.SIGKILL)
            leftovers = self._ours()
            for pid in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.2)
            alive = [n for n, pid in self.pids.items() if running(pid, n)]
            if not os.environ.get("RINGSCAN_KEEP_SLURM"):
                shutil.rmtree(self.dir, ignore_errors=True)
            assert not alive, f"daemons still running after the stop: {alive}"
            assert not leftovers, f"processes of the cluster outlived its daemons (killed now): {leftovers}"

    def job_info(self, job):
        r = self.cmd("scontrol", "show", "job", "-o", job, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout)) if r.returncode == 0 else {}

    def wait(self, job, run_dir, timeout=240):
        """Waits for a terminal state; returns scontrol's fields of the job."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            info = self.job_info(job)
            if info.get("JobState") in TERMINAL:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job} did not finish in {timeout} s: {self.job_info(job)}\n"
                             f"{job_logs(run_dir)}\n{self.logs()}")


@pytest.fixture(scope="module")
def cluster(request):
    missing = [b for b in DAEMONS + CLIENTS if not find_binary(b)]
    if missing:
        pytest.fail(f"Slurm is not installed (missing {', '.join(missing)}): `make deps` installs slurm-wlm and munge")
    c = Cluster()
    request.addfinalizer(c.stop)
    c.start()
    return c


@pytest.fixture(scope="module")
def data(tmp_path_factory, ringscan):
    d = tmp_path_factory.mktemp("data")
    r = run([ringscan, "data", "synth", d / "recall.tok", "--tokens", "300000", "--seed", "7"])
    assert r.returncode == 0, r.stderr
    return d / "recall.tok"


def run_sets(run_dir, data, steps, *extra):
    return [*SMALL, "--set", f"data.path={data}", "--set", f"run.out_dir={run_dir}", "--set", f"train.steps={steps}",
            *extra]


def submit(cluster, run_dir, data, steps, *extra):
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", *run_sets(run_dir, data, steps, *extra)], env=cluster.env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.fullmatch(r"\d+\n", r.stdout), r.stdout  # the job id alone
    return r.stdout.strip()


def reference(run_dir, data, steps):
    """The same run with plain mpirun, outside Slurm (started in the background)."""
    args = ["mpirun", "-np", str(WORLD), "--oversubscribe", RINGSCAN, "train", "configs/tiny-cpu.yaml",
            *run_sets(run_dir, data, steps)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return subprocess.Popen([str(a) for a in args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc):
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out


def losses(run_dir):
    return [json.loads(line)["loss"] for line in open(run_dir / "metrics.jsonl")]


def job_logs(run_dir):
    logs = sorted((Path(run_dir) / "logs").glob("*")) if (Path(run_dir) / "logs").exists() else []
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}" for f in logs)


def job_log(run_dir, job, restart):
    return (run_dir / "logs" / f"job-{job}.{restart}.log").read_text()


# ---- runs ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_submitted_run_trains_to_the_end(cluster, data, tmp_path, launcher):
    ref = reference(tmp_path / "ref", data, 6)
    rd = tmp_path / "job"
    job = submit(cluster, rd, data, 6, "--set", f"slurm.launcher={launcher}")
    info = cluster.wait(job, rd)
    finish(ref)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, job_logs(rd))
    for f in ("job.sbatch", "config.submitted.yaml", "config.resolved.yaml", "log.txt", f"logs/slurm-{job}.out"):
        assert (rd / f).exists(), f
    log = job_log(rd, job, 0)
    assert f"{launcher}: ringscan train {rd}/config.submitted.yaml" in log, log
    assert f"world {WORLD} = dp {LAYOUT['parallel.dp']} x cp {LAYOUT['parallel.cp']}" in log, log
    assert "ringscan train exited with 0" in log, log
    assert [json.loads(x)["step"] for x in open(rd / "metrics.jsonl")] == list(range(1, 7))
    assert losses(rd) == losses(tmp_path / "ref")  # the same computation as a plain mpirun run, bitwise


def test_warning_signal_checkpoints_requeues_and_resumes_exactly(cluster, data, tmp_path):
    steps = 24  # long enough that the signal lands mid-run even at 0.2 s per step
    ref = reference(tmp_path / "ref", data, steps)
    rd = tmp_path / "job"
    job = submit(cluster, rd, data, steps)
    deadline = time.time() + 120
    while time.time() < deadline:  # signal once training is under way (the handlers are up from the start)
        m = rd / "metrics.jsonl"
        if m.exists() and len(m.read_text().splitlines()) >= 2:
            break
        assert cluster.job_info(job).get("JobState") not in TERMINAL, job_logs(rd)
        time.sleep(0.2)
    else:
        raise AssertionError(f"no training steps after 120 s\n{job_logs(rd)}\n{cluster.logs()}")
    cluster.cmd("scancel", "--signal=USR1", "--batch", job)  # what --signal=B:USR1@N delivers to the batch shell
    info = cluster.wait(job, rd, timeout=300)
    finish(ref)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, job_logs(rd))
    assert info["Restarts"] == "1", info

    first, second = job_log(rd, job, 0), job_log(rd, job, 1)
    assert "SIGUSR1: the ranks checkpoint" in first, first
    m = re.search(r"stopped by signal 10 after step (\d+), checkpoint written; exit 75", first)
    assert m and 2 <= int(m.group(1)) < steps, first  # stopped mid-run
    assert "ringscan train exited with 75" in first and f"requeueing job {job}" in first, first
    assert f"ringscan resume {rd}" in second, second
    assert f"resumed from {rd}/ckpt/step_{int(m.group(1)):08d}" in second, second
    assert "ringscan resume exited with 0" in second, second

    assert len(losses(rd)) == steps
    assert losses(rd) == losses(tmp_path / "ref")  # exact float equality with the uninterrupted run

    # the same run directory resumes the same way outside Slurm
    r = run(["mpirun", "-np", WORLD, "--oversubscribe", RINGSCAN, "resume", rd, "--set", f"train.steps={steps + 5}",
             "--dry-run"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"step {steps} of {steps + 5}" in r.stdout, r.stdout


def test_max_restarts_ends_the_requeue_loop(cluster, data, tmp_path):
    rd = tmp_path / "job"
    job = submit(cluster, rd, data, 60, "--set", "slurm.max_restarts=0", "--set", "slurm.launcher=mpirun")
    deadline = time.time() + 120
    while time.time() < deadline and not ((rd / "metrics.jsonl").exists() and (rd / "metrics.jsonl").read_text()):
        time.sleep(0.2)
    cluster.cmd("scancel", "--signal=USR1", "--batch", job)
    info = cluster.wait(job, rd)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "75:0", (info, job_logs(rd))
    assert info["Restarts"] == "0", info
    log = job_log(rd, job, 0)
    assert "not requeueing: 0 restarts, slurm.max_restarts = 0" in log, log
    assert (rd / "ckpt" / "LATEST").exists()


# ---- refusals: nothing written, nothing submitted ---------------------------------------------------------------

INJECTIONS = ["gpu; rm -rf ~", "$(touch /tmp/pwned)", "a`id`", "x'y", "a b", "a\nb", "a|b", "50%x"]
STRING_KEYS = ["run.name", "run.out_dir", "slurm.partition", "slurm.account", "slurm.qos", "slurm.time",
               "slurm.srun_mpi", "slurm.site_env"]  # every string that reaches the job script


def assert_refused(r, keys, run_dir, cluster, jobs_before):
    assert r.returncode == 2, (keys, r.stdout, r.stderr)
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    for key in [keys] if isinstance(keys, str) else keys:
        assert any(key in line for line in errors), (key, r.stderr)
    assert r.stdout == ""
    assert not run_dir.exists(), keys  # nothing written
    assert cluster.jobs() == jobs_before  # nothing submitted


def injected(key, bad, run_dir):
    value = f"{run_dir}/{bad}" if key == "run.out_dir" else bad
    return ["--set", f"{key}={json.dumps(value)}"]  # a YAML double-quoted string


@pytest.mark.parametrize("key", STRING_KEYS)
def test_injection_in_each_script_value_is_refused(cluster, tmp_path, key):
    rd = tmp_path / "job"
    before = cluster.jobs()
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", "--set", f"run.out_dir={rd}",
             *injected(key, INJECTIONS[0], rd)], env=cluster.env)
    assert_refused(r, key, rd, cluster, before)


@pytest.mark.parametrize("dry", [[], ["--dry-run"]], ids=["submit", "dry-run"])
def test_every_injection_in_every_script_value_is_refused(cluster, tmp_path, dry):
    """Each attempt in all the keys at once: every key is named (the loader reports every error)."""
    rd = tmp_path / "job"
    before = cluster.jobs()
    for bad in INJECTIONS:
        sets = [x for key in STRING_KEYS for x in injected(key, bad, rd)]
        r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", "--set", f"run.out_dir={rd}", *sets, *dry],
                env=cluster.env)
        assert_refused(r, STRING_KEYS, rd, cluster, before)
    assert not Path("/tmp/pwned").exists()


def test_injection_from_a_yaml_file_is_refused(cluster, tmp_path):
    rd = tmp_path / "job"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text((ROOT / "configs" / "tiny-cpu.yaml").read_text().replace(
        "slurm:\n", 'slurm:\n  partition: "gpu; rm -rf ~"\n'))
    before = cluster.jobs()
    r = run([RINGSCAN, "submit", cfg, "--set", f"run.out_dir={rd}"], env=cluster.env)
    assert_refused(r, "slurm.partition", rd, cluster, before)
    assert re.search(r"bad\.yaml:\d+:\d+: slurm\.partition", r.stderr), r.stderr


def test_paths_derived_at_submit_are_checked_too(cluster, tmp_path):
    """A relative run.out_dir under a working directory with a space: the absolute path is refused."""
    odd = tmp_path / "my runs"
    odd.mkdir()
    before = cluster.jobs()
    r = run([RINGSCAN, "submit", ROOT / "configs" / "tiny-cpu.yaml", "--set", "run.out_dir=job"], cwd=odd,
            env=cluster.env)
    assert_refused(r, "run.out_dir", odd / "job", cluster, before)
    assert "may not reach a job script" in r.stderr and "working directory" in r.stderr, r.stderr


def test_submit_refusals(cluster, data, tmp_path):
    before = cluster.jobs()
    rd = tmp_path / "job"
    # the allocation must hold one task per rank
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", *run_sets(rd, data, 6), "--set", "slurm.gpus_per_node=3"],
            env=cluster.env)
    assert_refused(r, "slurm.gpus_per_node", rd, cluster, before)
    assert "parallel.dp" in r.stderr
    # plan's verdict: does not fit -> exit 1
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", *run_sets(rd, data, 6), "--set", "device.memory_gib=0.01"],
            env=cluster.env)
    assert r.returncode == 1 and "does not fit" in r.stderr and "device.memory_gib" in r.stderr, r.stderr
    assert not rd.exists() and cluster.jobs() == before
    # the warning must come before the limit
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", *run_sets(rd, data, 6), "--set", "slurm.signal_s=300"],
            env=cluster.env)
    assert_refused(r, "slurm.signal_s", rd, cluster, before)
    # a missing site file
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", *run_sets(rd, data, 6), "--set", "slurm.site_env=nope.env"],
            env=cluster.env)
    assert_refused(r, "slurm.site_env", rd, cluster, before)
    # no sbatch on PATH: exit 1, and the run directory is left as it was
    empty = tmp_path / "empty-path"
    empty.mkdir()
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", *run_sets(rd, data, 6)], env=dict(cluster.env, PATH=str(empty)))
    assert r.returncode == 1 and "sbatch is not on PATH" in r.stderr, r.stderr
    assert not rd.exists() and cluster.jobs() == before
    # a run directory that already holds a run
    (rd / "ckpt").mkdir(parents=True)
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", *run_sets(rd, data, 6)], env=cluster.env)
    assert r.returncode == 2 and "already holds a run" in r.stderr and "ringscan resume" in r.stderr, r.stderr
    assert sorted(p.name for p in rd.iterdir()) == ["ckpt"] and cluster.jobs() == before


# ---- the rendered script ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("taken,what", [("job.sbatch", "submitted job"), ("ckpt", "run"), ("metrics.jsonl", "run")])
def test_dry_run_on_a_used_run_directory_warns_and_submit_refuses(tmp_path, taken, what):
    """After `make demo`, `submit configs/tiny-cpu.yaml --dry-run` still shows the script (with a warning on
    stderr); the real submit refuses before it writes anything or looks for sbatch."""
    rd = tmp_path / "job"
    cmd = [RINGSCAN, "submit", "configs/tiny-cpu.yaml", "--set", f"run.out_dir={rd}"]
    fresh = run([*cmd, "--dry-run"], env={"PATH": "/nonexistent"})
    assert fresh.returncode == 0 and fresh.stderr == "", fresh.stderr
    rd.mkdir()
    (rd / taken).mkdir() if taken == "ckpt" else (rd / taken).write_text("from an earlier run\n")
    r = run([*cmd, "--dry-run"], env={"PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == fresh.stdout and r.stdout.startswith("#!/bin/bash\n")
    assert r.stderr.startswith(f'ringscan submit: warning: run.out_dir = "{rd}": {rd} already holds a {what} '
                               f"({taken} exists); the script is printed anyway, but a submit without --dry-run "
                               "refuses this directory\n  hint: "), r.stderr
    assert r.stderr.count("\n") == 2, r.stderr
    assert sorted(p.name for p in rd.iterdir()) == [taken]
    r = run(cmd, env={"PATH": "/nonexistent"})
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    assert f"ringscan submit: error: run.out_dir = \"{rd}\": {rd} already holds a {what} ({taken} exists); " \
           "nothing was written or submitted" in r.stderr, r.stderr
    assert sorted(p.name for p in rd.iterdir()) == [taken]


def test_dry_run_prints_the_script_and_writes_nothing(tmp_path):
    rd = tmp_path / "job"
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", "--set", f"run.out_dir={rd}", "--set", "slurm.nodes=2",
             "--set", "parallel.dp=4", "--set", "parallel.cp=1", "--set", "slurm.partition=debug,long",
             "--set", "slurm.launcher=mpirun", "--dry-run"], env={"PATH": "/nonexistent"})  # no sbatch needed
    assert r.returncode == 0, r.stderr
    s = r.stdout
    assert s.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --cpus-per-task=1",
                 "#SBATCH --partition=debug,long", "#SBATCH --time=00:10:00", "#SBATCH --signal=B:USR1@30",
                 "#SBATCH --requeue", f"#SBATCH --output={rd}/logs/slurm-%j.out", f"run_dir='{rd}'",
                 "launcher='mpirun'", "max_restarts=10"):
        assert line + "\n" in s, line
    assert "--account" not in s and "--qos" not in s and "--gpus-per-node" not in s  # empty: left out
    assert "{{" not in s and "}}" not in s
    assert not rd.exists()
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", "--set", f"run.out_dir={rd}", "--set", "slurm.signal_s=0",
             "--dry-run"])
    assert r.returncode == 0 and "#SBATCH --signal" not in r.stdout


def readme_example():
    """The command and the rendered script that slurm/README.md shows for 2 nodes x 4 GPUs, cp 8."""
    text = (ROOT / "slurm" / "README.md").read_text()
    m = re.search(r"<!-- example-command -->\n```sh\n(.*?)\n```.*?<!-- example-script -->\n```bash\n(.*?)```", text,
                  re.S)
    assert m, "slurm/README.md lost its marked example"
    return m.group(1), m.group(2)


def test_readme_gpu_example_is_what_submit_renders():
    command, script = readme_example()
    assert command.startswith("build/ringscan submit ")
    args = command.replace("\\\n", " ").split()[2:]
    r = run([RINGSCAN, "submit", *args], env={"PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    real = os.path.realpath(ROOT)
    rendered = r.stdout.replace(real, "/home/alice/ringscan")
    assert rendered == script, "slurm/README.md's example is stale: paste the --dry-run output again"
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4"):
        assert line + "\n" in script
