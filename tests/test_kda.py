"""test_kda.py — Kimi Delta Attention layers (model.linear_attention: kda; issue 39, the cpu part).

Evidence, each able to fail:

1. Config: KDA's dims (key heads = value heads, key width = value width; on cuda 64 or 128) are refused at config
   time, naming the keys; kda on cuda is accepted and plan counts the cuda kernels' kept buffer.
2. The per-op oracle (build/test_ops kda_*: forward and every gradient against the float64 per-token
   recurrence and finite differences) runs in tests/test_ops.py; here: the CP schedules on a KDA core alone
   (build/cp_check kda under mpirun -np 1, 2, 4, 8; the chain at cp 2, whole and staged, the prefix scan at 4 and
   8, the document layouts of the GDN tests) against one call per sample within 1e-5, and with --sabotage they
   fail.
3. The whole model with KDA layers (build/parity_step) against tests/parity/ref_model.py's independent float64
   KDA (kimi_linear's KimiDeltaAttention written from its names) within 1e-4 per tensor; the checkpoint
   policies none / full / remat, checkpoint.gdn_keep and checkpoint.input_rows give the same gradients (the
   last two bitwise); dp x cp in (1,2), (1,4), (2,2)
   on the document layouts of test_cp.py equal the single process within 1e-5 (or twice its own float64 floor);
   the activations kept equal plan's table.
4. Hugging Face: the export's KDA tensors (kimi_linear's names under linear_attn.) are layout.py's rows
   bitwise, export -> init_from -> export is bitwise, parity_step --hf on such a folder matches the float64
   reference under the HF names; a GDN folder into a KDA config, a kimi_linear folder and --format qwen3_5 are
   refused.
5. Training: a tiny KDA hybrid learns under mpirun -np 2 (cp 2), with the single process's losses.
"""
import json
import shutil
import sys

import numpy as np
import pytest

from conftest import BUILD, ROOT, RINGSCAN, run

sys.path.insert(0, str(ROOT / "tests" / "parity"))
import safetensors_io as st  # noqa: E402

torch = pytest.importorskip("torch")
import layout  # noqa: E402
import ref_model  # noqa: E402

KDA = ["--set", "model.linear_attention=kda", "--set", "model.linear_num_value_heads=2"]  # tiny-cpu: nk 2, dk = dv
T = 1024


def mpirun(n, *args, timeout=900):
    return run(["mpirun", "-np", str(n), "--oversubscribe", *args], timeout=timeout)


# the policies' gradients: the same terms in another summation order (tests/test_cp.py's POLICY_BOUND)
POLICY_BOUND = 4e-6


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    n = np.linalg.norm(b)
    return np.linalg.norm(a - b) / n if n > 0 else np.linalg.norm(a - b)


# ---------------------------------------------------------------- 1. config

@pytest.mark.parametrize("sets, words", [
    (["--set", "model.linear_attention=kda"], ["model.linear_num_key_heads = 2", "model.linear_num_value_heads = 4",
                                               "as many key heads as value heads"]),
    (KDA + ["--set", "model.linear_value_head_dim=32"], ["model.linear_key_head_dim = 64",
                                                         "model.linear_value_head_dim = 32", "one width"]),
    (KDA + ["--set", "device.kind=cuda", "--set", "model.linear_key_head_dim=32", "--set",
            "model.linear_value_head_dim=32"], ["device.kind = cuda", "model.linear_key_head_dim = 32",
                                                "Kimi Delta Attention) are built for head dims 64 or 128"]),
    (["--set", "model.linear_attention=kda", "--set", "device.kind=cuda"],
     ["model.linear_num_value_heads = 4", "as many key heads as value heads"]),
    (["--set", "model.linear_attention=mamba"], ["model.linear_attention", "gdn", "kda"]),
])
def test_bad_kda_configs_are_refused(ringscan, sets, words):
    r = run([ringscan, "config", "check", ROOT / "configs/tiny-cpu.yaml", *sets])
    assert r.returncode == 2, r.stdout + r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_kda_on_cuda_is_accepted_and_planned(ringscan):
    """The cuda backend has KDA kernels (kernels/cuda/kda/): config check accepts kda with device.kind cuda, and plan
    (no GPU needed) counts the cuda kept buffer, whose layout is not the cpu's: Tinv fp32 (T, nv, 64), with
    checkpoint.gdn_keep states also the chunk states (ceil(T / 64), nv, dk, dv) and vn (T, nv, dv), both bf16."""
    cuda = KDA + ["--set", "device.kind=cuda"]
    r = run([ringscan, "config", "check", ROOT / "configs/tiny-cpu.yaml", *cuda])
    assert r.returncode == 0, r.stdout + r.stderr
    kept = {}
    for keep in ("none", "wy", "states"):
        r = run([ringscan, "plan", ROOT / "configs/tiny-cpu.yaml", *cuda, "--set", f"checkpoint.gdn_keep={keep}"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "3 linear_attention (Kimi Delta Attention)" in r.stdout and "device cuda" in r.stdout, r.stdout
        line = next(l for l in r.stdout.splitlines() if "kept forward -> backward" in l)
        value, unit = line.split()[4:6]  # the checkpoint.activations none column
        kept[keep] = float(value) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    # tiny-cpu: seq_len 512 at cp 4 in zigzag segments of 64 tokens, a rank holds 2 of each of micro_batch 4 samples:
    # 8 fragments of 64 tokens; 3 KDA layers, nv 2, d 64: Tinv 64 x 2 x 64 fp32 = 32 KiB; the states and vn (bf16)
    # 16 KiB each
    per = 3 * 8 * 32 * 2**10
    assert abs((kept["wy"] - kept["none"]) - per) < 0.01 * 2**20, kept
    assert abs((kept["states"] - kept["none"]) - 2.0 * per) < 0.01 * 2**20, kept


def test_plan_counts_kda(ringscan):
    r = run([ringscan, "plan", ROOT / "configs/tiny-cpu.yaml", *KDA])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 linear_attention (Kimi Delta Attention)" in r.stdout and "(equal)" in r.stdout, r.stdout
    # the parameter count is the HF state dict's (ref_model.hf_shapes, kimi_linear's names)
    cfg = ref_model.ModelConfig.from_mapping(dict(vocab_size=256, hidden_size=256, intermediate_size=512,
                                                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                                  head_dim=64, linear_num_key_heads=2, linear_num_value_heads=2,
                                                  linear_key_head_dim=64, linear_value_head_dim=64,
                                                  linear_attention="kda"))
    assert f"{ref_model.param_count(cfg):,}" in r.stdout, r.stdout


# ---------------------------------------------------------------- 2. the CP schedules on a KDA core

CP_CASES = ([(1, "many", ())] + [(p, d, ()) for p in (2, 4, 8) for d in ("many", "aligned", "one", "long")]
            + [(p, "edges", ("--samples", "4")) for p in (2, 4, 8)]
            + [(p, "one", ("--seq-len", "128")) for p in (2, 4, 8)])


@pytest.mark.parametrize("np_, docs, extra", CP_CASES)
def test_cp_schedules_on_a_kda_core(np_, docs, extra):
    r = mpirun(np_, BUILD / "cp_check", "kda", docs, *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" ok") >= 14 and "FAIL" not in r.stdout, r.stdout
    if np_ == 2:
        assert "staged chain" in r.stdout, r.stdout  # the kept run took the staged chain


@pytest.mark.parametrize("np_", [2, 4, 8])
def test_cp_kda_check_can_fail(np_):
    r = mpirun(np_, BUILD / "cp_check", "kda", "many", "--sabotage")
    assert r.returncode != 0 and "FAIL" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------- 3. the whole model

def segment_docs():
    """test_cp.py's boundaries layout: documents starting on and one after the segment boundaries of every cp."""
    starts = [0, 64, 65, 128, 129, 256, 257, 300, 384, 385, 512, 513, 700, 768, 769, 896, 960, 961]
    lengths = [b - a for a, b in zip(starts, starts[1:] + [T])]
    return [{"lengths": lengths, "carry": 0}, {"lengths": [300, 5, 600, 119], "carry": 100}]


DOCS = {"many": None, "boundaries": segment_docs(), "one": [{"lengths": [T], "carry": 0},
                                                            {"lengths": [T], "carry": 500}]}


@pytest.fixture(scope="module")
def cases(tmp_path_factory, ringscan):
    out = {}
    for name, docs in DOCS.items():
        d = tmp_path_factory.mktemp(f"kda-{name}")
        args = ["/usr/bin/python3", ROOT / "tests/parity/make_case.py", "configs/tiny-cpu.yaml", d, *KDA,
                "--seq-len", str(T), "--batch", "2", "--seed", "5"]
        if docs is not None:
            args += ["--docs", json.dumps(docs)]
        r = run(args, timeout=1200)
        assert r.returncode == 0, r.stdout + r.stderr
        out[name] = d
    return out


def parity_step(case, dp, cp, out, *extra):
    sets = ["--set", f"parallel.dp={dp}", "--set", f"parallel.cp={cp}", "--set", f"data.micro_batch={2 // dp}"]
    r = mpirun(dp * cp, BUILD / "parity_step", case, *sets, "--out", out, *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    counters = json.loads(r.stdout.split("counters ", 1)[1].splitlines()[0])
    return st.load(out), counters


def test_kda_model_matches_the_float64_reference_under_every_policy(cases, tmp_path):
    d = cases["many"]
    grads = {}
    for policy in ("none", "full", "remat"):
        grads[policy], _ = parity_step(d, 1, 1, tmp_path / f"{policy}.safetensors", "--policy", policy)
        c = run(["/usr/bin/python3", ROOT / "tests/parity/compare.py", d / "ref.safetensors",
                 tmp_path / f"{policy}.safetensors"])
        assert c.returncode == 0, c.stdout + c.stderr
    for policy in ("full", "remat"):
        for k in grads["none"]:
            assert rel(grads[policy][k], grads["none"][k]) <= POLICY_BOUND, (policy, k)
    # checkpoint.keep_layers: the last layers kept whole (run as under none), the rest remat: within none's bound,
    # block recomputes only for the others
    for n in (1, 3):
        g, c = parity_step(d, 1, 1, tmp_path / f"keep-layers-{n}.safetensors", "--policy", "remat",
                           "--set", f"checkpoint.keep_layers={n}")
        assert c["block_recomputes"] == 4 - n, c
        for k in g:
            assert rel(g[k], grads["none"][k]) <= POLICY_BOUND, (n, k)
    # checkpoint.input_rows: whole reads the recompute's ln1, in_proj and f (f_a f_b^T) outputs where chunk reruns
    # them per row chunk: the same bits, fewer per-token forwards in the backward
    g, c = {}, {}
    for inputs in ("chunk", "whole"):
        g[inputs], c[inputs] = parity_step(d, 1, 1, tmp_path / f"inputs-{inputs}.safetensors", "--policy", "remat",
                                           "--set", f"checkpoint.input_rows={inputs}",
                                           "--set", "checkpoint.chunk_rows=100")
    assert c["whole"]["chunk_recomputes"] < c["chunk"]["chunk_recomputes"], c
    for k in g["chunk"]:
        assert np.array_equal(g["chunk"][k], g["whole"][k]), k
    # the kept Tinv (checkpoint.gdn_keep) gives the bits of recomputing it
    for keep in ("none", "states"):
        g, _ = parity_step(d, 1, 1, tmp_path / f"keep-{keep}.safetensors", "--set", f"checkpoint.gdn_keep={keep}")
        for k in g:
            assert np.array_equal(g[k], grads["remat"][k]), (keep, k)
    # every KDA tensor has a gradient that is not 0 (each path of the layer is live)
    for k, v in grads["none"].items():
        if ".linear_attn." in k:
            assert np.abs(v).max() > 0, k


def test_kda_under_the_bf16_emulation(cases, tmp_path):
    """parity_step --emulate-bf16 (model_check's allowance on the GPU machine) runs a KDA model: its backend had no
    KDA entries and model_init called a NULL one (segfault); its loss and gradients are the fp32 oracle's within
    bf16 storage's error, and a bf16 copy of the activations does move them (the emulation is live)."""
    d = cases["many"]
    r = run([BUILD / "parity_step", d, "--emulate-bf16", "--out", tmp_path / "emu.safetensors"])
    assert r.returncode == 0, r.stdout + r.stderr
    emu, ref = st.load(tmp_path / "emu.safetensors"), st.load(d / "ref.safetensors")
    assert abs(float(emu["loss"]) - float(ref["loss"])) <= 1e-2 * abs(float(ref["loss"]))
    worst = max(rel(emu[k], ref[k]) for k in ref if k != "loss")
    assert 1e-5 < worst < 0.2, worst


@pytest.mark.parametrize("case", list(DOCS))
def test_kda_layouts_give_the_single_process_gradients(cases, case, tmp_path):
    d = cases[case]
    exact = st.load(d / "ref.safetensors")
    ref, _ = parity_step(d, 1, 1, tmp_path / "g11.safetensors")
    floor = {k: rel(ref[k], exact[k]) for k in ref}
    assert max(floor.values()) <= 1e-4, max((v, k) for k, v in floor.items())
    for dp, cp in ((1, 2), (1, 4), (2, 2)):
        got, counters = parity_step(d, dp, cp, tmp_path / f"g{dp}{cp}.safetensors")
        worst = max((rel(got[k], ref[k]), k) for k in ref)
        print(f"{case} dp {dp} cp {cp}: loss {float(got['loss']):.9f} vs {float(ref['loss']):.9f}, worst {worst}")
        assert rel(got["loss"], ref["loss"]) <= 1e-5, (dp, cp)
        for k in ref:
            assert rel(got[k], ref[k]) <= max(1e-5, 2 * floor[k]), (dp, cp, k, rel(got[k], ref[k]), floor[k])
        assert sum(counters["scan_allgathers_fwd"][:3]) == 3 and sum(counters["halo_exchanges"][:3]) == 6, counters


@pytest.mark.parametrize("dp, cp", [(1, 2), (1, 4)])
def test_kda_policies_under_cp_and_plan(cases, ringscan, tmp_path, dp, cp):
    d = cases["boundaries"]
    grads, counts = {}, {}
    for policy in ("none", "full", "remat"):
        grads[policy], counts[policy] = parity_step(d, dp, cp, tmp_path / f"{policy}.safetensors", "--policy", policy)
    for policy in ("full", "remat"):
        for k in grads["none"]:
            assert rel(grads[policy][k], grads["none"][k]) <= POLICY_BOUND, (policy, k)
    for policy, times in (("none", 1), ("remat", 1), ("full", 2)):  # remat reruns no state pass, no halo
        for l in (0, 1, 2):
            assert counts[policy]["scan_allgathers_fwd"][l] == times, (policy, counts[policy])
            assert counts[policy]["halo_exchanges"][l] == times + 1, (policy, counts[policy])
    r = run([ringscan, "plan", ROOT / "configs/tiny-cpu.yaml", "--json", *KDA, "--set", f"parallel.cp={cp}",
             "--set", f"data.seq_len={T}", "--set", "data.micro_batch=2"])
    assert r.returncode in (0, 1), r.stderr
    memory = json.loads(r.stdout)["memory"]
    for policy in ("none", "full", "remat"):
        planned, kept = memory[policy]["activations_kept"], counts[policy]["activation_bytes_kept"]
        assert planned <= kept <= planned + 256 * 400, (policy, planned, kept)


# ---------------------------------------------------------------- 4. Hugging Face

TINY = ["--set", "data.seq_len=128", "--set", "data.micro_batch=2", "--set", "train.warmup_steps=1",
        "--set", "checkpoint.every=0"]


def train(ringscan, data, out, steps, cp=1, extra=()):
    r = mpirun(cp, ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *KDA, *TINY, "--set", f"parallel.cp={cp}",
               "--set", f"data.path={data}", "--set", f"train.steps={steps}", "--set", f"run.out_dir={out}", *extra)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    return [json.loads(line)["loss"] for line in open(out / "metrics.jsonl")]


@pytest.fixture(scope="module")
def kda_run(ringscan, recall_tok, tmp_path_factory):
    out = tmp_path_factory.mktemp("kdahf") / "run"
    train(ringscan, recall_tok, out, 2)
    return out


def test_kda_export_names_layout_and_round_trip(ringscan, recall_tok, kda_run, tmp_path):
    out = tmp_path / "hf"
    r = run([ringscan, "export", kda_run, out])
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "ringscan_kda_hybrid" and cfg["linear_attention"] == "kda", cfg
    assert cfg["linear_attn_config"]["kda_layers"] == [1, 2, 3] and cfg["linear_attn_config"]["head_dim"] == 64
    got = st.load(out / "model.safetensors")
    mc = ref_model.ModelConfig.from_mapping(cfg)
    assert {k: tuple(v.shape) for k, v in got.items()} == ref_model.hf_shapes(mc)
    assert "model.layers.0.linear_attn.f_b_proj.weight" in got and "model.layers.0.linear_attn.q_conv1d.weight" in got
    step = (kda_run / "ckpt/LATEST").read_text().strip()
    want = layout.internal_to_hf(st.load(kda_run / "ckpt" / step / "model.safetensors"), mc)
    for k in want:
        assert np.array_equal(want[k].numpy(), got[k]), k
    # export -> init_from -> export: bitwise
    run2 = tmp_path / "run2"
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *KDA, *TINY, "--set", "parallel.cp=1", "--set",
             f"data.path={recall_tok}", "--set", "train.steps=1", "--set", "train.lr=0", "--set", "train.min_lr=0",
             "--set", "train.weight_decay=0", "--set", f"run.out_dir={run2}", "--set", f"model.init_from={out}"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    out2 = tmp_path / "hf2"
    assert run([ringscan, "export", run2, out2]).returncode == 0
    again = st.load(out2 / "model.safetensors")
    for k in got:
        assert np.array_equal(got[k], again[k]), k


def test_kda_imports_and_exports_refuse(ringscan, recall_tok, kda_run, tmp_path):
    out = tmp_path / "hf"
    assert run([ringscan, "export", kda_run, out]).returncode == 0
    r = run([ringscan, "export", kda_run, tmp_path / "q35", "--format", "qwen3_5"])
    assert r.returncode == 2 and "Kimi Delta Attention" in r.stderr and not (tmp_path / "q35").exists(), r.stderr
    # a KDA folder into a GDN config, and the other way
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", "--set", "model.linear_num_value_heads=2", *TINY,
             "--set", "parallel.cp=1", "--set", f"data.path={recall_tok}", "--set", "train.steps=1",
             "--set", f"run.out_dir={tmp_path / 'r1'}", "--set", f"model.init_from={out}"])
    assert r.returncode == 2 and "linear_attention = kda" in r.stderr and "model.linear_attention = gdn" in r.stderr, \
        r.stderr
    # a kimi_linear folder: named, its MLA and MoE said
    kimi = tmp_path / "kimi"
    shutil.copytree(out, kimi)
    c = json.loads((kimi / "config.json").read_text())
    c.update(model_type="kimi_linear", architectures=["KimiLinearForCausalLM"])
    (kimi / "config.json").write_text(json.dumps(c))
    r = run([ringscan, "export", kimi, tmp_path / "k2"])
    assert r.returncode == 2 and "kimi_linear" in r.stderr and "MLA" in r.stderr and "mixture-of-experts" in r.stderr, \
        r.stderr


def test_parity_step_hf_names_match_the_reference(ringscan, kda_run, cases, tmp_path):
    """parity_step --hf on a KDA folder (the path tests/parity/kda_check.py takes against transformers): the loss
    and every gradient under kimi_linear's names equal ref_model.py's in float64."""
    d = cases["many"]
    folder = tmp_path / "hf"
    assert run([ringscan, "export", kda_run, folder]).returncode == 0  # its config.json: the same model
    mc = ref_model.ModelConfig.from_mapping(json.loads((folder / "config.json").read_text()))
    weights = {k: v.numpy() for k, v in layout.internal_to_hf(st.load(d / "weights.safetensors"), mc).items()}
    st.save(folder / "model.safetensors", weights, {"format": "pt"})
    out = tmp_path / "g.safetensors"
    r = run([BUILD / "parity_step", d, "--hf", folder, "--out", out])
    assert r.returncode == 0, r.stdout + r.stderr
    got, ref = st.load(out), st.load(d / "ref.safetensors")
    want = {k: v.numpy() for k, v in layout.internal_to_hf({k: v for k, v in ref.items() if k != "loss"}, mc).items()}
    assert abs(float(got.pop("loss")) - float(ref["loss"])) <= 1e-5 * abs(float(ref["loss"]))
    assert set(got) == set(want)
    worst = max((rel(got[k], want[k]), k) for k in want)
    assert worst[0] <= 1e-4, worst


# ---------------------------------------------------------------- 5. training

def test_tiny_kda_hybrid_learns_under_cp2(ringscan, recall_tok, tmp_path):
    steps, sets = 40, ["--set", "train.warmup_steps=4", "--set", "data.seq_len=256"]
    two = train(ringscan, recall_tok, tmp_path / "cp2", steps, cp=2, extra=sets)
    print("cp 2 losses", [round(x, 4) for x in two])
    assert len(two) == steps and np.mean(two[-5:]) < two[0] - 1.0, two  # it learns
    one = train(ringscan, recall_tok, tmp_path / "cp1", steps, cp=1, extra=sets + ["--set", "run.stop_after_step=5"])
    for a, b in zip(one, two[:5]):
        assert abs(a - b) <= 1e-5 * abs(b), (one, two[:5])


def test_kda_under_the_weights_shard_stage(ringscan, recall_tok, tmp_path):
    """parallel.shard weights keeps the fp32 gates the kernels read in a compact copy refreshed after each step; a KDA
    layer's dt_bias there is nv x dk long (not nv): the losses equal the unsharded run's."""
    losses = {}
    for shard in ("none", "weights"):
        r = mpirun(2, ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *KDA, *TINY, "--set", "parallel.cp=1",
                   "--set", "parallel.dp=2", "--set", "data.micro_batch=1", "--set", f"parallel.shard={shard}",
                   "--set", f"data.path={recall_tok}", "--set", "train.steps=4", "--set", f"run.out_dir={tmp_path / shard}")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr
        losses[shard] = [json.loads(line)["loss"] for line in open(tmp_path / shard / "metrics.jsonl")]
    assert losses["weights"] == losses["none"], losses


# ---------------------------------------------------------------- the GPU machine's parity script, its plumbing

@pytest.mark.parametrize("impl", ["ref", "ref-transformers-names"])
def test_kda_check_plumbing(ringscan, tmp_path, impl):
    """tests/parity/kda_check.py (run against transformers' KimiDeltaAttention on the GPU machine) with ref_model.py's
    KDA standing in for transformers', under kimi_linear's names and under transformers' current ones (one packed
    conv, forget_gate_*, beta_proj, output_gate_*): every check passes and the broken one fails as it must."""
    r = run(["/usr/bin/python3", ROOT / "tests/parity/kda_check.py", tmp_path, "--impl", impl], timeout=1200)
    assert r.returncode == 0 and "kda_check: PASS (6 checks, 0 failed" in r.stdout, r.stdout + r.stderr
    assert "PASS  broken dt_bias heads swapped (packed) (must fail)" in r.stdout, r.stdout
