"""test_shard.py — parallel.shard (issue 37): the master weights and AdamW moments cut over the world's ranks.

Evidence, each part able to fail:

1. The cpu oracle under mpirun: 3 optimizer steps (grad_accum 2) of the tiny config at (dp, cp) = (2, 1),
   (1, 2), (2, 2), (1, 4) with parallel.shard none, optimizer, gradients and weights; the checkpoint's weights and
   moments (written whole) are compared with none's.
   - optimizer all-reduces the gradients as none does and runs AdamW over each rank's pieces: bitwise.
   - gradients reduce-scatters each layer's gradient in every micro-batch and adds the summed pieces, so
     with 2 micro-batches the sum runs in another order than none's (ranks first, then micro-batches; at 4
     ranks MPI's reduce-scatter also adds the ranks in another order than its all-reduce). Bound: the losses
     equal none's within 1e-6 relative (measured: ~1e-8), the weights within 1e-2 of each tensor's largest
     value (measured 7e-5 .. 4e-3 after 3 steps: AdamW divides by sqrt(v), so the last-bit differences of
     the smallest gradients grow to a step of lr). With one micro-batch at 2 ranks nothing is reordered and
     the stage is bitwise none's: that checks the slots, pieces and offsets exactly.
   - weights holds the layers' compute copy as pieces and all-gathers each layer into one of two slots for
     its forward and again for its backward: the gathered values are the pieces bit for bit, so it gives the
     gradients stage's losses, weights and moments bitwise at every layout (under the none, full and remat
     policies), and none's bitwise with one micro-batch at 2 ranks.
2. The layout: plan counts 12 bytes per parameter over the world for master and moments plus the padding
   of every bucket to world x 64 elements, under gradients the gradient buffers the model allocates and under
   weights the compute copy's (the head's buckets, two slots, the pieces) and the layers' all-gathers per
   step; a world of one says it runs as none; the refusal of a run that does not fit names the stage that
   would (weights too).
3. Sharded checkpoints: one file per rank, listed with its crc32; resume at another world size and shard
   setting (4 ranks gradients -> 2 ranks optimizer -> 1 process none; 4 ranks weights -> 2 ranks weights ->
   1 process none; 2 ranks gradients -> weights, bitwise) continues with the uninterrupted run's
   losses; `export` gathers the slices (bitwise none's export); a rank stopped inside its shard write
   (debug.stall_layer = num_hidden_layers, ended by the watchdog) leaves the previous checkpoint, which
   resume uses and whose next save clears the leftovers; a corrupt shard is named and the previous used;
   `eval` of a checkpoint under weights (the forward alone gathers the layers too) is bitwise none's.
"""
import json
import shutil
import sys

import numpy as np
import pytest

from conftest import ROOT, RINGSCAN, run

sys.path.insert(0, str(ROOT / "tests" / "parity"))
import safetensors_io  # noqa: E402

LAYOUTS = [(2, 1), (1, 2), (2, 2), (1, 4)]
STEPS = 3


def mpirun(n, *args, timeout=600):
    return run(["mpirun", "-np", str(n), "--oversubscribe", *args], timeout=timeout)


def train(out, data, dp, cp, shard, mb=1, extra=(), accum=2):
    args = [RINGSCAN, "train", "configs/tiny-cpu.yaml", "--set", f"data.path={data}", "--set", "data.seq_len=512",
            "--set", f"parallel.dp={dp}", "--set", f"parallel.cp={cp}", "--set", f"data.micro_batch={mb}",
            "--set", f"train.grad_accum={accum}", "--set", f"train.steps={STEPS}", "--set", "train.warmup_steps=2",
            "--set", f"run.out_dir={out}", "--set", "checkpoint.every=0", "--set", f"parallel.shard={shard}", *extra]
    r = mpirun(dp * cp, *args) if dp * cp > 1 else run(args)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [json.loads(l)["loss"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    ck = out / "ckpt" / f"step_{STEPS:08d}"
    if (ck / "model.safetensors").exists():
        w, o = safetensors_io.load(ck / "model.safetensors"), safetensors_io.load(ck / "optim.safetensors")
        return r, losses, {k: v.ravel() for k, v in w.items()}, {k: v.ravel() for k, v in o.items()}
    return r, losses, *gather(ck)


def gather(ck):
    """The whole tensors of a sharded checkpoint: every shard file's slices '<name>@<first>' put in place."""
    pieces = {}
    for f in sorted(ck.glob("shard-*.safetensors")):
        for k, v in safetensors_io.load(f).items():
            name, first = k.rsplit("@", 1)
            pieces.setdefault(name, []).append((int(first), v))
    whole = {}
    for name, ps in pieces.items():
        ps.sort(key=lambda p: p[0])
        assert [p[0] for p in ps] == list(np.cumsum([0] + [p[1].size for p in ps[:-1]])), name  # no gap, no overlap
        whole[name] = np.concatenate([p[1] for p in ps])
    w = {k: v for k, v in whole.items() if not k.startswith(("m.", "v."))}
    return w, {k: v for k, v in whole.items() if k.startswith(("m.", "v."))}


def worst_rel(a, b):
    return max(float(np.abs(a[k].astype(np.float64) - b[k]).max() / (np.abs(a[k]).max() + 1e-30)) for k in a)


@pytest.fixture(scope="module")
def none_runs(tmp_path_factory, recall_tok):
    d = tmp_path_factory.mktemp("none")
    return {lay: train(d / f"{lay[0]}x{lay[1]}", recall_tok, *lay, "none") for lay in LAYOUTS}


@pytest.mark.parametrize("dp, cp", LAYOUTS)
@pytest.mark.parametrize("shard", ["optimizer", "gradients", "weights"])
def test_sharded_steps_match_none(none_runs, tmp_path, recall_tok, dp, cp, shard):
    _, l0, w0, o0 = none_runs[(dp, cp)]
    r, l1, w1, o1 = train(tmp_path / "s", recall_tok, dp, cp, shard)
    assert f"shard: {shard} over the world of {dp * cp} ranks" in r.stdout, r.stdout
    assert sorted(w0) == sorted(w1) and sorted(o0) == sorted(o1)
    if shard == "optimizer":
        assert l0 == l1
        for k in w0:
            assert np.array_equal(w0[k], w1[k]), k
        for k in o0:
            assert np.array_equal(o0[k], o1[k]), k
        return
    assert np.allclose(l1, l0, rtol=1e-6, atol=0), (l0, l1)
    if shard == "weights":  # the same sums as gradients: only where the layers' weights live differs
        _, l2, w2, o2 = train(tmp_path / "g", recall_tok, dp, cp, "gradients")
        assert l1 == l2
        assert all(np.array_equal(w1[k], w2[k]) for k in w2) and all(np.array_equal(o1[k], o2[k]) for k in o2)
    diff = worst_rel(w0, w1)
    print(f"{shard} at ({dp}, {cp}): weights differ from none by {diff:.3g} of a tensor's largest value")
    assert 0 < diff < 1e-2, diff


@pytest.mark.parametrize("dp, cp", [(2, 1), (1, 2)])
@pytest.mark.parametrize("shard", ["gradients", "weights"])
def test_gradients_stage_is_bitwise_with_one_micro_batch(tmp_path, recall_tok, dp, cp, shard):
    """One micro-batch and two ranks: the reduce-scatter adds the same two terms as the all-reduce, and nothing
    else is summed, so the gradients stage (and weights, which gathers the layers' weights bit for bit) gives
    none's weights and moments bitwise."""
    _, l0, w0, o0 = train(tmp_path / "n", recall_tok, dp, cp, "none", accum=1)
    _, l1, w1, o1 = train(tmp_path / "g", recall_tok, dp, cp, shard, accum=1)
    assert l0 == l1
    assert all(np.array_equal(w0[k], w1[k]) for k in w0) and all(np.array_equal(o0[k], o1[k]) for k in o0)


def test_one_rank_runs_as_none(tmp_path, recall_tok):
    r, l1, w1, _ = train(tmp_path / "a", recall_tok, 1, 1, "optimizer")
    assert "parallel.shard = optimizer in a world of one rank: nothing to cut, runs as none" in r.stdout, r.stdout
    _, l0, w0, _ = train(tmp_path / "b", recall_tok, 1, 1, "none")
    assert l0 == l1 and all(np.array_equal(w0[k], w1[k]) for k in w0)


@pytest.mark.parametrize("policy", ["none", "full"])
def test_weights_stage_gathers_every_layer_it_reads(tmp_path, recall_tok, policy):
    """parallel.shard weights under the none policy (the backward reads the forward's kept rows) and full (the
    recompute reruns each layer's forward, attention and CP included) at dp 1 x cp 2, 2 micro-batches: the
    gradients stage's losses, weights and moments bitwise."""
    extra = ("--set", f"checkpoint.activations={policy}")
    _, l0, w0, o0 = train(tmp_path / "g", recall_tok, 1, 2, "gradients", extra=extra)
    r, l1, w1, o1 = train(tmp_path / "w", recall_tok, 1, 2, "weights", extra=extra)
    assert "shard: weights over the world of 2 ranks" in r.stdout, r.stdout
    assert l0 == l1
    assert all(np.array_equal(w0[k], w1[k]) for k in w0) and all(np.array_equal(o0[k], o1[k]) for k in o0)


def plan_json(*sets):
    r = run([RINGSCAN, "plan", "configs/tiny-cpu.yaml", "--json", *sets])
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_plan_counts_each_stage():
    none = plan_json()
    opt = plan_json("--set", "parallel.shard=optimizer")
    W = none["layout"]["world"]
    assert W == 4
    mn, mo = none["memory"]["remat"], opt["memory"]["remat"]
    n = none["parameters"]["total"]
    pad = opt["shard"]["padding"]
    assert pad > 0 and (mo["master weights (fp32)"] * W) % (4 * W * 64) == 0
    buf = mo["master weights (fp32)"] * W // 4
    assert buf >= n + pad
    assert mo["master weights (fp32)"] == 4 * buf // W and mo["AdamW m, v (fp32)"] == 8 * buf // W
    assert mo["gradients (fp32)"] == 4 * buf  # whole: the backward's accumulation target
    mg = plan_json("--set", "parallel.shard=gradients")["memory"]["remat"]
    assert mg["master weights (fp32)"] == mo["master weights (fp32)"]
    assert 4 * buf // W < mg["gradients (fp32)"] < mo["gradients (fp32)"]  # the pieces + head + two layers
    assert mn["master weights (fp32)"] == 4 * n and mn["AdamW m, v (fp32)"] == 8 * n
    assert opt["shard"]["total"]["optimizer"] < opt["shard"]["total"]["none"]
    # weights: the compute copy is what model.c allocates for it: the head's buckets, two layer slots and the
    # rank's pieces, as the gradients (fp32 on cpu: the same bytes)
    w = plan_json("--set", "parallel.shard=weights")
    mw = w["memory"]["remat"]
    assert mw["weights (bf16)"] == mw["gradients (fp32)"] == mg["gradients (fp32)"] < mo["weights (bf16)"]
    t = w["shard"]["total"]
    assert t["weights"] < t["gradients"] < t["optimizer"] < t["none"]
    assert opt["shard"]["weight_gather_bytes_per_step"] == 0
    # the layers' all-gathers: every layer in the step's first forward, and each further micro-batch all but two
    # layers in the forward and all but two in the backward: linear in grad_accum, and each extra micro-batch
    # moves less than twice the layers' compute copy (< the whole buffer)
    g = [plan_json("--set", "parallel.shard=weights", "--set", f"train.grad_accum={a}")["shard"]
         ["weight_gather_bytes_per_step"] for a in (1, 2, 3)]
    assert 0 < g[0] < g[1] < g[2] and g[2] - g[1] == g[1] - g[0]
    assert g[1] - g[0] < 2 * (W - 1) / W * 4 * buf
    r = run([RINGSCAN, "plan", "configs/tiny-cpu.yaml", "--set", "parallel.shard=weights"])
    assert "weights    states" in r.stdout and "the layers' all-gathers" in r.stdout, r.stdout


# checkpoint.input_rows pinned: auto picks whole or chunk by the capacity, so totals planned at one capacity would
# not be the totals at another
PIN = ["--set", "checkpoint.input_rows=chunk"]


def test_refusal_names_the_stage_that_fits(tmp_path, recall_tok):
    """A capacity between the optimizer stage's total and none's: plan and the trainer's refusal say optimizer fits."""
    t = plan_json("--set", "parallel.shard=optimizer", *PIN)["shard"]["total"]
    gib = (t["optimizer"] + t["none"]) / 2 / 2**30
    r = run([RINGSCAN, "plan", "configs/tiny-cpu.yaml", "--set", f"device.memory_gib={gib}", *PIN])
    assert r.returncode == 1, r.stdout
    assert "hint: parallel.shard=optimizer fits" in r.stdout, r.stdout
    r = run([RINGSCAN, "plan", "configs/tiny-cpu.yaml", "--set", f"device.memory_gib={gib}", "--set",
             "parallel.shard=optimizer", *PIN])
    assert r.returncode == 0, r.stdout
    r = mpirun(4, RINGSCAN, "train", "configs/tiny-cpu.yaml", "--set", f"device.memory_gib={gib}", "--set",
               f"data.path={recall_tok}", "--set", f"run.out_dir={tmp_path / 'r'}", *PIN)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "hint: parallel.shard=optimizer fits" in r.stderr, r.stderr
    assert not (tmp_path / "r").exists()


def test_refusal_names_the_weights_stage(tmp_path, recall_tok):
    """A capacity between the weights stage's total and gradients': the hint names weights, which then runs."""
    t = plan_json("--set", "parallel.shard=weights", *PIN)["shard"]["total"]
    gib = (t["weights"] + t["gradients"]) / 2 / 2**30
    r = run([RINGSCAN, "plan", "configs/tiny-cpu.yaml", "--set", f"device.memory_gib={gib}", "--set",
             "parallel.shard=gradients", *PIN])
    assert r.returncode == 1, r.stdout
    assert "hint: parallel.shard=weights fits" in r.stdout, r.stdout
    r = run([RINGSCAN, "plan", "configs/tiny-cpu.yaml", "--set", f"device.memory_gib={gib}", "--set",
             "parallel.shard=weights", *PIN])
    assert r.returncode == 0, r.stdout


# ---------------------------------------------------------------- sharded checkpoints

CK = ["--set", "data.seq_len=512", "--set", "train.steps=6", "--set", "train.warmup_steps=2",
      "--set", "checkpoint.every=3"]


def layout(dp, cp, mb, accum, shard):
    return ["--set", f"parallel.dp={dp}", "--set", f"parallel.cp={cp}", "--set", f"data.micro_batch={mb}",
            "--set", f"train.grad_accum={accum}", "--set", f"parallel.shard={shard}"]


def losses_of(run_dir):
    return {j["step"]: j["loss"] for j in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def full_and_stopped(tmp_path, recall_tok, stage):
    """Two runs at dp 2 x cp 2 under STAGE: one whole (6 steps), one stopped after step 3 with its checkpoint."""
    base = [RINGSCAN, "train", "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}", *CK]
    full, part = tmp_path / "full", tmp_path / "part"
    r = mpirun(4, *base, *layout(2, 2, 1, 2, stage), "--set", f"run.out_dir={full}")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mpirun(4, *base, *layout(2, 2, 1, 2, stage), "--set", f"run.out_dir={part}", "--set", "run.stop_after_step=3")
    assert r.returncode == 0, r.stdout + r.stderr
    return full, part


def resumes_match(part, want, tmp_path, targets):
    """Copies of the stopped run PART resumed at each (ranks, layout) of TARGETS continue steps 4-6 with the
    uninterrupted run's losses WANT (within 1e-5: the sums run in another order at another world)."""
    for i, (n, lay) in enumerate(targets):
        d = tmp_path / f"resume{i}"
        shutil.copytree(part, d)
        args = [RINGSCAN, "resume", d, *lay]
        r = mpirun(n, *args) if n > 1 else run(args)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "resumed from" in r.stdout and "step 3" in r.stdout
        got = losses_of(d)
        for s in (4, 5, 6):
            assert abs(got[s] - want[s]) <= 1e-5 * abs(want[s]), (s, got[s], want[s])


def test_sharded_checkpoint_resumes_at_another_world(tmp_path, recall_tok):
    """dp 2 x cp 2, gradients: each rank writes its own shard file, listed with its crc32, no whole file; resume at
    dp 1 x cp 2 (optimizer) and on one process (none) with the same global batch continues with the
    uninterrupted run's losses."""
    full, part = full_and_stopped(tmp_path, recall_tok, "gradients")
    ck = part / "ckpt" / "step_00000003"
    names = sorted(p.name for p in ck.iterdir())
    assert names == ["manifest.json"] + [f"shard-{r:05d}.safetensors" for r in range(4)], names
    man = json.loads((ck / "manifest.json").read_text())
    assert sorted(f["name"] for f in man["files"]) == names[1:]
    assert all(f["crc32"] > 0 and f["size"] == (ck / f["name"]).stat().st_size for f in man["files"])
    assert man["state"]["shard"] == {"stage": "gradients", "pieces": 4}
    # every rank's file holds only its slices: together they are the whole model once
    w = [safetensors_io.load(ck / n) for n in names[1:]]
    total = sum(v.size for f in w for k, v in f.items() if not k.startswith(("m.", "v.")))
    assert total == plan_json()["parameters"]["total"]
    want = losses_of(full)
    resumes_match(part, want, tmp_path, [(2, layout(1, 2, 1, 4, "optimizer")), (1, layout(1, 1, 2, 2, "none"))])


def test_weights_stage_checkpoint_resumes_at_another_world_and_stage(tmp_path, recall_tok):
    """dp 2 x cp 2, weights: the checkpoint is the master pieces as under the other stages (one shard file per
    rank, stage weights in the manifest); resume at dp 1 x cp 2 (weights: the compute pieces rebuilt from the
    master) and on one process (none) continues with the uninterrupted run's losses; and a gradients checkpoint
    resumes under weights at 2 ranks."""
    full, part = full_and_stopped(tmp_path, recall_tok, "weights")
    base = [RINGSCAN, "train", "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}", *CK]
    ck = part / "ckpt" / "step_00000003"
    assert sorted(p.name for p in ck.iterdir()) == ["manifest.json"] + [f"shard-{r:05d}.safetensors" for r in range(4)]
    assert json.loads((ck / "manifest.json").read_text())["state"]["shard"] == {"stage": "weights", "pieces": 4}
    want = losses_of(full)
    resumes_match(part, want, tmp_path, [(2, layout(1, 2, 1, 4, "weights")), (1, layout(1, 1, 2, 2, "none"))])
    # into the weights stage from a gradients checkpoint at the same layout: the same sums, so bitwise
    g = tmp_path / "g"
    r = mpirun(2, *base, *layout(1, 2, 1, 2, "gradients"), "--set", f"run.out_dir={g}")
    assert r.returncode == 0, r.stdout + r.stderr
    gp = tmp_path / "gp"
    r = mpirun(2, *base, *layout(1, 2, 1, 2, "gradients"), "--set", f"run.out_dir={gp}", "--set",
               "run.stop_after_step=3")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mpirun(2, RINGSCAN, "resume", gp, "--set", "parallel.shard=weights")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "shard: weights over the world of 2 ranks" in r.stdout, r.stdout
    want, got = losses_of(g), losses_of(gp)
    assert all(got[s] == want[s] for s in (4, 5, 6)), (got, want)


def test_eval_under_the_weights_stage(tmp_path, recall_tok):
    """`ringscan eval` runs the forward alone (model_forward), which gathers the layers too: on 2 ranks under
    weights it gives the loss of the same checkpoint evaluated under none, bitwise."""
    d = tmp_path / "r"
    r = mpirun(2, RINGSCAN, "train", "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}", *CK,
               *layout(1, 2, 1, 2, "weights"), "--set", "train.steps=3", "--set", f"run.out_dir={d}")
    assert r.returncode == 0, r.stdout + r.stderr
    loss = {}
    for st in ("weights", "none"):
        out = tmp_path / f"eval-{st}.json"
        r = mpirun(2, RINGSCAN, "eval", d, "--data", recall_tok, "--tokens", "4096", "--out", out, "--set",
                   f"parallel.shard={st}")
        assert r.returncode == 0, r.stdout + r.stderr
        loss[st] = json.loads(out.read_text())["loss"]
    assert loss["weights"] == loss["none"], loss


def test_export_gathers_a_sharded_checkpoint(tmp_path, recall_tok):
    """optimizer is bitwise none on the cpu oracle, so the export of its sharded checkpoint (every rank's slices
    gathered by `export`) is the export of none's whole checkpoint, byte for byte."""
    outs = {}
    for shard in ("none", "optimizer"):
        d = tmp_path / shard
        r = mpirun(2, RINGSCAN, "train", "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}", *CK,
                   *layout(2, 1, 1, 1, shard), "--set", "train.steps=3", "--set", f"run.out_dir={d}")
        assert r.returncode == 0, r.stdout + r.stderr
        outs[shard] = tmp_path / f"hf-{shard}"
        r = run([RINGSCAN, "export", d, outs[shard]])
        assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "optimizer" / "ckpt" / "step_00000003" / "model.safetensors").exists()
    a, b = (outs[s] / "model.safetensors" for s in ("none", "optimizer"))
    assert a.read_bytes() == b.read_bytes()


def test_rank_killed_mid_checkpoint_leaves_the_previous_one(tmp_path, recall_tok):
    """cp 2, optimizer, a checkpoint every 2 steps: rank 1 stops for good while writing its shard of step 4's
    checkpoint (debug.stall_layer = num_hidden_layers), rank 0 having begun it and written its own; the watchdog
    ends both (exit 76). Step 2's checkpoint stays the newest and loadable: resume continues from it with the
    uninterrupted run's losses, and its next save clears the dead save's leftovers."""
    base = [RINGSCAN, "train", "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}", *CK,
            *layout(1, 2, 1, 2, "optimizer"), "--set", "checkpoint.every=2"]
    full, d = tmp_path / "full", tmp_path / "r"
    r = mpirun(2, *base, "--set", f"run.out_dir={full}")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mpirun(2, *base, "--set", f"run.out_dir={d}", "--set", "parallel.comm_timeout_s=3", "--set",
               "debug.stall_rank=1", "--set", "debug.stall_step=4", "--set", "debug.stall_layer=4", timeout=300)
    assert r.returncode == 76, r.stdout + r.stderr
    assert "checkpoint shard" in r.stderr, r.stderr
    ck = d / "ckpt"
    assert (ck / "LATEST").read_text().strip() == "step_00000002"
    (tmp,) = [p for p in ck.iterdir() if p.name.startswith("step_00000004.tmp.")]
    assert (tmp / "shard-00000.safetensors").exists() and not (tmp / "manifest.json").exists()
    r = mpirun(2, RINGSCAN, "resume", d, "--set", "parallel.comm_timeout_s=600", "--set", "debug.stall_rank=-1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from" in r.stdout and "step 2" in r.stdout
    want, got = losses_of(full), losses_of(d)
    assert all(got[s] == want[s] for s in range(3, 7)), (got, want)
    assert not [p for p in ck.iterdir() if ".tmp." in p.name]


def test_corrupt_shard_is_named_and_the_previous_checkpoint_used(tmp_path, recall_tok):
    d = tmp_path / "r"
    r = mpirun(2, RINGSCAN, "train", "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}", *CK,
               *layout(1, 2, 1, 2, "optimizer"), "--set", "checkpoint.every=2", "--set", "train.steps=4",
               "--set", f"run.out_dir={d}")
    assert r.returncode == 0, r.stdout + r.stderr
    bad = d / "ckpt" / "step_00000004" / "shard-00001.safetensors"
    b = bytearray(bad.read_bytes())
    b[-5] ^= 0xFF
    bad.write_bytes(bytes(b))
    r = mpirun(2, RINGSCAN, "resume", d, "--set", "train.steps=5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "shard-00001.safetensors" in r.stderr and "corrupted" in r.stderr, r.stderr
    assert "resumed from" in r.stdout and "step_00000002" in r.stdout, r.stdout
