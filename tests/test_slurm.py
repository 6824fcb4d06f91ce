"""test_slurm.py — `ringscan submit` against real Slurm clusters started here.

The module starts munged, slurmctld and slurmd on localhost in a private temp
directory (slurm/test-cluster.conf.in, recipe ../shared/slurm_local.md), with
their own ports, munge socket and SLURM_CONF, so nothing under /etc or /run is
touched: one cluster of one node, and for the two-node tests a second one whose
nodes n1 and n2 are two slurmd on this host. Every daemon is stopped by the PID it wrote, in a finalizer that runs
even when a test or the start-up fails. Missing Slurm binaries are a failure,
not a skip: CI installs them with `make deps`.

What is checked, each with a real job of configs/tiny-cpu.yaml made small:
  - a submitted run trains to the end, under both launchers (srun --mpi=pmix
    and mpirun inside the allocation), with the losses of a plain mpirun run;
  - the warning signal mid-run (`scancel --signal=USR1 --batch`, what
    --signal=B:USR1@N delivers): the ranks checkpoint, the job exits 75,
    requeues itself, resumes and finishes with losses bitwise equal to an
    uninterrupted run; slurm.max_restarts = 0 stops the loop (exit 75);
  - two nodes: a cp 4 job over n1 and n2 is stopped by the warning signal,
    then preempted (SIGTERM, SIGKILL 5 s later), resumes twice and ends with
    the losses of an uninterrupted two-node mpirun job and a plain run;
  - injection attempts in every string that reaches the job script are
    refused (exit 2, the key named, nothing written, nothing submitted);
  - --dry-run prints the script and writes nothing, and only warns about a
    run directory that a real submit refuses; slurm/README.md's GPU example
    is what the binary renders; a cuda job's script, run by bash with
    stand-in launchers, starts one rank per GPU under srun and under mpirun,
    with the site's NCCL/UCX settings; cuda refuses nodes x GPUs != dp x cp.
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
    """One slurmctld + one munged + a slurmd per node (8 CPUs each). One node is `localhost`; two are n1 and n2,
    two slurmd on this host (slurm_local.md §4), which Open MPI takes for two hosts."""

    def __init__(self, nodes=1):
        self.nodes = ["localhost"] if nodes == 1 else [f"n{i}" for i in range(1, nodes + 1)]
        self.dir = Path(tempfile.mkdtemp(prefix="ringscan-slurm-"))
        self.dir.chmod(0o755)  # munged wants every directory above its socket searchable
        self.conf = self.dir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), OMPI_ALLOW_RUN_AS_ROOT="1",
                        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        self.pids = []  # (daemon name, pid read from the pid file it wrote), in start order

    def _daemon(self, name, args, pid_file):
        r = subprocess.run([find_binary(name), *args], env=self.env, cwd=self.dir, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, f"{name} {args} did not start: {r.stdout}{r.stderr}\n{self.logs()}"
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text().strip():
                self.pids.append((name, int(pid_file.read_text().split()[0])))
                return
            time.sleep(0.05)
        raise AssertionError(f"{name} wrote no pid file {pid_file}\n{self.logs()}")

    def start(self):
        d = self.dir
        for sub in ("munge", "state", "log", *(f"{p}/{n}" for p in ("spool", "tmpfs") for n in self.nodes)):
            (d / sub).mkdir(parents=True)
        (d / "munge").chmod(0o755)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = d / "munge" / "munge.socket"
        self._daemon("munged", [f"--socket={sock}", f"--key-file={key}", f"--log-file={d}/log/munged.log",
                                f"--pid-file={d}/munge/munged.pid", f"--seed-file={d}/munge/munged.seed"],
                     d / "munge" / "munged.pid")
        host = "" if self.nodes == ["localhost"] else " NodeHostname=localhost"
        lines = [f"NodeName={n}{host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=8 RealMemory=8000"
                 for n in self.nodes]
        conf = (ROOT / "slurm" / "test-cluster.conf.in").read_text()
        for k, v in {"@NODES@": "\n".join(lines), "@DIR@": d, "@CTLD_PORT@": free_port(), "@MUNGE_SOCKET@": sock}.items():
            conf = conf.replace(k, str(v))
        self.conf.write_text(conf)
        self._daemon("slurmctld", [], d / "slurmctld.pid")
        for n in self.nodes:
            self._daemon("slurmd", [] if n == "localhost" else ["-N", n], d / f"slurmd-{n}.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            r = self.cmd("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            if r.returncode == 0 and sorted(r.stdout.split("\n")[:-1]) == [f"{n} idle" for n in self.nodes]:
                return
            time.sleep(0.3)
        raise AssertionError(f"the nodes never became idle: {r.stdout}{r.stderr}\n{self.logs()}")

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

    def _steps(self):
        """The cluster's job step daemons and tasks still running (not the daemons themselves)."""
        daemons = {pid for _, pid in self.pids}
        steps = []
        for pid in self._ours():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if pid not in daemons and not cmd.startswith(b"slurmctld"):
                steps.append(pid)
        return steps

    def stop(self):
        """Cancels every job, then stops the daemons by PID (slurmd, slurmctld, munged) and removes the dir."""
        try:
            if "slurmctld" in dict(self.pids):
                ids = self.jobs()
                if ids:
                    self.cmd("scancel", *ids, check=False)
                deadline = time.time() + 30
                while self.jobs() and time.time() < deadline:
                    time.sleep(0.5)
                # a job's step daemons (slurmstepd) and tasks may still be ending after it left the queue
                while self._steps() and time.time() < deadline + 30:
                    time.sleep(0.5)
        finally:
            for name, pid in reversed(self.pids):  # the slurmd first, munged last
                if not running(pid, name):
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
            alive = [n for n, pid in self.pids if running(pid, n)]
            if not os.environ.get("RINGSCAN_KEEP_SLURM"):
                shutil.rmtree(self.dir, ignore_errors=True)
            assert not alive, f"daemons still running after the stop: {alive}"
            assert not leftovers, f"processes of the cluster outlived its daemons (killed now): {leftovers}"

    def job_info(self, job):
        r = self.cmd("scontrol", "show", "job", "-o", job, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout)) if r.returncode == 0 else {}

    def wait_steps(self, job, run_dir, steps, restart=0, timeout=120):
        """Waits until run `restart` of the job has started and metrics.jsonl holds `steps` steps."""
        deadline = time.time() + timeout
        metrics, log = run_dir / "metrics.jsonl", run_dir / "logs" / f"job-{job}.{restart}.log"
        while time.time() < deadline:
            if log.exists() and metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
                return
            assert self.job_info(job).get("JobState") not in TERMINAL, job_logs(run_dir)
            time.sleep(0.2)
        raise AssertionError(f"run {restart} of job {job}: fewer than {steps} steps after {timeout} s\n"
                             f"{job_logs(run_dir)}\n{self.logs()}")

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


def start_cluster(request, nodes):
    missing = [b for b in DAEMONS + CLIENTS if not find_binary(b)]
    if missing:
        pytest.fail(f"Slurm is not installed (missing {', '.join(missing)}): `make deps` installs slurm-wlm and munge")
    c = Cluster(nodes)
    request.addfinalizer(c.stop)
    c.start()
    return c


@pytest.fixture(scope="module")
def cluster(request):
    return start_cluster(request, 1)


@pytest.fixture(scope="module")
def cluster2(request):
    """Two nodes, n1 and n2, on this host; started only for the tests that ask for it."""
    return start_cluster(request, 2)


@pytest.fixture(scope="module")
def data(recall_tok):
    return recall_tok  # conftest.py: 300k tokens of the recall task, seed 7, made once per session


def run_sets(run_dir, data, steps, *extra):
    return [*SMALL, "--set", f"data.path={data}", "--set", f"run.out_dir={run_dir}", "--set", f"train.steps={steps}",
            *extra]


def submit(cluster, run_dir, data, steps, *extra):
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", *run_sets(run_dir, data, steps, *extra)], env=cluster.env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.fullmatch(r"\d+\n", r.stdout), r.stdout  # the job id alone
    return r.stdout.strip()


def reference(run_dir, data, steps, *extra, world=WORLD):
    """The same run with plain mpirun on this host, outside Slurm (started in the background)."""
    args = ["mpirun", "-np", str(world), "--oversubscribe", RINGSCAN, "train", "configs/tiny-cpu.yaml",
            *run_sets(run_dir, data, steps, *extra)]
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
    cluster.wait_steps(job, rd, 2)  # signal once training is under way (the handlers are up from the start)
    cluster.cmd("scancel", "--signal=USR1", "--batch", job)  # what --signal=B:USR1@N delivers to the batch shell
    info = cluster.wait(job, rd, timeout=300)
    finish(ref)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, job_logs(rd))
    assert info["Restarts"] == "1", info

    first, second = job_log(rd, job, 0), job_log(rd, job, 1)
    assert "SIGUSR1: the ranks checkpoint" in first, first
    m = re.search(r"stopped by signal 10 \([^)]*\) after step (\d+), checkpoint written; exit 75", first)
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
    cluster.wait_steps(job, rd, 1)
    cluster.cmd("scancel", "--signal=USR1", "--batch", job)
    info = cluster.wait(job, rd)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "75:0", (info, job_logs(rd))
    assert info["Restarts"] == "0", info
    log = job_log(rd, job, 0)
    assert "not requeueing: 0 restarts, slurm.max_restarts = 0" in log, log
    assert (rd / "ckpt" / "LATEST").exists()


def test_mpirun_job_sigterm_checkpoints_requeues_and_resumes_exactly(cluster, data, tmp_path):
    """SIGTERM to every process of an mpirun job (`scancel --signal=TERM --full`: what a preemption sends before
    its SIGKILL): the ranks get it from Slurm, mpirun gets it too and starts its own stop sequence (issue 35: with
    Open MPI's 1 s SIGKILL grace the ranks died mid-step; and mpirun then exits 1, whatever the ranks return).
    The ranks checkpoint and exit 75, the script reads their status from log.txt, requeues, and the resume ends
    with the losses of an uninterrupted run."""
    steps = 24
    ref = reference(tmp_path / "ref", data, steps)
    rd = tmp_path / "job"
    job = submit(cluster, rd, data, steps, "--set", "slurm.launcher=mpirun")
    cluster.wait_steps(job, rd, 2)
    cluster.cmd("scancel", "--signal=TERM", "--full", job)
    info = cluster.wait(job, rd, timeout=300)
    finish(ref)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, job_logs(rd))
    assert info["Restarts"] == "1", info
    first, second = job_log(rd, job, 0), job_log(rd, job, 1)
    assert "SIGTERM: the ranks checkpoint" in first, first
    # (what the ranks print after mpirun got its SIGTERM does not reach the job log: log.txt has it)
    # (SIGUSR1 from the script, or Slurm's SIGTERM through the ranks' relays in mpirun's process group)
    m = re.search(r"stopped by signal (?:10|15) \([^)]*\) after step (\d+), checkpoint written; exit 75",
                  (rd / "log.txt").read_text())
    assert m and 2 <= int(m.group(1)) < steps, first
    assert "mpirun exited with 1 after the stop signal; the ranks' status (log.txt): 75" in first, first
    assert "ringscan train exited with 75" in first and f"requeueing job {job}" in first, first
    assert f"resumed from {rd}/ckpt/step_{int(m.group(1)):08d}" in second, second
    assert not [p for p in rd.rglob("*") if ".tmp" in p.name]
    assert losses(rd) == losses(tmp_path / "ref")


# ---- two nodes ---------------------------------------------------------------------------------------------------

# cp 4 on 2 nodes x 2 tasks: ranks 0-1 on n1, 2-3 on n2, so the ring crosses between the nodes twice per round
TWO_NODES = ["--set", "slurm.nodes=2", "--set", "parallel.cp=4", "--set", "data.seq_len=512",
             "--set", "slurm.site_env=slurm/test-cluster.env"]


def test_two_node_job_is_preempted_twice_and_resumes_exactly(cluster2, data, tmp_path):
    """One job (srun) is stopped by the warning signal, then preempted (`scontrol requeue`: SIGTERM to the batch
    shell and every rank, SIGKILL KillWait = 30 s later); each time the ranks checkpoint and the job requeues and
    resumes. Its losses equal, bitwise, those of an uninterrupted two-node job (mpirun, running beside it) and of
    a plain mpirun run on this host."""
    steps = 24
    ref = reference(tmp_path / "ref", data, steps, *TWO_NODES, world=4)
    rd, whole = tmp_path / "job", tmp_path / "whole"
    job = submit(cluster2, rd, data, steps, *TWO_NODES)
    job_whole = submit(cluster2, whole, data, steps, *TWO_NODES, "--set", "slurm.launcher=mpirun")

    cluster2.wait_steps(job, rd, 2)
    cluster2.cmd("scancel", "--signal=USR1", "--batch", job)  # the warning signal
    cluster2.wait_steps(job, rd, 1, restart=1)
    stop1 = re.search(r"stopped by signal 10 \([^)]*\) after step (\d+), checkpoint written; exit 75", job_log(rd, job, 0))
    assert stop1, job_logs(rd)
    cluster2.wait_steps(job, rd, int(stop1.group(1)) + 2, restart=1)
    cluster2.cmd("scontrol", "requeue", job)  # preemption
    info = cluster2.wait(job, rd, timeout=300)
    info_whole = cluster2.wait(job_whole, whole)
    finish(ref)

    for i, d in ((info, rd), (info_whole, whole)):
        assert i["JobState"] == "COMPLETED" and i["ExitCode"] == "0:0", (i, job_logs(d))
        assert i["NodeList"] == "n[1-2]" and i["NumTasks"] == "4", i
    assert info["Restarts"] == "2" and info_whole["Restarts"] == "0", (info, info_whole)
    logs = [job_log(rd, job, r) for r in range(3)]
    for log in logs + [job_log(whole, job_whole, 0)]:
        assert "on n[1-2], 4 tasks (2(x2) per node)" in log, log
        assert "env: OMPI_MCA_btl=self,tcp" in log and "env: OMPI_MCA_pml=ucx" in log, log  # slurm.site_env
        assert "world 4 = dp 1 x cp 4" in log, log
    # SIGTERM comes to the ranks from Slurm and SIGUSR1 from the batch shell: the first one stops them
    stop2 = re.search(r"stopped by signal (?:10|15) \([^)]*\) after step (\d+), checkpoint written; exit 75", logs[1])
    assert "SIGUSR1: the ranks checkpoint" in logs[0] and "ringscan train exited with 75" in logs[0], logs[0]
    assert "SIGTERM: the ranks checkpoint" in logs[1] and stop2, logs[1]
    k1, k2 = int(stop1.group(1)), int(stop2.group(1))
    assert 2 <= k1 < k2 < steps, (k1, k2)
    assert f"resumed from {rd}/ckpt/step_{k1:08d}" in logs[1], logs[1]
    assert f"resumed from {rd}/ckpt/step_{k2:08d}" in logs[2] and "ringscan resume exited with 0" in logs[2], logs[2]
    # every run of both jobs started ranks on n2 too (srun: the ranks' step; mpirun: its daemon's step)
    n2 = (cluster2.dir / "log" / "slurmd-n2.log").read_text()
    for j, runs in ((job, 3), (job_whole, 1)):
        assert len(re.findall(rf"launch task StepId={j}\.0 ", n2)) == runs, n2

    assert len(losses(rd)) == steps
    assert losses(rd) == losses(whole) == losses(tmp_path / "ref")


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


def test_paths_derived_at_submit_are_checked_too(cluster, data, tmp_path):
    """A relative run.out_dir under a working directory with a space: the absolute path is refused."""
    odd = tmp_path / "my runs"
    odd.mkdir()
    before = cluster.jobs()
    r = run([RINGSCAN, "submit", ROOT / "configs" / "tiny-cpu.yaml", "--set", f"data.path={data}",
             "--set", "run.out_dir=job"], cwd=odd, env=cluster.env)
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
def test_dry_run_on_a_used_run_directory_warns_and_submit_refuses(tmp_path, data, taken, what):
    """After `make demo`, `submit configs/tiny-cpu.yaml --dry-run` still shows the script (with a warning on
    stderr); the real submit refuses before it writes anything or looks for sbatch. (The data file is given:
    a real submit refuses a missing one first, and a fresh clone has no runs/data before `make demo`.)"""
    rd = tmp_path / "job"
    cmd = [RINGSCAN, "submit", "configs/tiny-cpu.yaml", "--set", f"data.path={data}", "--set", f"run.out_dir={rd}"]
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
    for option in ("--account", "--qos", "--gpus-per-node"):
        assert f"#SBATCH {option}" not in s, option  # empty: left out
    assert "{{" not in s and "}}" not in s
    assert not rd.exists()
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", "--set", f"run.out_dir={rd}", "--set", "slurm.signal_s=0",
             "--dry-run"])
    assert r.returncode == 0 and "#SBATCH --signal" not in r.stdout


GPU_JOB = ["configs/hybrid-1b-1m-h200x4.yaml", "--set", "parallel.cp=8", "--set", "slurm.nodes=2",
           "--set", "slurm.gpus_per_node=4"]  # device.kind: cuda, 2 nodes x 4 GPUs


def site_env_uncommented(path):
    """slurm/site.env with every NCCL and UCX example line switched on, as a site would."""
    text = (ROOT / "slurm" / "site.env").read_text()
    lines = re.findall(r"^# (export (?:NCCL|UCX)_\w+=.*)$", text, re.M)
    assert len(lines) >= 8, text
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_gpu_job_script_starts_one_rank_per_gpu(tmp_path, launcher):
    """The rendered cuda script, run by bash with stand-ins for srun/mpirun that record how they were called:
    4 tasks and 4 GPUs per node in the #SBATCH lines, the launch line with 4 ranks per node, and the site's
    NCCL/UCX settings (defaults that the submitter's environment overrides) in the ranks' environment."""
    rd, bin_dir, record = tmp_path / "job", tmp_path / "bin", tmp_path / "calls.txt"
    site = site_env_uncommented(tmp_path / "site.env")
    r = run([RINGSCAN, "submit", *GPU_JOB, "--set", f"run.out_dir={rd}", "--set", f"slurm.launcher={launcher}",
             "--set", f"slurm.site_env={site}", "--dry-run"], env={"PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    script = r.stdout
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "tasks_per_node=4", f"launcher='{launcher}'", f"site_env='{site}'"):
        assert line + "\n" in script, line
    assert "--cpus-per-task" not in script and "--gpus-per-task" not in script  # every rank sees its node's GPUs
    assert not rd.exists()

    bin_dir.mkdir()
    for name in ("srun", "mpirun", "scontrol"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {record}\nenv | sort >> {record}\n')
        (bin_dir / name).chmod(0o755)
    (rd / "logs").mkdir(parents=True)
    slurm_env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "g[1-2]", "SLURM_NTASKS": "8",
                 "SLURM_TASKS_PER_NODE": "4(x2)"}
    r = subprocess.run(["bash", "-c", script], env={"PATH": f"{bin_dir}:/usr/bin:/bin", **slurm_env,
                                                    "NCCL_SOCKET_IFNAME": "eth9"},
                       capture_output=True, text=True, timeout=60)
    log = job_log(rd, 77, 0)
    assert r.returncode == 0, r.stdout + r.stderr + log
    calls = record.read_text()
    want = {"srun": f"srun --mpi=pmix --ntasks-per-node=4 {RINGSCAN} train {rd}/config.submitted.yaml",
            "mpirun": f"mpirun --mca odls_base_sigkill_timeout 30 --map-by ppr:4:node {RINGSCAN} train {rd}/config.submitted.yaml"}[launcher]
    assert calls.splitlines()[0] == want, calls
    for var in ("NCCL_SOCKET_IFNAME=eth9", "NCCL_NVLS_ENABLE=0", "NCCL_IB_HCA=mlx5_0,mlx5_1", "UCX_TLS=rc,sm,self"):
        assert var + "\n" in calls, var  # the ranks' environment
        assert f"  env: {var}\n" in log, log  # and the job log
    assert "on g[1-2], 8 tasks (4(x2) per node)" in log and "ringscan train exited with 0" in log, log
    assert "scontrol" not in calls


def test_gpu_job_needs_one_rank_per_gpu(tmp_path):
    rd = tmp_path / "job"
    r = run([RINGSCAN, "submit", *GPU_JOB, "--set", f"run.out_dir={rd}", "--set", "parallel.cp=4", "--dry-run"])
    assert r.returncode == 2 and r.stdout == "" and not rd.exists(), r.stdout + r.stderr
    assert re.search(r"slurm\.nodes = 2 .* x slurm\.gpus_per_node = 4 .* = 8 GPUs, but parallel\.dp = 1 .* x "
                     r"parallel\.cp = 4 .* = 4 ranks: device\.kind = cuda runs one rank per GPU", r.stderr), r.stderr
    r = run([RINGSCAN, "submit", *GPU_JOB, "--set", f"run.out_dir={rd}", "--set", "slurm.gpus_per_node=0",
             "--set", "slurm.nodes=3", "--dry-run"])
    assert r.returncode == 2 and "do not split evenly over slurm.nodes = 3" in r.stderr, r.stderr
    assert "(GPUs per node, one rank each)" in r.stderr and not rd.exists(), r.stderr


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


def test_submit_refuses_missing_data(tmp_path):
    """An empty data.path was accepted (the job died at start, after its wait in the queue); a path that
    does not exist is refused by a real submit (before sbatch), and an empty one by --dry-run too."""
    rd = tmp_path / "job"
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", "--set", f"run.out_dir={rd}", "--set", "data.path=",
             "--dry-run"], env={"PATH": "/nonexistent"})
    assert r.returncode == 2 and "data.path is empty" in r.stderr and r.stdout == "", r.stderr
    r = run([RINGSCAN, "submit", "configs/tiny-cpu.yaml", "--set", f"run.out_dir={rd}", "--set",
             f"data.path={tmp_path}/none.tok"], env={"PATH": "/nonexistent"})
    assert r.returncode == 2 and f"{tmp_path}/none.tok is not a file here" in r.stderr, r.stderr
    assert "sbatch is not on PATH" not in r.stderr and not rd.exists()


def rank_pid(run_dir, rank):
    """The pid of rank `rank` of the job training in run_dir (its task's SLURM_PROCID; the rank itself, not a
    child of it: a rank's signal relay has the same command line)."""
    ours = {}
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if f"train {run_dir}/config.submitted.yaml".encode() in (p / "cmdline").read_bytes().replace(b"\0", b" "):
                ours[int(p.name)] = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
    for pid, env in ours.items():
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if f"SLURM_PROCID={rank}".encode() in env and ppid not in ours:
            return pid
    raise AssertionError(f"rank {rank} of {run_dir} not found among {sorted(ours)}")


def test_two_node_job_whose_rank_is_killed_requeues_and_resumes_exactly(cluster2, data, tmp_path):
    """kill -9 of the rank on n2 (a dead node's rank; cp 2, one task per node, as the GPU cluster's job): the
    other rank's watchdog names it and ends the run with exit 76, the job script reads the watchdog's verdict
    in log.txt (srun may report the killed task's 137), requeues the job, and the next run resumes from the
    last checkpoint: the losses equal, bitwise, those of an uninterrupted plain mpirun run (issue 40). (With
    other ranks on the dead rank's node, Slurm's PMIx plugin aborts the whole step at once, 137: no watchdog,
    no requeue.)"""
    steps = 24
    sets = [*TWO_NODES, "--set", "parallel.cp=2", "--set", "checkpoint.every=4", "--set", "parallel.comm_timeout_s=5"]
    ref = reference(tmp_path / "ref", data, steps, *sets, world=2)
    rd = tmp_path / "job"
    job = submit(cluster2, rd, data, steps, *sets)
    deadline = time.time() + 180
    while not (rd / "ckpt" / "LATEST").exists() or len(losses(rd)) < 6:
        assert time.time() < deadline and cluster2.job_info(job).get("JobState") not in TERMINAL, job_logs(rd)
        time.sleep(0.2)
    victim = rank_pid(rd, 1)
    assert b"SLURMD_NODENAME=n2" in Path(f"/proc/{victim}/environ").read_bytes().split(b"\0")
    killed_after = len(losses(rd))
    os.kill(victim, signal.SIGKILL)
    info = cluster2.wait(job, rd, timeout=300)
    finish(ref)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, job_logs(rd))
    assert info["Restarts"] == "1", info
    first, second = job_log(rd, job, 0), job_log(rd, job, 1)
    assert "the ranks' watchdog ended the run (log.txt: exit 76)" in first, first
    assert "ringscan train exited with 76" in first and f"requeueing job {job}" in first, first
    (report,) = [p.read_text() for p in (rd / ".watchdog").glob("*/report.txt")]
    assert re.search(r"rank 1( \([^)]*\))?: no report \(dead", report), report
    m = re.search(rf"resumed from {rd}/ckpt/step_(\d+)", second)
    assert m and 4 <= int(m.group(1)) <= killed_after, (killed_after, second)
    assert "ringscan resume exited with 0" in second, second
    assert len(losses(rd)) == steps
    assert losses(rd) == losses(tmp_path / "ref")


def test_two_node_job_whose_rank_is_lost_in_its_start_up_ends_instead_of_hanging(cluster2, data, tmp_path):
    """Rank 1 (on n2) stops before MPI_Init (debug.stall_step = 0) and is then killed: rank 0 waits inside
    MPI_Init, where no watchdog runs yet, until its start-up guard (parallel.startup_timeout_s) ends it with 76
    and says so on its stderr. srun reports the killed task (137); the job script finds the verdict in the job
    log (the run never opened log.txt), takes it as 76 and, with slurm.max_restarts = 0, stops there: the job
    ends instead of waiting for its time limit."""
    sets = [*TWO_NODES, "--set", "parallel.cp=2", "--set", "debug.stall_rank=1", "--set", "debug.stall_step=0",
            "--set", "parallel.startup_timeout_s=8", "--set", "slurm.max_restarts=0"]
    rd = tmp_path / "job"
    t0 = time.time()
    job = submit(cluster2, rd, data, 6, *sets)
    deadline = time.time() + 60
    while True:
        try:
            victim = rank_pid(rd, 1)
            break
        except AssertionError:
            assert time.time() < deadline and cluster2.job_info(job).get("JobState") not in TERMINAL, job_logs(rd)
            time.sleep(0.2)
    assert b"SLURMD_NODENAME=n2" in Path(f"/proc/{victim}/environ").read_bytes().split(b"\0")
    os.kill(victim, signal.SIGKILL)
    info = cluster2.wait(job, rd, timeout=120)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "76:0", (info, job_logs(rd))
    assert time.time() - t0 < 100
    log = job_log(rd, job, 0)
    assert re.search(r"error \[rank 0@\S+\] \S+: the start-up did not finish within parallel.startup_timeout_s = 8 s: "
                     r"this rank is still in MPI_Init; every rank ends with exit 76", log), log
    assert "srun exited with 137; the ranks' start-up guard ended the run (this log: exit 76)" in log, log
    assert "ringscan train exited with 76" in log and "not requeueing: 0 restarts" in log, log
    assert not (rd / "log.txt").exists()  # rank 0 never got past MPI_Init
