"""kda_fla_check.py — ringscan's Kimi Delta Attention kernels beside flash-linear-attention's chunk_kda (issue 39's
"layer parity against fla.ops.kda.chunk_kda"): the chunk alone (o and dq, dk, dv, dg, dbeta), both sides on the
same inputs, both against one float64 reference. Run on the GPU machine with FLA's source on PYTHONPATH:

    PYTHONPATH=$PWD/.dev/peer python3 tests/parity/kda_fla_check.py WORK [--impl fla|none] [--device cuda|cpu]
        [--cases gpu|small] [--ref-device cuda|cpu] [--seed S] [--keep none|wy|states] [--no-warm]
        [--kda-case build/kda_case]

Cases (--cases gpu, the default): 16 heads of K = V = 128 at 4096 tokens as one document and as six (a 1-token
document, boundaries inside chunks and on a chunk edge), and 16 heads of 64 at 2048 tokens in three documents.
--cases small (CI, cpu): 2 heads of 32 at 333 tokens, one document and five.

Inputs (bench/peer/kda_fla.py's distributions, drawn on the cpu from --seed): q, k uniform in [-1, 1) then
L2-normalised per head, v and dout uniform in [-1, 1), all four rounded to bf16; g (fp32) = kimi_linear's gate
-exp(A_log[h]) softplus(f + dt_bias[h, c]) of f uniform in [-1, 1) (kda_fla.kda_gate: A_log, dt_bias as FLA's KDA
layer initialises them; g in about [-4, -0.0004]); beta (fp32) uniform in [0.05, 0.95); no zeros; no initial state.

The three sides, on exactly these values:
  ours  build/kda_case (tests/parity/kda_case.c): kda_chunk_forward then kda_chunk_backward of --device (cuda: bf16
        q, k, v, dout, o, dq, dk, dv; fp32 g, beta, dg, dbeta), the kept buffer as checkpoint.gdn_keep (--keep).
  FLA   fla.ops.kda.chunk_kda(q, k, v, g, beta, scale=K^-0.5, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
        use_beta_sigmoid_in_kernel=False, safe_gate=False, state_v_first as kda_fla.py) on bf16 q, k, v and fp32 g,
        beta, (1, T, H, D); several documents: cu_seqlens (+ cu_seqlens_cpu); o.backward(dout). FLA's conventions,
        read in fla/ops/kda (chunk.py, naive.py, chunk_fwd.py): g is the natural-log decay per key channel (FLA
        multiplies it by 1/ln 2 itself), S = Diag(exp(g_t)) S, o_t = S^T (q_t scale), q and k taken as given: ours.
  ref   tests/parity/ref_model.py's gated_delta_rule in float64, token by token, on --ref-device (checkpointed per
        256 tokens), autograd for the gradients.

Bound, per tensor, relative L2 error ||x - ref|| / ||ref|| (FLA's get_err_ratio): FLA's own tolerances for
chunk_kda against its recurrent reference (tests/ops/test_kda.py test_chunk: o 0.005, dq dk dv 0.008, dg and dbeta
0.02). Checks, one PASS / FAIL line each:
  fla       FLA within the bound on every tensor: the bound is one FLA meets here (and the reference means what
            chunk_kda means: a convention off costs O(1))
  ours      ours within the same bound on every tensor
  ours-fla  ||ours - FLA|| / ||ref|| within the sum of the two bounds (the direct comparison; it follows from the two
            above by the triangle inequality, and is printed for what it measures)
  broken    ours on the last case's inputs with g's heads 0 and 1 swapped, against the unswapped reference: must FAIL
Each line also gives the errors, ours/FLA's ratio and the rounding floor (the error of the reference itself
rounded to the output's type: bf16 for o, dq, dk, dv, what any bf16 output costs; fp32 for dg, dbeta). --impl none (CI: no FLA, no GPU): ours and broken only.

`kda_fla_check: PASS` (exit 0) or `kda_fla_check: FAIL` (exit 1); bad arguments or a missing package exit 2.
FLA compiles its Triton kernels per (H, K, varlen) variant; unless --no-warm, one bench/peer/kda_fla.py --warm-one
subprocess per variant runs first, all in parallel (peer_common.warm_variants), filling Triton's cache.
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "bench" / "peer"))
import safetensors_io as st  # noqa: E402
from relerr import rel  # noqa: E402

NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")
BF16_OUT = ("o", "dq", "dk", "dv")  # bf16 on both sides (cuda)
# FLA's tests/ops/test_kda.py test_chunk tolerances (get_err_ratio), chunk_kda against naive_recurrent_kda
BOUND = {"o": 0.005, "dq": 0.008, "dk": 0.008, "dv": 0.008, "dg": 0.02, "dbeta": 0.02}
CASES = {
    "gpu": [("T4096_H16_K128_docs1", 4096, 16, 128, [0, 4096]),
            ("T4096_H16_K128_docs6", 4096, 16, 128, [0, 1, 700, 1536, 1537, 2600, 4096]),
            ("T2048_H16_K64_docs3", 2048, 16, 64, [0, 640, 1337, 2048])],
    "small": [("T333_H2_K32_docs1", 333, 2, 32, [0, 333]),
              ("T333_H2_K32_docs5", 333, 2, 32, [0, 1, 64, 100, 101, 333])],
}
SEGMENT = 256  # the reference's checkpoint segment (tokens)
RESULTS = []


def say(check, ok, detail=""):
    RESULTS.append(ok)
    print(f"{'PASS' if ok else 'FAIL'}  {check}{': ' + detail if detail else ''}", flush=True)
    return ok


def usage_exit(msg):
    print(f"kda_fla_check: {msg}", file=sys.stderr)
    sys.exit(2)


def bf16_round(a):
    """float32 -> the nearest bf16 value (ties to even), as float32."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


# ---------------------------------------------------------------- inputs and the case file

def make_inputs(torch, T, H, K, seed):
    """numpy float32 q, k, v, dout (bf16-exact), g, beta, drawn on the cpu (the header's distributions)."""
    import torch.nn.functional as F
    import kda_fla
    gen = torch.Generator().manual_seed(seed)

    def bf16(x):
        return x.to(torch.bfloat16).float()

    q = bf16(F.normalize(torch.empty(T, H, K).uniform_(-1, 1, generator=gen), dim=-1))
    k = bf16(F.normalize(torch.empty(T, H, K).uniform_(-1, 1, generator=gen), dim=-1))
    v = bf16(torch.empty(T, H, K).uniform_(-1, 1, generator=gen))
    g = kda_fla.kda_gate(torch, F, T, H, K, gen, device="cpu")[0].float()
    beta = torch.empty(T, H).uniform_(0.05, 0.95, generator=gen)
    dout = bf16(torch.empty(T, H, K).uniform_(-1, 1, generator=gen))
    return {n: t.contiguous().numpy() for n, t in dict(q=q, k=k, v=v, g=g, beta=beta, dout=dout).items()}


def write_case(d, inputs, cu):
    d.mkdir(parents=True, exist_ok=True)
    st.save(d / "inputs.safetensors", dict(inputs, cu_seqlens=np.asarray(cu, np.int32)),
            {"format": "ringscan-kda-case-v1"})


def run_ours(args, d):
    cmd = [str(args.kda_case), str(d), "--device", args.device] + (["--keep", args.keep] if args.keep else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {(r.stdout + r.stderr).strip()[-1500:]}")
    return st.load(d / "outputs.safetensors")


# ---------------------------------------------------------------- the float64 reference

def doc_pos_of(cu, T):
    dp = np.zeros(T, np.int64)
    for a, b in zip(cu, cu[1:]):
        dp[a:b] = np.arange(b - a)
    return dp


def reference(torch, inputs, cu, device):
    """float64 o and d(o . dout)/d{q, k, v, g, beta} by ref_model.gated_delta_rule, token by token, checkpointed per
    SEGMENT tokens (the state carried between segments; doc_pos resets it at every document start)."""
    import ref_model
    from torch.utils.checkpoint import checkpoint
    T = inputs["q"].shape[0]
    x = {n: torch.from_numpy(inputs[n]).to(device, torch.float64)[None].requires_grad_(n != "dout")
         for n in ("q", "k", "v", "g", "beta", "dout")}
    dp = torch.from_numpy(doc_pos_of(cu, T)).to(device)[None]

    def seg(q, k, v, g, beta, dps, S):
        return ref_model.gated_delta_rule(q, k, v, g, beta, dps, initial_state=S, return_state=True)

    H, K, V = x["q"].shape[2], x["q"].shape[3], x["v"].shape[3]
    S = torch.zeros(1, H, K, V, dtype=torch.float64, device=device)
    outs = []
    for a in range(0, T, SEGMENT):
        b = min(T, a + SEGMENT)
        o, S = checkpoint(seg, *(x[n][:, a:b] for n in ("q", "k", "v", "g", "beta")), dp[:, a:b], S,
                          use_reentrant=False)
        outs.append(o)
    o = torch.cat(outs, 1)
    o.backward(x["dout"])
    out = {"o": o.detach()[0]}
    out.update({"d" + n: x[n].grad[0] for n in ("q", "k", "v", "g", "beta")})
    return {n: t.cpu().numpy() for n, t in out.items()}


# ---------------------------------------------------------------- FLA

def run_fla(torch, fn, inputs, cu, dev="cuda"):
    import kda_fla
    bf = {n: torch.from_numpy(inputs[n]).to(dev, torch.bfloat16) for n in ("q", "k", "v", "dout")}
    f32 = {n: torch.from_numpy(inputs[n]).to(dev, torch.float32) for n in ("g", "beta")}
    leaves = {n: t[None].clone().requires_grad_() for n, t in list(bf.items()) + list(f32.items()) if n != "dout"}
    K = inputs["q"].shape[2]
    kw = {}
    if len(cu) > 2:
        kw = dict(cu_seqlens=torch.tensor(cu, dtype=torch.long, device=dev), cu_seqlens_cpu=torch.tensor(cu, dtype=torch.long))
    o, _ = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], scale=K ** -0.5,
              output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
              use_beta_sigmoid_in_kernel=False, safe_gate=False, disable_recompute=False,
              state_v_first=kda_fla.state_v_first(), **kw)
    o.backward(bf["dout"][None])
    if dev == "cuda":
        torch.cuda.synchronize()
    out = {"o": o.detach()[0]}
    out.update({"d" + n: leaves[n].grad[0] for n in ("q", "k", "v", "g", "beta")})
    return {n: t.float().cpu().numpy() for n, t in out.items()}


# ---------------------------------------------------------------- the checks

def compare(name, ref, ours, fla):
    """The header's checks for one case; returns nothing (say() records them)."""
    rows, ok_f, ok_o, ok_d = [], True, True, True
    for n in NAMES:
        e_o = rel(ours[n], ref[n])
        floor = rel(bf16_round(ref[n]), ref[n]) if n in BF16_OUT else rel(ref[n].astype(np.float32), ref[n])
        row = f"{n} ours {e_o:.2e}"
        ok_o &= e_o <= BOUND[n]
        if fla is not None:
            e_f = rel(fla[n], ref[n])
            d = float(np.linalg.norm(np.asarray(ours[n], np.float64) - fla[n])) / max(float(np.linalg.norm(ref[n])),
                                                                                      1e-300)
            ok_f &= e_f <= BOUND[n]
            ok_d &= d <= 2 * BOUND[n]
            row += f" fla {e_f:.2e} (ours/fla {e_o / e_f if e_f > 0 else float('inf'):.2f}) ours-fla {d:.2e}"
        rows.append(row + f" floor {floor:.1e} bound {BOUND[n]:g}")
    detail = "; ".join(rows)
    if fla is not None:
        say(f"{name} fla (FLA within the bound)", ok_f, detail)
    say(f"{name} ours (ours within the bound)", ok_o, detail if fla is None else "")
    if fla is not None:
        say(f"{name} ours-fla (within the sum of the bounds)", ok_d)


def check_broken(args, name, d, inputs, ref):
    """ours on the inputs with g's heads 0 and 1 swapped, against the unswapped reference: must fail"""
    g = inputs["g"].copy()
    g[:, [0, 1]] = g[:, [1, 0]]
    bd = d.parent / (d.name + "-broken")
    write_case(bd, dict(inputs, g=g), args.cu_last)
    got = run_ours(args, bd)
    errs = {n: rel(got[n], ref[n]) for n in NAMES}
    worst = max(NAMES, key=lambda n: errs[n] / BOUND[n])
    say(f"{name} broken (g heads 0, 1 swapped: must fail)", errs[worst] > BOUND[worst],
        f"worst {worst} {errs[worst]:.2e} (bound {BOUND[worst]:g}); " + " ".join(f"{n} {e:.1e}" for n, e in errs.items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--impl", choices=["fla", "none"], default="fla")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--cases", choices=sorted(CASES), default="gpu")
    ap.add_argument("--ref-device", choices=["cuda", "cpu"], default=None, help="default: cuda where it is")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", choices=["none", "wy", "states"], default=None, help="default: the config's gdn_keep")
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--kda-case", type=Path, default=ROOT / "build/kda_case")
    args = ap.parse_args(argv)
    if not args.kda_case.exists():
        usage_exit(f"--kda-case {args.kda_case}: no such file (make {args.kda_case})")
    try:
        import torch
    except ImportError as e:
        usage_exit(f"PyTorch is not importable ({e})")
    cuda_ok = torch.cuda.is_available()
    ref_device = args.ref_device or ("cuda" if cuda_ok else "cpu")
    if (ref_device == "cuda" or args.impl == "fla") and not cuda_ok:
        usage_exit(f"{'--impl fla' if args.impl == 'fla' else '--ref-device cuda'} needs a GPU torch can see")
    fn = None
    if args.impl == "fla":
        import kda_fla
        import peer_common as pc
        fn, notes, version = kda_fla.import_fla()  # exit 2 naming the package where FLA is missing
        print(f"kda_fla_check: FLA {version} from {sys.modules['fla'].__file__}; " + "; ".join(notes), flush=True)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    cases = CASES[args.cases]
    print(f"kda_fla_check: torch {torch.__version__}, ours on {args.device} ({args.kda_case}), reference float64 on "
          f"{ref_device}, impl {args.impl}, {len(cases)} cases, seed {args.seed}", flush=True)
    if fn is not None and not args.no_warm:
        req = [dict(name=n, T=T, H=H, K=K, V=K, cu_seqlens=cu) for n, T, H, K, cu in cases]
        s, n = pc.warm_variants(req, str(ROOT / "bench/peer/kda_fla.py"), "PEER_KDA_WARM")
        print(f"kda_fla_check: FLA compile warm-up, {n} variant subprocesses in parallel, {s:.0f} s", flush=True)
    for i, (name, T, H, K, cu) in enumerate(cases):
        t0 = time.time()
        inputs = make_inputs(torch, T, H, K, args.seed + i)
        d = args.work / f"case-{name}"
        write_case(d, inputs, cu)
        ours = run_ours(args, d)
        ref = reference(torch, inputs, cu, ref_device)
        fla = None
        if fn is not None:
            try:
                fla = run_fla(torch, fn, inputs, cu)
            except Exception as e:  # noqa: BLE001 — FLA refusing a case is a FAIL of that case; ours is still checked
                say(f"{name} fla (FLA ran)", False, f"{type(e).__name__}: {str(e)[:500]}")
        compare(name, ref, ours, fla)
        if i == len(cases) - 1:
            args.cu_last = cu
            check_broken(args, name, d, inputs, ref)
        print(f"  {name}: {time.time() - t0:.1f} s", flush=True)
    if fn is not None:
        import kda_fla
        print(f"kda_fla_check: {kda_fla.fla_backends_used()}", flush=True)
    ok = all(RESULTS)
    print(f"kda_fla_check: {'PASS' if ok else 'FAIL'} ({len(RESULTS)} checks, {RESULTS.count(False)} failed)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
