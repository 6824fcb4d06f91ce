"""test_bench.py — `ringscan bench` on a machine without a GPU (CI): the help, strict option
checking (a bad value names its option, exit 2), the clear stop naming the device, and the request
files the peers read (tests/peer/README.md), which need no GPU. The timings themselves run on the
GPU machine (docs/benchmarks.md); no test asserts a time."""
import json
import shutil
import subprocess

import pytest

from conftest import ROOT, run


def gpu_visible():
    return bool(shutil.which("nvidia-smi")) and subprocess.run(["nvidia-smi", "-L"],
                                                               capture_output=True).returncode == 0


def test_help(ringscan):
    r = run([ringscan, "bench", "--help"])
    assert r.returncode == 0
    for s in ("attn|gdn|step|all", "--peer", "--attn-shapes", "--doc-len", "--gdn-keep", "--tokens", "--peak-tflops",
              "backward 2.5x forward", "--write-requests"):
        assert s in r.stdout, s


@pytest.mark.parametrize("args,names", [
    (["bench"], "benchmark"),
    (["bench", "flops"], "benchmark flops"),
    (["bench", "attn", "--T", "100"], "--T 100: must be a multiple of 64"),
    (["bench", "attn", "--T", "32k"], "--T 32k: not an integer"),
    (["bench", "attn", "--T", "64,,128"], "--T 64,,128: empty item"),
    (["bench", "attn", "--attn-shapes", "16/3/128"], "--attn-shapes 16/3/128"),
    (["bench", "attn", "--attn-shapes", "16/2/96"], "HD must be 64, 128 or 256"),
    (["bench", "gdn", "--heads", "0"], "--heads 0: out of range"),
    (["bench", "gdn", "--dim", "96"], "--dim 96"),
    (["bench", "gdn", "--doc-len", "1"], "--doc-len 1"),
    (["bench", "gdn", "--gdn-keep", "all"], "--gdn-keep all: expected none, wy or states"),
    (["bench", "step", "--tokens", "100"], "--tokens 100"),
    (["bench", "step", "--set", "parallel.cp=2"], "--set parallel.cp=2: bench step fixes this key"),
    (["bench", "step", "--set", "nonsense"], "--set nonsense"),
    (["bench", "attn", "--reps"], "--reps"),
    (["bench", "attn", "--reps", "0"], "--reps 0: out of range"),
    (["bench", "attn", "--max-s", "nan"], "--max-s nan"),
    (["bench", "attn", "--frobnicate"], "--frobnicate"),
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
    for what in ("attn", "gdn", "step", "all"):
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
    assert [c["name"] for c in attn["cases"]][:2] == ["T4096_nh16_nkv16_hd128", "T4096_nh16_nkv2_hd128"]
    assert len(attn["cases"]) == 8 and all(c["causal"] for c in attn["cases"])
    gdn = json.loads((tmp_path / "request_gdn.json").read_text())
    assert len(gdn["cases"]) == 4
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
    (c,) = step["cases"]
    assert c["T"] == 4096 and c["name"] == "hybrid-1b-256k-h200x4_T4096"
    m = c["model"]
    assert m["num_hidden_layers"] == len(m["layer_types"]) == 16
    assert m["layer_types"].count("full_attention") == 4 and m["hidden_size"] == 1536
    assert c["train"]["grad_clip"] == 1.0
