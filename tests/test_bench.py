"""test_bench.py — `ringscan bench` on a machine without a GPU (CI): the help, strict option
checking (a bad value names its option, exit 2), the clear stop naming the device, and the request
files the peers read (bench/peer/README.md), which need no GPU. `bench cp` runs whole on the cpu
backend under mpirun -np 2 at a tiny size: its rows, the numbers derived from them, and the peer
launch (a stand-in for torchrun that writes a result) are checked; so does its KDA layer (--parts
kda, the cpu backend's kda_* entries). The KDA peers' request checks run before torch is imported
and are run here. The timings themselves run on the GPU machine (today's figures:
docs/performance.md); no test asserts a time."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run


def gpu_visible():
    return bool(shutil.which("nvidia-smi")) and subprocess.run(["nvidia-smi", "-L"],
                                                               capture_output=True).returncode == 0


def test_help(ringscan):
    r = run([ringscan, "bench", "--help"])
    assert r.returncode == 0
    for s in ("attn|gdn|kda|step|all", "--peer", "kda:  Kimi Delta Attention's chunk", "all:  attn, gdn and step",
              "cp: attn, gdn, kda (default attn,gdn)", "--attn-shapes", "--doc-len", "--gdn-keep", "--tokens", "--peak-tflops",
              "backward 2.5x forward", "--write-requests", "mpirun -np P ringscan bench cp", "--gdn-T", "--parts",
              "--device D", "one-GPU ms / (P x CP ms)", "--ring-calls C"):
        assert s in r.stdout, s


@pytest.mark.parametrize("args,names", [
    (["bench"], "benchmark"),
    (["bench", "flops"], "benchmark flops"),
    (["bench", "kdaa"], "benchmark kdaa: unknown (attn, gdn, kda, step, all, cp)"),
    (["bench", "kda", "--dim", "96"], "--dim 96"),
    (["bench", "kda", "--gdn-keep", "all"], "--gdn-keep all: expected none, wy or states"),
    (["bench", "kda", "--doc-len", "1"], "--doc-len 1"),
    (["bench", "kda", "--parts", "kda"], "--parts : an option of bench cp only"),
    (["bench", "attn", "--T", "100"], "--T 100: must be a multiple of 64"),
    (["bench", "attn", "--T", "32k"], "--T 32k: not an integer"),
    (["bench", "attn", "--T", "64,,128"], "--T 64,,128: empty item"),
    (["bench", "attn", "--attn-shapes", "16/3/128"], "--attn-shapes 16/3/128"),
    (["bench", "attn", "--attn-shapes", "16/2/96"], "HD must be 64, 128 or 256"),
    (["bench", "gdn", "--heads", "0"], "--heads 0: out of range"),
    (["bench", "gdn", "--dim", "96"], "--dim 96"),
    (["bench", "gdn", "--doc-len", "1"], "--doc-len 1"),
    (["bench", "gdn", "--gdn-keep", "all"], "--gdn-keep all: expected none, wy or states"),
    (["bench", "gdn", "--gdn-tune", "state_fwd_wgmma=9"], "--gdn-tune 9: out of range [0, 3]"),
    (["bench", "gdn", "--gdn-tune", "sfwd=1"], "--gdn-tune sfwd: unknown key (split, nst, bv, dseg, dual, state_fwd_wgmma"),
    (["bench", "attn", "--attn-tune", "dq_atomic=2"], "--attn-tune 2: out of range [0, 1]"),
    (["bench", "cp", "--attn-tune", "fast=1"], "--attn-tune fast: unknown key (dq_atomic, throttle)"),
    (["bench", "attn", "--attn-tune", "dq_atomic"], "--attn-tune dq_atomic: expected KEY=N"),
    (["bench", "step", "--tokens", "100"], "--tokens 100"),
    (["bench", "step", "--set", "parallel.cp=2"], "--set parallel.cp=2: bench step fixes this key"),
    (["bench", "step", "--set", "nonsense"], "--set nonsense"),
    (["bench", "attn", "--reps"], "--reps"),
    (["bench", "attn", "--reps", "0"], "--reps 0: out of range"),
    (["bench", "attn", "--max-s", "nan"], "--max-s nan"),
    (["bench", "attn", "--frobnicate"], "--frobnicate"),
    (["bench", "cp", "--gdn-T", "100"], "--gdn-T 100: must be a multiple of 64"),
    (["bench", "cp", "--parts", "attn,mlp"], "--parts mlp: expected attn, gdn or kda"),
    (["bench", "cp", "--gdn-chain", "fast"], "--gdn-chain fast: expected staged or whole"),
    (["bench", "cp", "--gdn-cp", "fast"], "--gdn-cp fast: expected auto, chain, hybrid or scan"),
    (["bench", "cp", "--gdn-cp", "local"], "--gdn-cp local: expected auto, chain, hybrid or scan"),
    (["bench", "cp", "--device", "tpu"], "--device tpu: expected cuda or cpu"),
    (["bench", "cp", "--tokens", "4096"], "--tokens : not an option of bench cp"),
    (["bench", "cp", "--doc-len", "0"], "--doc-len : not an option of bench cp"),
    (["bench", "cp", "--attn-impl", "flash"], "--attn-impl flash: expected ringscan, cudnn or cudnn_det"),
    (["bench", "cp", "--ring-calls", "all"], "--ring-calls all: expected auto, pairs or steps"),
    (["bench", "attn", "--attn-impl", "auto"], "--attn-impl auto: expected ringscan, cudnn or cudnn_det"),
    (["bench", "attn", "--gdn-T", "1024"], "--gdn-T : an option of bench cp only"),
    (["bench", "attn", "--ring-calls", "steps"], "--ring-calls : an option of bench cp only"),
    (["bench", "gdn", "--device", "cpu"], "--device : an option of bench cp only"),
])
def test_bad_options_name_the_option(ringscan, args, names):
    r = run([ringscan] + args)
    assert r.returncode == 2, r.stderr
    assert names in r.stderr and "ringscan bench" in r.stderr
    assert r.stdout == ""


def test_bad_config_names_the_file(ringscan, tmp_path):
    r = run([ringscan, "bench", "step", "--config", tmp_path / "none.yaml"])
    assert r.returncode == 2 and "none.yaml" in r.stderr
    r = run([ringscan, "bench", "step", "--set", "model.hidden_size=-3"])
    assert r.returncode == 2 and "model.hidden_size" in r.stderr


def test_without_a_gpu_stops_naming_the_device(ringscan, tmp_path):
    if gpu_visible():
        pytest.skip("a GPU is visible here: bench runs")
    for what in ("attn", "gdn", "kda", "step", "all"):
        r = run([ringscan, "bench", what, "--peer", "--out", tmp_path / what])
        assert r.returncode == 2, r.stderr
        assert "ringscan bench: device:" in r.stderr and "GPU" in r.stderr
        assert r.stdout == ""
        assert not (tmp_path / what).exists()  # nothing written, no peer started


def test_requests_are_the_peers_contract(ringscan, tmp_path):
    r = run([ringscan, "bench", "all", "--write-requests", "--out", tmp_path, "--T", "4096,8192",
             "--doc-len", "0,512", "--heads", "16", "--tokens", "4096", "--seed", "7"])
    assert r.returncode == 0, r.stderr
    attn = json.loads((tmp_path / "request_attn.json").read_text())
    assert attn["schema"] == "ringscan-bench-request/1" and attn["kind"] == "attn"
    assert attn["seed"] == 7 and attn["warmup"] == 1 and attn["reps"] == 5
    # --doc-len: each attention case per mean length, with the same boundaries as the GDN cases
    assert [c["name"] for c in attn["cases"]][:2] == ["T4096_nh16_nkv16_hd128_docs1", "T4096_nh16_nkv16_hd128_docs9"]
    assert len(attn["cases"]) == 16 and all(c["causal"] for c in attn["cases"])
    gdn = json.loads((tmp_path / "request_gdn.json").read_text())
    assert len(gdn["cases"]) == 4
    gdn_cu = {(c["T"], len(c["cu_seqlens"])): c["cu_seqlens"] for c in gdn["cases"]}
    for c in attn["cases"]:
        assert c["name"].endswith(f"docs{len(c['cu_seqlens']) - 1}")
        assert c["cu_seqlens"] == gdn_cu[(c["T"], len(c["cu_seqlens"]))]
    # without --doc-len: one document per attention case, no boundaries
    r = run([ringscan, "bench", "attn", "--write-requests", "--out", tmp_path / "one", "--T", "4096"])
    one = json.loads((tmp_path / "one" / "request_attn.json").read_text())["cases"]
    assert [c["name"] for c in one][:2] == ["T4096_nh16_nkv16_hd128", "T4096_nh16_nkv2_hd128"]
    assert len(one) == 4 and not any("cu_seqlens" in c for c in one)
    for c in gdn["cases"]:
        cu = c["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == c["T"] and all(a < b for a, b in zip(cu, cu[1:]))
        assert c["name"].endswith(f"docs{len(cu) - 1}") and c["K"] == c["V"] == 128
        if len(cu) > 2:  # mean 512, lengths in [256, 768), the last takes the rest
            assert all(256 <= b - a < 768 for a, b in zip(cu[:-2], cu[1:-1]))
    # the same seed gives the same documents (the peers use these boundaries)
    run([ringscan, "bench", "gdn", "--write-requests", "--out", tmp_path / "again", "--T", "4096,8192",
         "--doc-len", "0,512", "--heads", "16", "--seed", "7"])
    assert json.loads((tmp_path / "again" / "request_gdn.json").read_text())["cases"] == gdn["cases"]
    step = json.loads((tmp_path / "request_step.json").read_text())
    c, c_docs = step["cases"]  # --doc-len 0,512: a step case per length too
    assert c["T"] == 4096 and c["name"] == "hybrid-1b-256k-h200x4_T4096_docs1"
    assert c_docs["cu_seqlens"] == gdn_cu[(4096, len(c_docs["cu_seqlens"]))]
    m = c["model"]
    assert m["num_hidden_layers"] == len(m["layer_types"]) == 16
    assert m["layer_types"].count("full_attention") == 4 and m["hidden_size"] == 1536
    assert c["train"]["grad_clip"] == 1.0


def test_step_documents_request(ringscan, tmp_path):
    """bench step --doc-len: a step case per mean length, its boundaries those of the attn/gdn cases for the
    seed, and the FLOPs per token with the document mask: plan's, its causal attention term scaled by
    sum(L^2)/T^2 (one document: plan's model FLOPs as they are)."""
    T = 131072
    r = run([ringscan, "bench", "step", "--write-requests", "--out", tmp_path, "--tokens", str(T), "--doc-len",
             "0,8192", "--seed", "3"])
    assert r.returncode == 0, r.stderr
    one, docs = json.loads((tmp_path / "request_step.json").read_text())["cases"]
    r = run([ringscan, "plan", "configs/hybrid-1b-256k-h200x4.yaml", "--json", "--set", f"data.seq_len={T}",
             "--set", "parallel.cp=1", "--set", "parallel.dp=1", "--set", "slurm.gpus_per_node=1",
             "--set", "train.grad_accum=1", "--set", "data.micro_batch=1"])
    assert r.returncode == 0, r.stderr
    flops = json.loads(r.stdout)["flops_per_token"]
    assert one["cu_seqlens"] == [0, T] and one["name"] == f"hybrid-1b-256k-h200x4_T{T}_docs1"
    assert one["attn_doc_fraction"] == 1.0 and one["flops_per_token"] == pytest.approx(flops["model"], rel=1e-6)
    cu = docs["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == T and docs["name"].endswith(f"_docs{len(cu) - 1}") and len(cu) > 10
    assert all(4096 <= b - a < 12288 for a, b in zip(cu[:-2], cu[1:-1]))  # mean 8k, the last takes the rest
    frac = sum((b - a) ** 2 for a, b in zip(cu, cu[1:])) / T ** 2
    assert docs["attn_doc_fraction"] == pytest.approx(frac, rel=1e-6) and frac < 0.2
    want = flops["model"] - flops["attention_causal"] * (1 - frac)
    assert docs["flops_per_token"] == pytest.approx(want, rel=1e-6)
    assert docs["flops_per_token"] < 0.6 * one["flops_per_token"]
    # the same boundaries as the attention cases of that length and seed
    run([ringscan, "bench", "attn", "--write-requests", "--out", tmp_path / "attn", "--T", str(T), "--doc-len", "8192",
         "--attn-shapes", "16/2/128", "--seed", "3"])
    (a,) = json.loads((tmp_path / "attn" / "request_attn.json").read_text())["cases"]
    assert a["cu_seqlens"] == cu
    # without --doc-len: one case, one document, plan's FLOPs
    run([ringscan, "bench", "step", "--write-requests", "--out", tmp_path / "plain", "--tokens", str(T)])
    (c,) = json.loads((tmp_path / "plain" / "request_step.json").read_text())["cases"]
    assert "cu_seqlens" not in c and c["name"] == f"hybrid-1b-256k-h200x4_T{T}"
    assert c["flops_per_token"] == pytest.approx(flops["model"], rel=1e-6)
    # the peer's step (bench/peer/step_hf.py) reads the same boundaries: the request with --peer carries them
    r = run([ringscan, "bench", "step", "--peer", "--write-requests", "--doc-len", "8192", "--out", tmp_path / "peer",
             "--tokens", str(T), "--seed", "3"])
    assert r.returncode == 0, r.stderr
    (p,) = json.loads((tmp_path / "peer" / "request_step.json").read_text())["cases"]
    assert p["cu_seqlens"] == cu


def test_kda_request_is_gdns_cases(ringscan, tmp_path):
    """bench kda's request: kind kda, the GDN cases (the same names, shapes and document boundaries), which
    kda_fla.py reads; `all` leaves KDA out."""
    args = ["--T", "4096,8192", "--doc-len", "0,512", "--heads", "16,64", "--seed", "5"]
    r = run([ringscan, "bench", "kda", "--write-requests", "--out", tmp_path / "kda", *args])
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"wrote {tmp_path / 'kda'}/request_kda.json (8 cases)\n"
    assert sorted(os.listdir(tmp_path / "kda")) == ["request_kda.json"]
    kda = json.loads((tmp_path / "kda" / "request_kda.json").read_text())
    run([ringscan, "bench", "gdn", "--write-requests", "--out", tmp_path / "gdn", *args])
    gdn = json.loads((tmp_path / "gdn" / "request_gdn.json").read_text())
    assert kda["kind"] == "kda" and kda["seed"] == 5 and kda["schema"] == "ringscan-bench-request/1"
    assert kda["cases"] == gdn["cases"] and len(kda["cases"]) == 8
    assert {len(c["cu_seqlens"]) > 2 for c in kda["cases"]} == {False, True}
    r = run([ringscan, "bench", "all", "--write-requests", "--out", tmp_path / "all", "--T", "4096", "--tokens", "4096"])
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "all")) == ["request_attn.json", "request_gdn.json", "request_step.json"]


def run_peer(script, request, tmp_path, env=None):
    """python3 bench/peer/SCRIPT --request REQUEST --out OUT; returns the completed process."""
    return run([sys.executable, ROOT / "bench" / "peer" / script, "--request", request, "--out", tmp_path / "out.json"],
               env=env, timeout=300)


def kda_request(tmp_path, kind="kda", **case):
    c = {"name": "T4096_H16_K128_docs2", "T": 4096, "H": 16, "K": 128, "V": 128, "cu_seqlens": [0, 1000, 4096]}
    c.update(case)
    c = {k: v for k, v in c.items() if v is not None}
    req = {"schema": "ringscan-bench-request/1", "kind": kind, "warmup": 1, "reps": 5, "max_s": 8.0, "seed": 1,
           "cases": [c]}
    if kind == "cp_kda":
        req.update(P=2, conv_kernel=4)
    path = tmp_path / f"request_{kind}.json"
    path.write_text(json.dumps(req))
    return path


@pytest.mark.parametrize("script,kind,case,says", [
    ("kda_fla.py", "gdn", {}, "key 'kind' is 'gdn', this script runs 'kda'"),
    ("kda_fla.py", "kda", {"cu_seqlens": None}, "a case lacks key 'cu_seqlens'"),
    ("kda_fla.py", "kda", {"cu_seqlens": [0, 1000, 4000]}, "key 'cu_seqlens' is not [0, ..., T] increasing"),
    ("kda_fla.py", "kda", {"cu_seqlens": [0, 3000, 1000, 4096]}, "key 'cu_seqlens' is not [0, ..., T] increasing"),
    ("kda_fla.py", "kda", {"K": 512}, "key 'K' is 512, FLA's chunk_kda takes at most 256"),
    ("kda_fla.py", "kda", {"H": "16"}, "key 'H' is '16', expected a positive integer"),
    ("cp_kda_fla.py", "cp_gdn", {}, "key 'kind' is 'cp_gdn', this script runs 'cp_kda'"),
    ("cp_kda_fla.py", "cp_kda", {}, "one document expected (cu_seqlens [0, T])"),
    ("cp_kda_fla.py", "cp_kda", {"cu_seqlens": [0, 4095], "T": 4095}, "T = 4095 is not divisible by P = 2"),
])
def test_kda_peers_refuse_bad_requests(tmp_path, script, kind, case, says):
    """The KDA peers check the request before importing torch: exit 2 naming the file and what is wrong."""
    req = kda_request(tmp_path, kind, **case)
    r = run_peer(script, req, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{script}: --request {req}" in r.stderr and says in r.stderr
    assert not (tmp_path / "out.json").exists()


def test_kda_peers_accept_ringscans_requests(ringscan, tmp_path):
    """The requests ringscan writes pass the peers' checks: without FLA the scripts stop at their imports (exit 2
    naming torch or flash-linear-attention), not at the request."""
    env = {"PYTHONPATH": ""}  # no .dev/peer: FLA not importable
    if run([sys.executable, "-c", "import fla"], env=env).returncode == 0:
        pytest.skip("flash-linear-attention is importable here: the peers would run")
    r = run([ringscan, "bench", "kda", "--write-requests", "--out", tmp_path, "--T", "4096", "--doc-len", "0,512"])
    assert r.returncode == 0, r.stderr
    r = mpirun2(ringscan, "bench", "cp", "--parts", "kda", "--write-requests", "--out", tmp_path, "--gdn-T", "4096")
    assert r.returncode == 0, r.stderr
    for script, kind in (("kda_fla.py", "kda"), ("cp_kda_fla.py", "cp_kda")):
        r = run_peer(script, tmp_path / f"request_{kind}.json", tmp_path, env=env)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "--request" not in r.stderr, r.stderr
        assert ("PyTorch is not importable" in r.stderr or "flash-linear-attention is not importable" in r.stderr), \
            r.stderr


# ---------------------------------------------------------------- bench cp (cpu backend, 2 ranks)

CP_TINY = ["--device", "cpu", "--T", "1024", "--gdn-T", "512", "--attn-shapes", "2/2/64,2/1/64", "--heads", "2",
           "--dim", "64", "--warmup", "0", "--reps", "3"]


def mpirun2(*args, env=None):
    return run(["mpirun", "-np", "2", "--oversubscribe", *args], env=env, timeout=300)


def test_cp_shape_not_divisible_by_ranks(ringscan, tmp_path):
    r = mpirun2(ringscan, "bench", "cp", "--device", "cpu", "--T", "192", "--out", tmp_path / "o")
    assert r.returncode != 0
    assert "ringscan bench: --T 192: must be a multiple of 128 x P = 256" in r.stderr
    assert r.stderr.count("--T 192") == 1  # rank 0 alone says it
    assert not (tmp_path / "o").exists()


def test_cp_cudnn_needs_cuda(ringscan, tmp_path):
    r = mpirun2(ringscan, "bench", "cp", "--device", "cpu", "--attn-impl", "cudnn", "--out", tmp_path / "o")
    assert r.returncode == 2, r.stderr
    assert "--attn-impl cudnn: cuDNN's attention needs --device cuda" in r.stderr
    assert not (tmp_path / "o").exists()


def test_cp_requests(ringscan, tmp_path):
    r = mpirun2(ringscan, "bench", "cp", "--write-requests", "--out", tmp_path, "--seed", "3")
    assert r.returncode == 0, r.stderr
    attn = json.loads((tmp_path / "request_cp_attn.json").read_text())
    gdn = json.loads((tmp_path / "request_cp_gdn.json").read_text())
    assert attn["kind"] == "cp_attn" and attn["P"] == 2 and attn["seed"] == 3
    assert [c["name"] for c in attn["cases"]] == [f"T{t}_nh16_nkv{k}_hd128" for t in (131072, 262144, 524288)
                                                  for k in (16, 2)]
    assert gdn["kind"] == "cp_gdn" and gdn["P"] == 2 and gdn["conv_kernel"] == 4
    assert [(c["T"], c["H"], c["K"], c["cu_seqlens"]) for c in gdn["cases"]] == [
        (t, h, 128, [0, t]) for t in (65536, 131072) for h in (16, 64)]


def cp_rows(part, impl):
    return {r["case"]: r for r in part["ringscan"] if r["impl"] == impl}


def test_cp_on_cpu_rows(ringscan, tmp_path):
    r = mpirun2(ringscan, "bench", "cp", *CP_TINY, "--out", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    b = json.loads((tmp_path / "bench.json").read_text())
    assert b["P"] == 2 and b["backend"] == "cpu"
    assert b["attn_tune"] == {"dq_atomic": 0, "throttle": 0}  # --attn-tune: the built-in choices
    attn, gdn = b["cp_attn"], b["cp_gdn"]
    names = [c["name"] for c in attn["request"]["cases"]]
    assert names == ["T1024_nh2_nkv2_hd64", "T1024_nh2_nkv1_hd64"]
    cp, ser, one = (cp_rows(attn, i) for i in ("ringscan-cp", "ringscan-cp-serial", "ringscan-1gpu"))
    for name, nkv in zip(names, (2, 1)):
        assert cp[name]["gpus"] == ser[name]["gpus"] == 2 and one[name]["gpus"] == 1
        for row in (cp[name], ser[name], one[name]):
            assert 0 < row["ms_fwd"] < row["ms_fwdbwd"] and row["reps"] == 3
            assert row["ring_calls"] == "auto"  # our kernel (cpu's too) skips masked tiles: one call per step
        # 2 forward and 2 backward steps; the last forward step exchanges nothing
        for row, key in ((cp[name], "exposed_wait_ms"), (ser[name], "comm_ms")):
            assert [(s["pass"], s["t"]) for s in row["steps"]] == [("fwd", 0), ("fwd", 1), ("bwd", 0), ("bwd", 1)]
            assert all(s["compute_ms"] > 0 and s[key] >= 0 for s in row["steps"])
        x = cp[name]["exchange_alone"]  # 512 local rows of [k|v], fp32 on the cpu backend, both ways
        assert x["kv_bytes"] == x["dkv_bytes"] == 512 * 2 * nkv * 64 * 4 and x["kv_ms"] > 0
    table = {(t["case"], t["impl"]): t for t in attn["table"]}
    for name in names:
        for impl in ("ringscan-cp", "ringscan-cp-serial"):
            t = table[(name, impl)]
            want = one[name]["ms_fwdbwd"] / (2 * t["ms_fwdbwd"])
            assert abs(t["cp_efficiency_fwdbwd"] - want) <= 1e-6 * want
        assert "cp_efficiency_fwd" not in table[(name, "ringscan-1gpu")]
    assert gdn["gdn_keep"] == "states" and gdn["gdn_chain"] == "staged"  # the defaults
    (gname,) = [c["name"] for c in gdn["request"]["cases"]]
    gcp, gone = cp_rows(gdn, "ringscan-cp")[gname], cp_rows(gdn, "ringscan-1gpu")[gname]
    # cp 2: the chain's steps (cp_gdn.c); one GPU: the scan's, whose scan does nothing there
    chain = ["head", "relay", "tail"]
    phases = ["halo_fwd", "conv_fwd"] + [f"{p}_fwd" for p in chain] + [f"{p}_bwd" for p in chain] + ["conv_bwd",
                                                                                                    "halo_bwd"]
    assert list(gcp["phases"]) == phases and all(gcp["phases"][p] > 0 for p in phases)
    assert all(gcp["phases"][p] < gcp["ms_fwdbwd"] for p in phases)  # each the slowest rank's median
    by_rank = gcp["phases_by_rank"]  # every rank's own: the slowest-rank medians hide which rank waits
    assert len(by_rank) == 2 and all(list(ph) == phases for ph in by_rank)
    assert all(max(ph[p] for ph in by_rank) <= gcp["phases"][p] * (1 + 1e-9) for p in phases)
    assert "phases_by_rank" not in gone
    assert list(gone["phases"]) == ["halo_fwd", "conv_fwd", "scan_fwd", "chunk_fwd", "scan_bwd", "chunk_bwd",
                                    "conv_bwd", "halo_bwd"]
    assert gone["phases"]["scan_fwd"] < 0.01 and gone["phases"]["halo_bwd"] < 0.01  # one rank: none of it runs
    a = gcp["exchange_alone"]  # one chain hand-off: 2 heads x 64 x 64 fp32; 3 halo rows of 2*128+128, 2 fragments
    assert a["state_op"] == "send/recv" and a["state_bytes_per_rank"] == 2 * 64 * 64 * 4 and a["state_ms"] > 0
    assert a["halo_bytes_per_rank"] == 2 * 3 * 384 * 4
    assert "ring attention over 2 ranks" in r.stdout and "exchange alone: K|V" in r.stdout
    assert "exchange alone: states (send/recv)" in r.stdout
    assert "phases ringscan-cp, ms:" in r.stdout and "    rank 1: halo_fwd" in r.stdout


def test_cp_gdn_chain_whole(ringscan, tmp_path):
    # the cp 2 chain with each fragment's pass whole (parallel.gdn_chain_staged false): said in the json
    r = mpirun2(ringscan, "bench", "cp", *CP_TINY, "--parts", "gdn", "--gdn-chain", "whole", "--out", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    gdn = json.loads((tmp_path / "bench.json").read_text())["cp_gdn"]
    assert gdn["gdn_chain"] == "whole"


def test_cp_kda_requests(ringscan, tmp_path):
    r = mpirun2(ringscan, "bench", "cp", "--parts", "gdn,kda", "--write-requests", "--out", tmp_path, "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["request_cp_gdn.json", "request_cp_kda.json"]
    gdn = json.loads((tmp_path / "request_cp_gdn.json").read_text())
    kda = json.loads((tmp_path / "request_cp_kda.json").read_text())
    assert kda["kind"] == "cp_kda" and kda["P"] == 2 and kda["conv_kernel"] == 4 and kda["seed"] == 3
    assert kda["cases"] == gdn["cases"]  # --gdn-T x --heads, one document
    assert "wrote " + str(tmp_path / "request_cp_kda.json") + " (4 cases, P = 2)" in r.stdout


def test_cp_kda_on_cpu_rows(ringscan, tmp_path):
    """bench cp --parts kda on the cpu backend (2 ranks): the KDA layer through lib/cp's cp 2 chain (CpGdnCore.kda),
    its phases, exchanges and one-rank rows, in its own part of bench.json and its own table."""
    r = mpirun2(ringscan, "bench", "cp", *CP_TINY, "--parts", "kda", "--out", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    b = json.loads((tmp_path / "bench.json").read_text())
    assert "cp_gdn" not in b and "cp_attn" not in b
    kda = b["cp_kda"]
    assert kda["request"]["kind"] == "cp_kda" and kda["gdn_keep"] == "states" and kda["gdn_chain"] == "staged"
    assert kda["gdn_cp"] == "chain"
    (name,) = [c["name"] for c in kda["request"]["cases"]]
    assert name == "T512_H2_K64_docs1"
    cp, one = cp_rows(kda, "ringscan-cp")[name], cp_rows(kda, "ringscan-1gpu")[name]
    assert cp["gpus"] == 2 and one["gpus"] == 1
    for row in (cp, one):
        assert 0 < row["ms_fwd"] < row["ms_fwdbwd"] and row["reps"] == 3
    chain = ["head", "relay", "tail"]
    assert list(cp["phases"]) == ["halo_fwd", "conv_fwd"] + [f"{p}_fwd" for p in chain] + \
        [f"{p}_bwd" for p in chain] + ["conv_bwd", "halo_bwd"]
    assert all(v > 0 for v in cp["phases"].values())
    a = cp["exchange_alone"]  # the same state as GDN's: one hand-off of 2 heads x 64 x 64 fp32; the same halo
    assert a["state_op"] == "send/recv" and a["state_bytes_per_rank"] == 2 * 64 * 64 * 4
    assert a["halo_bytes_per_rank"] == 2 * 3 * 384 * 4
    t = {(x["case"], x["impl"]): x for x in kda["table"]}[(name, "ringscan-cp")]
    want = one["ms_fwdbwd"] / (2 * cp["ms_fwdbwd"])
    assert abs(t["cp_efficiency_fwdbwd"] - want) <= 1e-6 * want
    assert "Kimi Delta Attention layer over 2 ranks" in r.stdout and "Gated DeltaNet layer" not in r.stdout


def test_cp_kda_flops_are_gdns(ringscan, tmp_path):
    """The KDA table counts GDN's FLOPs (plan's chunk count, one formula): the FLOPs behind each table's TF/s agree."""
    r = mpirun2(ringscan, "bench", "cp", *CP_TINY, "--parts", "gdn,kda", "--out", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    b = json.loads((tmp_path / "bench.json").read_text())
    flops = {}
    for part in ("cp_gdn", "cp_kda"):
        for t in b[part]["table"]:
            for k in ("fwd", "fwdbwd"):
                flops[(part, t["impl"], k)] = t[f"tflops_per_gpu_{k}"] * t[f"ms_{k}"] * 1e9 * t["gpus"]
    for impl in ("ringscan-cp", "ringscan-1gpu"):
        for k in ("fwd", "fwdbwd"):
            g, d = flops[("cp_gdn", impl, k)], flops[("cp_kda", impl, k)]
            assert g > 0 and abs(d - g) <= 1e-6 * g, (impl, k, g, d)  # bench.json rounds
    assert flops[("cp_kda", "ringscan-cp", "fwdbwd")] > flops[("cp_kda", "ringscan-cp", "fwd")]


def test_cp_kda_peer_started_by_rank0(ringscan, tmp_path):
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE_TORCHRUN)
    fake.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    out = tmp_path / "out"
    r = mpirun2(ringscan, "bench", "cp", *CP_TINY, "--parts", "kda", "--peer", "--python", fake, "--out", out,
                env={"FAKE_PEER_LOG": str(log)})
    assert r.returncode == 0, r.stdout + r.stderr
    (c,) = [json.loads(l) for l in log.read_text().splitlines()]
    assert c["argv"][5:] == ["bench/peer/cp_kda_fla.py", "--request", f"{out}/request_cp_kda.json", "--out",
                             f"{out}/peer_cp_kda.json"]
    part = json.loads((out / "bench.json").read_text())["cp_kda"]
    assert part["peer"]["kind"] == "cp_kda"
    table = {(t["case"], t["impl"]): t for t in part["table"]}
    for name, mine in cp_rows(part, "ringscan-cp").items():
        t = table[(name, "fla-cp")]
        assert abs(t["cp_efficiency_fwdbwd"] - 16.0 / (2 * 10.0)) < 1e-9
        assert abs(t["ratio_fwdbwd"] - 10.0 / mine["ms_fwdbwd"]) <= 1e-6 * t["ratio_fwdbwd"]


@pytest.mark.parametrize("how", ["auto", "scan", "chain"])
def test_cp4_gdn_schedules(ringscan, tmp_path, how):
    """bench cp at cp 4 (cpu, 4 ranks) runs the GDN layer with the schedule training runs there (the hybrid:
    cp_gdn_method) or the one --gdn-cp names, says which in the json, and times its steps and its exchange alone:
    the hybrid's all-gather of one [M | H] slot per rank, the scan's of two, the chain's hand-off of one state."""
    r = run(["mpirun", "-np", "4", "--oversubscribe", ringscan, "bench", "cp", *CP_TINY, "--parts", "gdn",
             "--gdn-cp", how, "--out", tmp_path], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    gdn = json.loads((tmp_path / "bench.json").read_text())["cp_gdn"]
    name = {"auto": "hybrid"}.get(how, how)
    assert gdn["gdn_cp"] == name
    (gname,) = [c["name"] for c in gdn["request"]["cases"]]
    row = cp_rows(gdn, "ringscan-cp")[gname]
    steps = ["scan", "chunk"] if name == "scan" else ["head", "relay", "tail"]
    assert list(row["phases"])[2:2 + 2 * len(steps)] == [f"{s}_{p}" for p in ("fwd", "bwd") for s in steps]
    state, slot = 2 * 64 * 64 * 4, 2 * 64 * (64 + 64) * 4  # 2 heads of 64: a state, a slot [M | H]
    a = row["exchange_alone"]
    assert (a["state_op"], a["state_bytes_per_rank"]) == {"hybrid": ("all-gather", slot), "scan": ("all-gather",
                                                          2 * slot), "chain": ("send/recv", state)}[name]


FAKE_TORCHRUN = r"""#!/usr/bin/env python3
# stands in for `python3 -m torch.distributed.run ... SCRIPT --request REQ --out OUT`: records how it was
# called, then writes a result of the contract with fixed times
import json, os, sys
log = os.environ["FAKE_PEER_LOG"]
with open(log, "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "mpi_env": sorted(k for k in os.environ
                        if k.startswith(("OMPI_COMM_WORLD", "PMIX_RANK")))}) + "\n")
a = sys.argv[1:]
req = json.load(open(a[a.index("--request") + 1]))
fam = "torch-cudnn" if req["kind"] == "cp_attn" else "fla"
rows = []
for c in req["cases"]:
    rows.append({"case": c["name"], "impl": fam + "-cp", "family": fam, "gpus": req["P"], "ms_fwd": 3.0,
                 "ms_fwdbwd": 10.0, "reps": 3})
    rows.append({"case": c["name"], "impl": fam + "-1gpu", "family": fam, "gpus": 1, "ms_fwd": 5.0,
                 "ms_fwdbwd": 16.0, "reps": 3})
json.dump({"schema": "ringscan-bench-result/1", "kind": req["kind"], "device": "cpu", "software": {},
           "notes": ["fake peer"], "results": rows}, open(a[a.index("--out") + 1], "w"))
"""


def test_cp_peers_started_once_by_rank0(ringscan, tmp_path):
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE_TORCHRUN)
    fake.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = dict(os.environ, FAKE_PEER_LOG=str(log))
    out = tmp_path / "out"
    r = mpirun2(ringscan, "bench", "cp", *CP_TINY, "--peer", "--python", fake, "--out", out, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = [json.loads(l) for l in log.read_text().splitlines()]
    assert len(calls) == 2  # cp_attn, cp_gdn: once each, from rank 0 alone
    for c, script, kind in zip(calls, ("cp_attn_torch.py", "cp_gdn_fla.py"), ("cp_attn", "cp_gdn")):
        assert c["argv"][:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        assert c["argv"][5] == f"bench/peer/{script}" and c["argv"][6:] == [
            "--request", f"{out}/request_{kind}.json", "--out", f"{out}/peer_{kind}.json"]
        assert c["mpi_env"] == []  # the launcher's rank variables are dropped
    b = json.loads((out / "bench.json").read_text())
    for part, fam in (("cp_attn", "torch-cudnn"), ("cp_gdn", "fla")):
        table = {(t["case"], t["impl"]): t for t in b[part]["table"]}
        ours = cp_rows(b[part], "ringscan-cp")
        for name, mine in ours.items():
            t = table[(name, fam + "-cp")]
            assert abs(t["cp_efficiency_fwdbwd"] - 16.0 / (2 * 10.0)) < 1e-9
            assert abs(t["ratio_fwdbwd"] - 10.0 / mine["ms_fwdbwd"]) <= 1e-6 * t["ratio_fwdbwd"]
            one = table[(name, fam + "-1gpu")]
            want = 16.0 / cp_rows(b[part], "ringscan-1gpu")[name]["ms_fwdbwd"]
            assert abs(one["ratio_fwdbwd"] - want) <= 1e-6 * want
    assert "peer note: fake peer" in r.stdout
