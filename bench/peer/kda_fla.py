"""kda_fla.py — the Kimi Delta Attention peer of `ringscan bench kda --peer`: flash-linear-attention's
chunk_kda (Triton), forward and forward+backward, bf16 q/k/v, fp32 g and beta, at the cases of the
request (T, H key = value heads, K, V, cu_seqlens), the inputs equivalent to ringscan's kda_chunk_* calls.

What FLA is asked (fla/ops/kda/chunk.py, chunk_kda; the snapshot in .dev/peer):
  o, _ = chunk_kda(q, k, v, g, beta, scale=K^-0.5, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                   safe_gate=False, disable_recompute=False, state_v_first=SVF[, cu_seqlens, cu_seqlens_cpu])
  o.backward(dO)        (dq, dk, dv, dg, dbeta, as ringscan's kda_chunk_backward)
- g is the natural-log decay of every key channel, (1, T, H, K) fp32, already through the gate (FLA scales it
  by 1/ln 2 and sums it per chunk itself); with use_gate_in_kernel=False FLA computes no gate, as ringscan's
  kda_chunk_* entries compute none (the gate is kda_gates_forward, per token, outside both timings).
- q and k arrive L2-normalised (ringscan's kda_chunk_* take them so); beta arrives after its sigmoid.
- SVF: FLA's state layout ([V, K] when true); its own KDA layer (fla/layers/kda.py) passes true, so this
  script does (PEER_KDA_STATE_V_FIRST=0: false). No initial or final state: the layout is internal.
- disable_recompute=False (FLA's default): its backward recomputes w, u and the chunk states from the Akk
  and Aqk its forward kept; ringscan keeps by --gdn-keep (the request does not say; its bench.json does).
- one document: no cu_seqlens (FLA's dense path); several: cu_seqlens and cu_seqlens_cpu (no host sync).

Inputs (each side draws its own from the same distributions, bench/peer/README.md): q, k uniform in [-1, 1)
then L2-normalised per head; v, dO uniform in [-1, 1); beta uniform in [0.05, 0.95); g = -exp(A_log[h])
softplus(f + dt_bias[h, c]) of f uniform in [-1, 1) (bf16), A_log = log U[1, 16) per head, dt_bias = the
inverse softplus of dt = exp(U[log 0.001, log 0.1)) per channel (FLA's KDA layer initialisation), so g
lies in about [-4, -0.0004].

FLA's issue #640 guard (Triton < 3.7.1 on Hopper refuses the gated chunk_bwd_dqkwg of fla.ops.common.chunk_o)
is not on chunk_kda's path (its backward is fla.ops.kda.chunk_bwd's own kernels): nothing is lifted, and a
note says so. FLA dispatches some KDA functions to other backends where they are usable (tilelang for
chunk_kda_bwd_wy_dqkg_fused where the tilelang package and nvcc are found, FLA_TILELANG=0 refuses it;
flash_kda for inference only): a note names the backends that ran.

Compile time: FLA autotunes every kernel per (H, K, V, varlen) variant. Before timing, one subprocess per
variant runs a small forward+backward at once (all in parallel, autotune results not cached,
FLA_CACHE_RESULTS=0), filling Triton's on-disk cache on all cores, as gdn_fla.py does; PEER_KDA_WARM=0
skips it.

The request is read and checked before torch is imported (a bad request: exit 2 naming the file and key;
torch or FLA missing: exit 2 naming the package).

Run by `ringscan bench kda --peer`; standalone:
  PYTHONPATH=.dev/peer python3 bench/peer/kda_fla.py --request runs/bench/request_kda.json --out /tmp/kda.json
"""
import gc
import json
import math
import os
import sys
import time

import peer_common as pc

CASE_KEYS = ("name", "T", "H", "K", "V", "cu_seqlens")


def check_cases(req, path, one_document=False):
    """Every case as kda_chunk_* and chunk_kda take it, else exit 2 naming the file, case and key."""
    pc.require_case_keys(req, path, CASE_KEYS)
    for c in req["cases"]:
        name = c["name"]
        for key in ("T", "H", "K", "V"):
            if not isinstance(c[key], int) or isinstance(c[key], bool) or c[key] < 1:
                pc.usage_exit(f"--request {path}: case {name!r}: key {key!r} is {c[key]!r}, expected a positive integer")
        if c["K"] > 256:
            pc.usage_exit(f"--request {path}: case {name!r}: key 'K' is {c['K']}, FLA's chunk_kda takes at most 256")
        cu = pc.case_cu_seqlens(c, path)
        if one_document and len(cu) != 2:
            pc.usage_exit(f"--request {path}: case {name!r}: one document expected (cu_seqlens [0, T])")


def import_torch():
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        pc.usage_exit(f"PyTorch is not importable ({e}); the peers need torch with CUDA")
    return torch, F


def import_fla():
    """Imports FLA's chunk_kda; returns (fn, notes, version)."""
    try:
        import fla
        from fla.ops.kda import chunk_kda
    except ImportError as e:
        pc.usage_exit(f"flash-linear-attention is not importable ({e}); put a snapshot's fla folder on PYTHONPATH "
                      "(bench/peer/README.md)")
    notes = ["FLA's issue #640 guard (fla.ops.common.chunk_o, the gated chunk_bwd_dqkwg) is not on chunk_kda's path: "
             "nothing lifted, FLA's own backward as it ships"]
    return chunk_kda, notes, getattr(fla, "__version__", "unknown")


def state_v_first():
    return os.environ.get("PEER_KDA_STATE_V_FIRST", "1") != "0"


def fla_backends_used():
    """The backends FLA's dispatch sent KDA functions to so far (its registry's log), or a reason."""
    try:
        from fla.ops.backends import BackendRegistry
        reg = BackendRegistry._registries.get("kda")
        if reg is None:
            return "FLA's KDA backend registry was not loaded: every function ran FLA's Triton default"
        used = sorted(k.split(":", 1)[1] for k in reg._logged if not k.endswith(":fail"))
        return ("FLA's backend dispatch sent " + ", ".join(used) if used else
                "FLA's backend dispatch sent nothing elsewhere: every KDA function ran FLA's Triton default")
    except Exception as e:  # a private attribute of FLA: a changed snapshot only loses the note's detail
        return f"FLA's backend dispatch: not readable ({pc.short_error(e)})"


def kda_gate(torch, F, T, H, K, gen, gen_params=None, device="cuda"):
    """g (1, T, H, K) fp32 = -exp(A_log[h]) softplus(f + dt_bias[h, c]), f (bf16) uniform in [-1, 1) from gen, A_log
    and dt_bias as FLA's KDA layer initialises them (the header) from gen_params (None: gen)."""
    o = dict(device=device)
    gp = gen_params or gen
    f = torch.empty(1, T, H, K, dtype=torch.bfloat16, **o).uniform_(-1, 1, generator=gen)
    A_log = torch.log(torch.empty(H, dtype=torch.float32, **o).uniform_(1, 16, generator=gp))
    dt = torch.exp(torch.empty(H, K, dtype=torch.float32, **o).uniform_(math.log(0.001), math.log(0.1), generator=gp))
    dt_bias = torch.log(torch.expm1(dt))
    return -torch.exp(A_log)[:, None] * F.softplus(f.float() + dt_bias)


def make_inputs(torch, F, T, H, K, V, gen):
    o = dict(device="cuda")
    q = F.normalize(torch.empty(1, T, H, K, **o).uniform_(-1, 1, generator=gen), dim=-1).to(torch.bfloat16)
    k = F.normalize(torch.empty(1, T, H, K, **o).uniform_(-1, 1, generator=gen), dim=-1).to(torch.bfloat16)
    v = torch.empty(1, T, H, V, dtype=torch.bfloat16, **o).uniform_(-1, 1, generator=gen)
    g = kda_gate(torch, F, T, H, K, gen)
    beta = torch.empty(1, T, H, dtype=torch.float32, **o).uniform_(0.05, 0.95, generator=gen)
    dout = torch.empty(1, T, H, V, dtype=torch.bfloat16, **o).uniform_(-1, 1, generator=gen)
    return [t.requires_grad_() for t in (q, k, v, g, beta)], dout


def run(torch, F, fn, T, H, K, V, cu, gen, req):
    ins, dout = make_inputs(torch, F, T, H, K, V, gen)
    kw = {}
    if len(cu) > 2:
        kw = dict(cu_seqlens=torch.tensor(cu, dtype=torch.long, device="cuda"),
                  cu_seqlens_cpu=torch.tensor(cu, dtype=torch.long))
    svf = state_v_first()

    def fwd():
        o, _ = fn(*ins, scale=K ** -0.5, output_final_state=False, use_qk_l2norm_in_kernel=False,
                  use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, safe_gate=False, disable_recompute=False,
                  state_v_first=svf, **kw)
        return o

    def bwd(o):
        o.backward(dout)

    def clear():
        for t in ins:
            t.grad = None

    try:
        return pc.time_fwd_bwd(torch, fwd, bwd, req, before=clear)
    finally:
        del ins, dout
        gc.collect()
        torch.cuda.empty_cache()



def warm_one(spec):
    H, K, V, varlen = json.loads(spec)
    t0 = time.time()
    torch, F = import_torch()
    fn, _, _ = import_fla()
    T = 8192
    cu = [0, 3000, 5000, T] if varlen else [0, T]
    req = {"warmup": 0, "reps": 1, "max_s": 0}
    run(torch, F, fn, T, H, K, V, cu, torch.Generator(device="cuda").manual_seed(0), req)
    print(f"warm H={H} K={K} V={V} varlen={varlen}: {time.time() - t0:.0f} s", flush=True)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--warm-one":
        warm_one(sys.argv[2])
        return
    a = pc.parse_args(__doc__.splitlines()[0])
    req = pc.load_request(a.request, "kda")
    check_cases(req, a.request)
    torch, F = import_torch()
    fn, notes, fla_version = import_fla()
    device, sw = pc.device_and_software(torch, {"fla": fla_version})
    if os.environ.get("PEER_KDA_WARM", "1") != "0":
        print("compile warm-up: one subprocess per (H, K, V, varlen) variant ...", flush=True)
        s, n = pc.warm_variants(req["cases"], os.path.abspath(__file__), "PEER_KDA_WARM")
        notes.append(f"compile warm-up: {n} variant subprocesses in parallel, {s:.0f} s (not timed)")
        print(notes[-1], flush=True)
    gen = torch.Generator(device="cuda").manual_seed(req["seed"])
    results, t_start = [], time.time()
    for c in req["cases"]:
        row = {"case": c["name"], "impl": "fla-chunk"}
        try:
            ms_f, ms_fb, n = run(torch, F, fn, c["T"], c["H"], c["K"], c["V"], c["cu_seqlens"], gen, req)
            row.update(ms_fwd=ms_f, ms_fwdbwd=ms_fb, reps=n)
            print(f"{c['name']}: fwd {ms_f:.3f} ms, fwd+bwd {ms_fb:.3f} ms", flush=True)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            row["error"] = pc.short_error(e)
            print(f"{c['name']}: {row['error']}", flush=True)
        print(f"  at {time.time() - t_start:.0f} s", flush=True)
        results.append(row)
    notes += [f"chunk_kda(q, k, v, g, beta, scale=K^-0.5, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, "
              f"use_beta_sigmoid_in_kernel=False, safe_gate=False, disable_recompute=False, state_v_first="
              f"{state_v_first()}): the chunk alone, as ringscan's kda_chunk_* (no gate, no L2 norm, no sigmoid "
              "inside); the backward recomputes w, u and the states",
              "q, k (L2-normalised), v bf16; g (natural-log decay per key channel, kimi_linear's gate of random f) "
              "and beta fp32; no initial or final state; one document: no cu_seqlens; several: cu_seqlens + "
              "cu_seqlens_cpu",
              fla_backends_used()]
    pc.write_result(a.out, "kda", device, sw, notes, results)


if __name__ == "__main__":
    main()
