"""test_kda_fla_check.py — the cpu part of the KDA parity against FLA's chunk_kda (tests/parity/kda_fla_check.py and
build/kda_case; issue 39). The GPU machine runs the script with FLA and the cuda kernels; here, without FLA or a GPU:

1. The script with --impl none --device cpu --cases small: the cases written, build/kda_case on the cpu oracle, the
   float64 token-by-token reference; ours within the bound on one document and on five, and the broken case (g's
   heads swapped) fails as it must.
2. The same with a kda_case whose dbeta of one head is 10% off (a wrapper around the real binary): the script
   says FAIL and exits 1.
3. build/kda_case on bad input exits 2 naming the file and the tensor or key, and writes nothing: a missing
   tensor, a wrong dtype or shape, cu_seqlens not [0, ..., T] increasing, dims the cuda kernels do not take, an
   unknown device or argument; the script's own argument checks (no kda_case binary, --impl fla without a GPU).
"""
import sys

import numpy as np
import pytest

from conftest import BUILD, ROOT, run

sys.path.insert(0, str(ROOT / "tests" / "parity"))
import safetensors_io as st  # noqa: E402

SCRIPT = ROOT / "tests/parity/kda_fla_check.py"
KDA_CASE = BUILD / "kda_case"


@pytest.fixture(scope="module")
def kda_case():
    if not KDA_CASE.exists():
        pytest.fail(f"{KDA_CASE} is missing: run `make`")
    return KDA_CASE


def test_script_passes_on_the_cpu_oracle(kda_case, tmp_path):
    pytest.importorskip("torch")
    r = run(["/usr/bin/python3", SCRIPT, tmp_path, "--impl", "none", "--device", "cpu", "--cases", "small"], timeout=600)
    assert r.returncode == 0 and "kda_fla_check: PASS (3 checks, 0 failed)" in r.stdout, r.stdout + r.stderr
    for case in ("T333_H2_K32_docs1", "T333_H2_K32_docs5"):
        assert f"PASS  {case} ours (ours within the bound)" in r.stdout, r.stdout
    assert "PASS  T333_H2_K32_docs5 broken (g heads 0, 1 swapped: must fail)" in r.stdout, r.stdout
    got = st.load(tmp_path / "case-T333_H2_K32_docs5" / "outputs.safetensors")
    assert sorted(got) == sorted(["o", "dq", "dk", "dv", "dg", "dbeta"])
    assert got["dg"].shape == (333, 2, 32) and got["dbeta"].shape == (333, 2)
    assert all(np.all(np.isfinite(a)) and np.any(a != 0) for a in got.values())


def test_script_fails_on_a_wrong_gradient(kda_case, tmp_path):
    """A kda_case whose dbeta of head 0 is 10% off: the comparison must say FAIL (exit 1)."""
    pytest.importorskip("torch")
    wrapper = tmp_path / "bad_kda_case.py"
    wrapper.write_text(f"""import subprocess, sys
sys.path.insert(0, {str(ROOT / 'tests/parity')!r})
import safetensors_io as st
r = subprocess.run([{str(kda_case)!r}] + sys.argv[1:])
if r.returncode:
    sys.exit(r.returncode)
p = sys.argv[1] + "/outputs.safetensors"
t = st.load(p)
t["dbeta"][:, 0] *= 1.1
st.save(p, t)
""")
    wrapper.chmod(0o755)
    shim = tmp_path / "kda_case"
    shim.write_text(f"#!/bin/sh\nexec /usr/bin/python3 {wrapper} \"$@\"\n")
    shim.chmod(0o755)
    r = run(["/usr/bin/python3", SCRIPT, tmp_path / "w", "--impl", "none", "--device", "cpu", "--cases", "small",
             "--kda-case", shim], timeout=600)
    assert r.returncode == 1 and "kda_fla_check: FAIL" in r.stdout, r.stdout + r.stderr
    assert "FAIL  T333_H2_K32_docs1 ours (ours within the bound)" in r.stdout, r.stdout


def test_script_argument_checks(tmp_path):
    r = run(["/usr/bin/python3", SCRIPT, tmp_path, "--kda-case", tmp_path / "nothing"])
    assert r.returncode == 2 and "--kda-case" in r.stderr and "no such file" in r.stderr, r.stderr
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: --impl fla would run")
    r = run(["/usr/bin/python3", SCRIPT, tmp_path, "--impl", "fla", "--device", "cpu"])
    assert r.returncode == 2 and "--impl fla needs a GPU" in r.stderr, r.stderr


def write_inputs(d, T=70, H=2, K=32, V=32, cu=(0, 70), drop=None, **over):
    rng = np.random.default_rng(0)
    t = {"q": rng.uniform(-1, 1, (T, H, K)), "k": rng.uniform(-1, 1, (T, H, K)), "v": rng.uniform(-1, 1, (T, H, V)),
         "dout": rng.uniform(-1, 1, (T, H, V)), "g": rng.uniform(-1, -0.01, (T, H, K)),
         "beta": rng.uniform(0.05, 0.95, (T, H))}
    t = {n: a.astype(np.float32) for n, a in t.items()}
    t["cu_seqlens"] = np.asarray(cu, np.int32)
    t.update(over)
    if drop:
        del t[drop]
    d.mkdir(parents=True, exist_ok=True)
    st.save(d / "inputs.safetensors", t)
    return d


def test_kda_case_runs_and_keeps_agree(kda_case, tmp_path):
    """The cpu oracle through every kept mode gives the same bits (backend.h: the kept buffer changes nothing)."""
    d = write_inputs(tmp_path / "c", cu=(0, 1, 30, 64, 70))
    outs = {}
    for keep in ("none", "wy", "states"):
        r = run([kda_case, d, "--device", "cpu", "--keep", keep, "--out", d / f"{keep}.safetensors"])
        assert r.returncode == 0 and "4 documents" in r.stdout and f"gdn_keep {keep}" in r.stdout, r.stdout + r.stderr
        outs[keep] = st.load(d / f"{keep}.safetensors")
    for n in outs["none"]:
        assert np.array_equal(outs["none"][n], outs["wy"][n]) and np.array_equal(outs["none"][n], outs["states"][n]), n


@pytest.mark.parametrize("bad, want", [
    (dict(drop="g"), "no tensor 'g'"),
    (dict(beta=np.zeros((70, 3), np.float32)), "beta"),
    (dict(g=np.zeros((70, 2, 32), np.float64)), "tensor 'g' is F64 with 3 dims, expected F32 with 3"),
    (dict(cu=(0, 30)), "cu_seqlens runs from 0 to 30, expected 0 to T = 70"),
    (dict(cu=(0, 30, 30, 70)), "cu_seqlens[2] = 30 after 30: expected increasing boundaries"),
    (dict(cu_seqlens=np.asarray([0, 70], np.int64)), "tensor 'cu_seqlens' is I64 with 1 dims, expected I32 with 1"),
    (dict(v=np.zeros((70, 3, 32), np.float32)), "expected (T, H, K) and (T, H, V)"),
])
def test_kda_case_refuses_bad_input(kda_case, tmp_path, bad, want):
    d = write_inputs(tmp_path / "c", **bad)
    r = run([kda_case, d, "--device", "cpu"])
    assert r.returncode == 2 and want in r.stderr and "inputs.safetensors" in r.stderr, r.stderr
    assert not (d / "outputs.safetensors").exists()


def test_kda_case_refuses_bad_arguments(kda_case, tmp_path):
    d = write_inputs(tmp_path / "c")
    r = run([kda_case, d, "--device", "cuda"])  # K = 32: refused before any device is opened
    assert r.returncode == 2 and "K = 32, V = 32: the cuda KDA kernels take K = V = 64 or 128" in r.stderr, r.stderr
    r = run([kda_case, d, "--device", "tpu"])
    assert r.returncode == 2 and "device.kind" in r.stderr, r.stderr
    r = run([kda_case, d, "--keep", "all"])
    assert r.returncode == 2 and "checkpoint.gdn_keep" in r.stderr, r.stderr
    r = run([kda_case, d, "--frobnicate", "1"])
    assert r.returncode == 2 and "unknown argument --frobnicate" in r.stderr, r.stderr
    r = run([kda_case, tmp_path / "none"])
    assert r.returncode == 2 and "inputs.safetensors" in r.stderr, r.stderr
    assert not (d / "outputs.safetensors").exists()
