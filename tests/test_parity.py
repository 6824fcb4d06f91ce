"""test_parity.py — the whole model against an independent PyTorch reference.

For each case, tests/parity/make_case.py writes random (non-trivial) weights, a
packed batch with many documents (1-token documents, documents shorter and
longer than a 64-token chunk, starts mid-chunk, samples starting inside a
document) and the float64 PyTorch loss and gradients; build/parity_step runs
one forward/backward of the C model on the cpu backend; compare.py requires
every parameter gradient within 1e-4 relative L2 and the loss within 1e-5.
The three checkpoint policies must give bitwise the same gradients (they run
the same kernels on the same inputs; only what is kept differs), and remat
must run attention once per sample per layer while full runs it twice.
"""
import numpy as np
import pytest

from conftest import BUILD, ROOT, run
import sys

sys.path.insert(0, str(ROOT / "tests" / "parity"))
import safetensors_io  # noqa: E402

CASES = {
    "tiny": ("configs/tiny-cpu.yaml", []),
    # tied head, explicit layer pattern with two attention layers, MHA and a single GDN key head
    "tied-mixed": ("configs/tiny-cpu.yaml", ["--set", "model.tie_word_embeddings=true",
                                              "--set", "model.layer_types=[full_attention, linear_attention, "
                                                       "linear_attention, full_attention]",
                                              "--set", "model.num_key_value_heads=4",
                                              "--set", "model.linear_num_key_heads=1"]),
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory, ringscan):
    out = {}
    for name, (cfg, sets) in CASES.items():
        d = tmp_path_factory.mktemp(name)
        r = run(["/usr/bin/python3", ROOT / "tests/parity/make_case.py", cfg, d, *sets], timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        out[name] = d
    return out


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("policy", ["none", "full", "remat"])
def test_parity_against_pytorch(cases, case, policy):
    d = cases[case]
    r = run([BUILD / "parity_step", d, "--policy", policy])
    assert r.returncode == 0, r.stderr
    (d / f"grads-{policy}.safetensors").write_bytes((d / "grads.safetensors").read_bytes())
    c = run(["/usr/bin/python3", ROOT / "tests/parity/compare.py", d / "ref.safetensors", d / "grads.safetensors"])
    print(c.stdout)
    assert c.returncode == 0, c.stdout + c.stderr
    calls = int(r.stdout.split("attention forward calls ")[1].split(",")[0])
    recomputes = int(r.stdout.split("block recomputes ")[1].split()[0])
    full_layers = 2 if case == "tied-mixed" else 1
    samples = 2
    expect_calls = {"none": 1, "full": 2, "remat": 1}[policy] * full_layers * samples
    assert calls == expect_calls, r.stdout
    assert recomputes == (0 if policy == "none" else 4), r.stdout


@pytest.mark.parametrize("case", list(CASES))
def test_policies_give_identical_gradients(cases, case):
    d = cases[case]
    grads = {}
    for policy in ("none", "full", "remat"):
        r = run([BUILD / "parity_step", d, "--policy", policy])
        assert r.returncode == 0, r.stderr
        grads[policy] = safetensors_io.load(d / "grads.safetensors")
    for policy in ("full", "remat"):
        for name, ref in grads["none"].items():
            got = grads[policy][name]
            assert np.array_equal(np.asarray(got), np.asarray(ref)), (policy, name)


def test_emulated_bf16_rounds_every_layer_weight(cases, tmp_path):
    """--emulate-bf16 (model_check's allowance) must read every weight as bf16 but A_log and dt_bias: weights
    rounded to bf16 beforehand give bitwise its gradients (a layer reading the fp32 master instead made the
    allowance too tight and failed model_check on the GPU)."""
    import shutil
    d = tmp_path / "rounded"
    shutil.copytree(cases["tiny"], d)
    w = safetensors_io.load(d / "weights.safetensors")
    rounded, changed = {}, 0
    for name, a in w.items():
        a = np.asarray(a, dtype=np.float32)
        keep = name.endswith("A_log") or name.endswith("dt_bias")
        bits = a.view(np.uint32).astype(np.uint64)
        r = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
        rounded[name] = a if keep else r
        changed += not keep and not np.array_equal(r, a)
    assert changed >= len(w) - 8, (changed, len(w))  # the case's weights are random, not bf16 already
    safetensors_io.save(d / "weights.safetensors", rounded)
    got = {}
    for case in (cases["tiny"], d):
        r = run([BUILD / "parity_step", case, "--emulate-bf16", "--out", case / "grads-bf16.safetensors"])
        assert r.returncode == 0, r.stderr
        got[case] = safetensors_io.load(case / "grads-bf16.safetensors")
    for name, ref in got[cases["tiny"]].items():
        assert np.array_equal(np.asarray(got[d][name]), np.asarray(ref)), name


def _rel(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_stochastic_rounding_draws_judge_cancelling_gradients(cases, tmp_path):
    """--draw SEED: the bf16 emulation with stochastic rounding, one draw per seed, the same bits for one seed;
    draws of an ordinary tensor's error agree with round-to-nearest's within sqrt(2)-ish, and compare_bf16.py
    --draws judges against the largest draw: the emulation passes itself, a gradient broken by 20% still fails
    (model_check of a KDA hybrid failed on A_log for one draw's luck: issue 39)."""
    case = cases["tiny"]
    g = {}
    for tag, extra in (("cpu", []), ("rne", ["--emulate-bf16"]), ("d1", ["--emulate-bf16", "--draw", "1"]),
                       ("d1b", ["--emulate-bf16", "--draw", "1"]), ("d2", ["--emulate-bf16", "--draw", "2"])):
        out = tmp_path / f"{tag}.safetensors"
        r = run([BUILD / "parity_step", case, *extra, "--out", out])
        assert r.returncode == 0, r.stderr
        g[tag] = safetensors_io.load(out)
    names = [n for n in g["cpu"] if n != "loss"]
    assert all(np.array_equal(np.asarray(g["d1"][n]), np.asarray(g["d1b"][n])) for n in names)
    assert sum(not np.array_equal(np.asarray(g["d1"][n]), np.asarray(g["d2"][n])) for n in names) == len(names)
    ratios = sorted(_rel(g["d1"][n], g["cpu"][n]) / _rel(g["rne"][n], g["cpu"][n]) for n in names)
    assert 1.0 < ratios[len(ratios) // 2] < 2.0, ratios  # stochastic rounding's error: ~sqrt(2) x nearest's
    cmp = [ROOT / "tests/cuda/compare_bf16.py", tmp_path / "cpu.safetensors"]
    draws = ["--draws", f"{tmp_path / 'd1.safetensors'},{tmp_path / 'd2.safetensors'}"]
    r = run(["/usr/bin/python3", *cmp, tmp_path / "rne.safetensors", tmp_path / "rne.safetensors", *draws])
    assert r.returncode == 0, r.stdout
    broken = dict(g["rne"])
    victim = next(n for n in names if n.endswith("A_log"))
    broken[victim] = np.asarray(broken[victim]) * 1.2
    safetensors_io.save(tmp_path / "broken.safetensors", broken)
    r = run(["/usr/bin/python3", *cmp, tmp_path / "broken.safetensors", tmp_path / "rne.safetensors", *draws])
    assert r.returncode == 1 and f"{victim}" in r.stdout and "FAIL" in r.stdout, r.stdout
    for bad in (["--draw", "1"], ["--emulate-bf16", "--draw", "0"], ["--emulate-bf16", "--draw", "x"]):
        r = run([BUILD / "parity_step", case, *bad, "--out", tmp_path / "no.safetensors"])
        assert r.returncode == 2 and "--draw" in r.stderr, r.stderr
        assert not (tmp_path / "no.safetensors").exists()


def test_sharded_world_is_refused_not_crashed(cases):
    """parity_step compares whole gradients: under parallel.shard it stops with a message (it used to crash)."""
    r = run(["mpirun", "--oversubscribe", "-np", "2", BUILD / "parity_step", cases["tiny"], "--set", "parallel.cp=2",
             "--set", "parallel.shard=optimizer"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "parallel.shard = optimizer" in r.stderr and "parallel.shard=none" in r.stderr, r.stderr


def _plan_memory(d, *sets):
    args = [BUILD / "ringscan", "plan", d / "config.yaml", "--json", "--set", "parallel.cp=1"]  # parity_step's one rank
    for s in sets:
        args += ["--set", s]
    r = run(args)
    assert r.returncode in (0, 1), r.stderr
    import json
    return json.loads(r.stdout)["memory"]


@pytest.mark.parametrize("policy", ["remat", "full"])
def test_keep_layers_give_identical_gradients(cases, policy):
    """checkpoint.keep_layers (selective): under remat and full the last N layers keep what none keeps and their
    backward recomputes nothing, the rest follow the policy. Every N (0, 1, L-1, L, auto) gives bitwise none's loss
    and gradients; the block recomputes are L - N; the bytes kept are plan's figure for the same config, grow with
    N from the policy's to none's (N = L: exactly none's), and so does plan's total. auto takes the most layers whose
    plan fits device.memory_gib less 5%: with the memory set between N = 2's and N = 3's totals it keeps 2."""
    import json
    d, L = cases["tiny"], 4
    r = run([BUILD / "parity_step", d, "--policy", "none"])
    assert r.returncode == 0, r.stderr
    ref = safetensors_io.load(d / "grads.safetensors")
    ref_loss = r.stdout.split(" loss ")[1].split()[0]
    none_mem = _plan_memory(d, "checkpoint.activations=none")["none"]

    def step(*sets):
        args = [BUILD / "parity_step", d, "--policy", policy]
        for s in sets:
            args += ["--set", s]
        r = run(args)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split(" loss ")[1].split()[0] == ref_loss, r.stdout
        got = safetensors_io.load(d / "grads.safetensors")
        for name, want in ref.items():
            assert np.array_equal(np.asarray(got[name]), np.asarray(want)), (policy, sets, name)
        counters = json.loads(r.stdout.split("counters ", 1)[1].splitlines()[0])
        recomputes = int(r.stdout.split("block recomputes ")[1].split()[0])
        return counters["activation_bytes_kept"], recomputes

    kept, totals = {}, {}
    for n in (0, 1, L - 1, L):
        kept[n], recomputes = step(f"checkpoint.keep_layers={n}")
        assert recomputes == L - n, (policy, n, recomputes)
        mem = _plan_memory(d, f"checkpoint.activations={policy}", f"checkpoint.keep_layers={n}")
        assert mem["keep_layers"] == n, mem
        planned = mem[policy]["activations_kept"]
        assert planned <= kept[n] <= planned + 256 * 200, (policy, n, planned, kept[n])
        totals[n] = mem[policy]["total"]
    none_kept = json.loads(r.stdout.split("counters ", 1)[1].splitlines()[0])["activation_bytes_kept"]
    assert kept[0] < kept[1] < kept[L - 1] < kept[L] == none_kept, (kept, none_kept)
    assert totals[0] < totals[1] < totals[L - 1] < totals[L] == none_mem["total"], (totals, none_mem["total"])
    # auto: device.memory_gib between N = 2's total / 0.95 and N = 3's total / 0.95
    t2 = _plan_memory(d, f"checkpoint.activations={policy}", "checkpoint.keep_layers=2")[policy]["total"]
    gib = (t2 / 0.95 + (totals[L - 1] / 0.95 - t2 / 0.95) / 2) / 2**30
    mem = _plan_memory(d, f"checkpoint.activations={policy}", "checkpoint.keep_layers=auto", f"device.memory_gib={gib}")
    assert mem["keep_layers"] == 2 and mem["keep_layers_auto"], mem
    auto_kept, recomputes = step("checkpoint.keep_layers=auto", f"device.memory_gib={gib}")
    assert recomputes == L - 2, recomputes
    assert mem[policy]["activations_kept"] <= auto_kept <= mem[policy]["activations_kept"] + 256 * 200
    # auto with room for every layer keeps them all
    assert _plan_memory(d, f"checkpoint.activations={policy}", "checkpoint.keep_layers=auto")["keep_layers"] == L
