"""test_gpu_cluster.py — the parts of the two-node GPU test cluster (slurm/gpu-cluster/, issue 40) that need no
GPU: the cluster that start.sh starts, with two character devices standing in for the GPU files; install.sh on
packages made here; and bring.sh's packages, downloaded from Debian's archive and installed into a folder.

What is checked:
  - start.sh writes slurm.conf (the cpu test cluster's, with GresTypes=gpu, Gres=gpu:1 on n1 and n2 and the
    TaskProlog) and gres.conf (AutoDetect=off, each node's device file), starts munged, slurmctld and two
    slurmd, and both nodes come up idle with gpu:1; a job of one GPU per node sees CUDA_VISIBLE_DEVICES = each
    node's own device number (Slurm alone would give both nodes 0: the TaskProlog's reason), a job without
    GPUs sees none; Open MPI starts across the nodes under srun --mpi=pmix with slurm/gpu-cluster/site.env;
    stop.sh ends every daemon; start.sh refuses a missing GPU file and a socket path munged cannot reach;
  - tests/cuda/gpu_cluster_check.sh --site (a user's own cluster: nothing installed or started) on that cluster
    and the cpu backend, a small model: every step passes; the reference is a job on one node; rank 1 is found
    and killed through steps inside its job (srun --jobid --overlap); a missing SITE_ENV or RINGSCAN and an
    unknown partition are refused before any job;
  - install.sh adds what the machine lacks and nothing else (a library whose soname is there is left out, an
    existing file is never replaced), links the -wlm programs, creates the libpmix.so link Slurm opens,
    picks the package set whose PMIx matches the machine's, and refuses a PMIx of another major version;
  - bring.sh --packages-only: both releases' sets hold Slurm, munge and their PMIx, and not what the
    programs never load; installed into a folder, every library their ELF files name is in the folder or
    on this machine.
"""
import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT, run

START, STOP, INSTALL, BRING = (ROOT / "slurm" / "gpu-cluster" / f"{n}.sh" for n in ("start", "stop", "install", "bring"))
CHECK = ROOT / "tests" / "cuda" / "gpu_cluster_check.sh"
ENV = {"PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
# Open MPI through UCX over TCP on the loopback, exported where the jobs start (site.env's ${VAR:-default} lets
# them win): with ob1's own tcp transport under srun, a rank's first message can reach a peer still inside
# MPI_Init, which then crashes (slurm/test-cluster.env)
UCX_TCP = {"OMPI_MCA_pml": "ucx", "OMPI_MCA_pml_ucx_tls": "any", "OMPI_MCA_pml_ucx_devices": "any",
           "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}


def free_port_block(n):
    """A port p with p .. p+n free (slurmctld and the slurmd take consecutive ports)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + n < 65536 and all(free(p + i) for i in range(n + 1)):
            return p
    raise AssertionError("no block of free ports")


def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def fake_gpus(d, numbers):
    """Character devices named nvidiaN (Slurm takes only character or block devices as GPU files)."""
    d.mkdir(parents=True, exist_ok=True)
    files = []
    for n in numbers:
        f = d / f"nvidia{n}"
        try:
            os.mknod(f, 0o600 | 0o020000, os.makedev(1, 3))  # the device numbers of /dev/null
        except PermissionError as e:
            pytest.fail(f"mknod {f} failed ({e}): these tests run as root, as CI does")
        files.append(str(f))
    return files


def daemons(d):
    return [line.split() for line in (d / "pids").read_text().splitlines()]


def alive(name, pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name and \
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def gpu_cluster(request):
    # not under pytest's base directory (0700): munged wants every directory above its socket searchable
    base = Path(tempfile.mkdtemp(prefix="ringscan-gpucluster-"))
    base.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    gpus = fake_gpus(base / "dev", (0, 1))
    d = base / "c"
    pids = []

    def stop():
        r = run(["bash", STOP, d], env=ENV)
        assert r.returncode == 0, r.stdout + r.stderr
        left = [(n, p) for n, p in pids if alive(n, p)]
        assert not left, f"daemons still running after stop.sh: {left}"

    request.addfinalizer(stop)
    r = run(["bash", START, d, *gpus], env={**ENV, "PORT": str(free_port_block(2))}, timeout=120)
    if (d / "pids").exists():
        pids.extend((n, int(p)) for n, p in daemons(d))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "n1 idle 8 gpu:1" in r.stdout and "n2 idle 8 gpu:1" in r.stdout, r.stdout
    return d, gpus


def slurm(d, *args, timeout=120, **env):
    return run(list(args), env={**ENV, "SLURM_CONF": str(d / "slurm.conf"), "OMPI_ALLOW_RUN_AS_ROOT": "1",
                                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **env}, timeout=timeout)


def test_confs_name_one_gpu_per_node(gpu_cluster):
    d, gpus = gpu_cluster
    conf = (d / "slurm.conf").read_text()
    assert "GresTypes=gpu\n" in conf and f"TaskProlog={d}/task-prolog\n" in conf
    for i in (1, 2):
        assert re.search(rf"^NodeName=n{i} NodeHostname=localhost NodeAddr=127\.0\.0\.1 Port=\d+ CPUs=8 "
                         r"RealMemory=8000 Gres=gpu:1$", conf, re.M), conf
    assert f"AuthInfo=socket={d}/munge/munge.socket,cred_expire=10" in conf
    assert "@" not in re.sub(r"#.*", "", conf)  # every placeholder of test-cluster.conf.in filled in
    gres = (d / "gres.conf").read_text().splitlines()
    assert [x for x in gres if not x.startswith("#")] == \
        ["AutoDetect=off", f"NodeName=n1 Name=gpu File={gpus[0]}", f"NodeName=n2 Name=gpu File={gpus[1]}"]


def test_each_node_sees_its_own_gpu(gpu_cluster):
    d, _ = gpu_cluster
    show = "echo $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:-none}"
    r = slurm(d, "srun", "-N", "2", "--ntasks-per-node=1", "--gpus-per-node=1", "bash", "-c", show)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.split("\n")[:-1]) == ["n1 0", "n2 1"], r.stdout
    r = slurm(d, "srun", "-N", "2", "--ntasks-per-node=1", "bash", "-c", show)
    assert r.returncode == 0 and sorted(r.stdout.split("\n")[:-1]) == ["n1 none", "n2 none"], r.stdout + r.stderr
    # and the batch script of a GPU job (the first node's): its node's GPU too
    out = d / "batch.out"
    r = slurm(d, "sbatch", "--wait", "-N", "2", "--gpus-per-node=1", f"--output={out}", "--wrap", show)
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.read_text() == "n1 0\n"


def test_open_mpi_starts_across_the_nodes(gpu_cluster, tmp_path):
    d, _ = gpu_cluster
    hello = tmp_path / "mpi_hello"
    r = run(["mpicc", "-O2", "-o", hello, ROOT / "slurm" / "gpu-cluster" / "mpi_hello.c"])
    assert r.returncode == 0, r.stderr
    site = ROOT / "slurm" / "gpu-cluster" / "site.env"
    r = slurm(d, "bash", "-c", f". {site} && srun -N 2 --ntasks-per-node=1 --gpus-per-node=1 --mpi=pmix {hello}",
              **UCX_TCP)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(r.stdout.split("\n")[:-1])
    assert lines == ["mpi_hello: rank 0 of 2 on node n1, CUDA_VISIBLE_DEVICES 0, allreduce 2",
                     "mpi_hello: rank 1 of 2 on node n2, CUDA_VISIBLE_DEVICES 1, allreduce 2"], r.stdout + r.stderr


def test_start_refuses_what_cannot_work(tmp_path):
    tmp_path.chmod(0o755)
    gpus = fake_gpus(tmp_path / "dev", (0,))
    r = run(["bash", START, tmp_path / "c", gpus[0], tmp_path / "dev" / "nvidia7"], env=ENV)
    assert r.returncode == 1 and f"GPU file {tmp_path}/dev/nvidia7 does not exist" in r.stdout, r.stdout
    r = run(["bash", START, tmp_path / "c", gpus[0]], env=ENV)
    assert r.returncode == 1 and "2 nodes need 2 GPU files, got 1" in r.stdout, r.stdout
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    gpus = fake_gpus(tmp_path / "dev2", (0, 1))
    r = run(["bash", START, closed / "c", *gpus], env=ENV)
    assert r.returncode == 1 and f"chmod o+x {closed}" in r.stdout, r.stdout
    assert not (closed / "c" / "pids").exists()  # nothing started


# ---- gpu_cluster_check.sh --site ---------------------------------------------------------------------------------

# the check's smallest run here: 256 tokens (2 x cp x 64), a quarter of tiny-cpu's model; 30 steps
SMALL = ("--set data.seq_len=256 --set data.micro_batch=1 --set model.hidden_size=128 --set model.intermediate_size=256 "
         "--set model.num_attention_heads=2 --set model.num_key_value_heads=1 --set model.linear_num_key_heads=1 "
         "--set model.linear_num_value_heads=2")


def site_check(d, out, timeout=600, **env):
    site = {"SLURM_CONF": str(d / "slurm.conf"), "DEVICE": "cpu", "STEPS": "30", "PARTITION": "debug",
            "SITE_ENV": str(ROOT / "slurm" / "gpu-cluster" / "site.env"), "EXTRA_SETS": SMALL}
    return run(["bash", CHECK, "--site", out], env={**ENV, **UCX_TCP, **site, **env}, timeout=timeout)


def test_site_mode_on_the_cpu_cluster(gpu_cluster, tmp_path):
    d, _ = gpu_cluster
    r = site_check(d, tmp_path / "out")
    assert r.returncode == 0 and "== gpu_cluster_check: every step passed" in r.stdout, r.stdout + r.stderr
    for step in ("setup", "cluster", "launch", "one-node", "submit", "equivalence", "preempt", "kill"):
        assert re.search(rf"^PASS {step}: ", r.stdout, re.M), (step, r.stdout)
    assert not re.search(r"^FAIL", r.stdout, re.M), r.stdout
    assert re.search(r"^PASS cluster: SLURM_CONF \S+, partition debug: up, 2 nodes", r.stdout, re.M), r.stdout
    assert re.search(r"^PASS one-node: job \d+ on n1 \(one node, two GPUs\)", r.stdout, re.M), r.stdout
    assert "NodeList=n[1-2], 30 steps" in r.stdout, r.stdout
    assert re.search(r"^INFO kill: kill -9 of rank 1 \(pid \d+, node n2, by srun --jobid=\d+ --overlap -w n1,n2\)", r.stdout,
                     re.M), r.stdout
    work = list((tmp_path / "out").glob("work.*"))  # WORK_DIR's default: the runs beside the logs
    assert len(work) == 1 and {p.name for p in (work[0] / "runs").iterdir()} == {"one_node", "whole", "preempt", "kill"}


def test_site_mode_refuses_what_it_needs(gpu_cluster, tmp_path):
    d, _ = gpu_cluster
    r = site_check(d, tmp_path / "a", SITE_ENV="")
    assert r.returncode == 1 and "FAIL setup: SITE_ENV is not set" in r.stdout, r.stdout + r.stderr
    r = site_check(d, tmp_path / "b", SITE_ENV=str(tmp_path / "none.env"))
    assert r.returncode == 1 and f"FAIL setup: SITE_ENV {tmp_path}/none.env does not exist" in r.stdout, r.stdout
    r = site_check(d, tmp_path / "c", RINGSCAN=str(tmp_path / "ringscan"))
    assert r.returncode == 1 and f"FAIL setup: RINGSCAN {tmp_path}/ringscan does not exist" in r.stdout, r.stdout
    r = site_check(d, tmp_path / "d", PARTITION="gpu")
    assert r.returncode == 1 and "FAIL cluster: sinfo names no partition gpu (it lists: debug*)" in r.stdout, r.stdout
    r = site_check(d, tmp_path / "e", SLURM_CONF=str(tmp_path / "none.conf"))
    assert r.returncode == 1 and f"FAIL cluster: SLURM_CONF {tmp_path}/none.conf does not exist" in r.stdout, r.stdout
    assert "Submitted" not in r.stdout and not list(tmp_path.glob("*/work.*/runs"))  # no job in any of them


# ---- install.sh ------------------------------------------------------------------------------------------------


def make_deb(out, name, files, version="1.0"):
    """A .deb of `name` holding files {path: bytes or ('link', target)}."""
    src = out / f"src-{name}"
    (src / "DEBIAN").mkdir(parents=True)
    (src / "DEBIAN" / "control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
                                            f"Maintainer: t <t@t>\nDescription: test\n")
    for path, content in files.items():
        f = src / path
        f.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple):
            f.symlink_to(content[1])
        else:
            f.write_bytes(content)
            f.chmod(0o755)
    deb = out / f"{name}_{version}_amd64.deb"
    r = run(["dpkg-deb", "--root-owner-group", "-b", src, deb])
    assert r.returncode == 0, r.stderr
    shutil.rmtree(src)
    return deb


LIB = "usr/lib/x86_64-linux-gnu"


def pmix(major):
    return f"ELF... OpenPMIx {major}.2.1 (PMIx Standard: {major}.1)\0".encode()


@pytest.fixture
def bundle(tmp_path):
    """A bookworm set: a library the machine has (by soname), a daemon (-wlm), a file the machine has with other
    contents, and a PMIx 4."""
    debs = tmp_path / "bundle" / "debs" / "bookworm"
    debs.mkdir(parents=True)
    make_deb(debs, "libfoo1", {f"{LIB}/libfoo.so.1.2.3": b"new foo", f"{LIB}/libfoo.so.1": ("link", "libfoo.so.1.2.3")})
    make_deb(debs, "fakectld", {"usr/sbin/fakectld-wlm": b"#!/bin/sh\n", "etc/fake/keep.conf": b"the package's\n",
                                "etc/fake/new.conf": b"new\n"})
    make_deb(debs, "libpmix2", {f"{LIB}/pmix2/lib/libpmix.so.2.6.2": pmix(4),
                                f"{LIB}/pmix2/lib/libpmix.so.2": ("link", "libpmix.so.2.6.2")})
    root = tmp_path / "root"
    (root / LIB).mkdir(parents=True)
    (root / "usr" / "sbin").mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    (root / LIB / "libfoo.so.1").write_bytes(b"the machine's foo")
    (root / "etc" / "fake").mkdir(parents=True)
    (root / "etc" / "fake" / "keep.conf").write_text("the machine's\n")
    return tmp_path / "bundle", root


def install(bundle, root, tmp_path, **env):
    return run(["bash", INSTALL, bundle], env={"ROOT": str(root), "PREFIX": str(tmp_path / "prefix"), **env})


def test_install_adds_only_what_the_machine_lacks(bundle, tmp_path):
    b, root = bundle
    r = install(b, root, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PMIx at" in r.stdout and ": none" in r.stdout and "bookworm's Slurm" in r.stdout, r.stdout
    assert (root / LIB / "libfoo.so.1").read_bytes() == b"the machine's foo"  # its soname was there: left out
    assert not (root / LIB / "libfoo.so.1.2.3").exists()
    assert "libfoo1 (the machine's libfoo.so.1)" in r.stdout, r.stdout
    assert (root / "etc/fake/keep.conf").read_text() == "the machine's\n"  # never replaced
    assert (root / "etc/fake/new.conf").read_text() == "new\n"
    assert os.readlink(root / "usr/sbin/fakectld") == "fakectld-wlm"  # what update-alternatives would make
    assert os.readlink(root / LIB / "pmix2/lib/libpmix.so") == "libpmix.so.2"
    assert "will load PMIx 4.2.1" in r.stdout, r.stdout
    added = (tmp_path / "prefix" / "added.txt").read_text().splitlines()
    assert "fakectld /etc/fake/new.conf" in added and not any("keep.conf" in x for x in added)


def test_install_takes_the_set_of_the_machines_pmix(bundle, tmp_path):
    b, root = bundle
    (root / LIB / "pmix2" / "lib").mkdir(parents=True)
    (root / LIB / "pmix2" / "lib" / "libpmix.so.2").write_bytes(pmix(5))
    r = install(b, root, tmp_path)  # PMIx 5 there: trixie's set (which this bundle lacks; needs glibc 2.38)
    assert r.returncode == 1 and "PMIx at" in r.stdout and "5.2.1" in r.stdout, r.stdout
    assert f"{b}/debs/trixie is missing" in r.stdout or "trixie's Slurm needs glibc 2.38" in r.stdout, r.stdout
    r = install(b, root, tmp_path, RELEASE="bookworm")  # forced: Slurm 22.05 would refuse that PMIx 5
    assert r.returncode == 1 and "bookworm's Slurm loads PMIx 4 only" in r.stdout, r.stdout
    r = run(["bash", INSTALL, tmp_path / "nothing"], env={"ROOT": str(root), "PREFIX": str(tmp_path / "p2")})
    assert r.returncode == 1 and "bring.sh" in r.stdout, r.stdout


# ---- bring.sh (Debian's archive) ---------------------------------------------------------------------------------


def elf_needed(f):
    out = subprocess.run(["readelf", "-d", f], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def test_bring_downloads_what_slurm_loads_and_install_places_it(tmp_path):
    out = tmp_path / "bundle"
    r = run(["bash", BRING, "--packages-only", "--out", out], timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    have = {s: {p.name.split("_")[0] for p in (out / "debs" / s).glob("*.deb")} for s in ("bookworm", "trixie")}
    for s, pm in (("bookworm", "libpmix2"), ("trixie", "libpmix2t64")):
        assert {"slurmctld", "slurmd", "slurm-client", "slurm-wlm-basic-plugins", "munge", "libmunge2", pm} <= have[s]
        assert not have[s] & {"libhwloc-plugins", "systemd", "adduser", "ucf", "libx11-6", "libicu72"}, have[s]
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size < 24 << 20, size  # two sets beside a ~10 MiB ringscan, well inside the tool's 64 MiB
    m = re.search(r"a device call carries (\d+) KiB of its 65536", r.stdout)
    assert m, r.stdout
    # bookworm's set into an empty folder: the programs, the links, and every library they name is there or here
    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    r = run(["bash", INSTALL, out], env={"ROOT": str(root), "PREFIX": str(tmp_path / "prefix"), "RELEASE": "bookworm"})
    assert r.returncode == 0, r.stdout + r.stderr
    for f in ("usr/sbin/slurmctld", "usr/sbin/slurmd", "usr/sbin/slurmstepd", "usr/sbin/munged", "usr/bin/sbatch",
              "usr/bin/srun", f"{LIB}/slurm-wlm/mpi_pmix_v4.so", f"{LIB}/slurm-wlm/gres_gpu.so",
              f"{LIB}/pmix2/lib/libpmix.so"):
        assert (root / f).exists(), f
    here = set(re.findall(r"^\s+(\S+) \(", subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout,
                          re.M))
    names = {p.name for p in root.rglob("*")}
    for f in [*(root / "usr/sbin").iterdir(), *(root / LIB / "slurm-wlm").glob("*.so")]:
        if f.is_file() and not f.is_symlink() and f.read_bytes()[:4] == b"\x7fELF":
            missing = [n for n in elf_needed(f) if n not in names and n not in here and n != "libslurmfull.so"]
            assert not missing, (f, missing)
