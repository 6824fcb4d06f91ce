"""gdn_fla.py — the Gated DeltaNet peer of `ringscan bench gdn --peer`: flash-linear-attention's
chunk_gated_delta_rule (Triton), forward and forward+backward, bf16 q/k/v/beta, fp32 g, at the
cases of the request (T, H key = value heads, K, V, cu_seqlens). Inputs as ringscan draws them: q, k
uniform in [-1, 1) then L2-normalised per head; v, dO uniform in [-1, 1); g uniform in
[-0.1, -0.001); beta uniform in [0.05, 0.95). A case with one document passes no cu_seqlens (FLA's
dense path); several documents go through cu_seqlens (and cu_seqlens_cpu, so no host sync).

FLA is not installed on the GPU machine: put a snapshot's `fla` folder on PYTHONPATH
(bench/peer/README.md). With Triton < 3.7.1 on Hopper, FLA refuses its gated backward
(chunk_bwd_dqkwg, FLA issue #640: wrong gradients there). For TIMING ONLY this script lifts that
guard at import (it sets fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True in memory; no file is
edited) and says so in the result's notes; the gradients of such a run are not trusted.

Compile time: FLA autotunes every kernel per (H, K, V, varlen) variant. Before timing, one
subprocess per variant runs a small forward+backward at once (all in parallel, autotune results
not cached, FLA_CACHE_RESULTS=0), so Triton's on-disk kernel cache is filled on all CPU cores;
the timed process then autotunes serially on an otherwise idle GPU with every kernel already
compiled. Set PEER_GDN_WARM=0 to skip.

Run by `ringscan bench gdn --peer`; standalone:
  PYTHONPATH=.dev/peer python3 bench/peer/gdn_fla.py --request runs/bench/request_gdn.json --out /tmp/fla.json
"""
import gc
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import peer_common as pc

def import_fla():
    """Imports FLA, lifting the #640 guard when this Triton would trip it; returns (fn, notes, version)."""
    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:
        pc.usage_exit(f"flash-linear-attention is not importable ({e}); put a snapshot's fla folder on PYTHONPATH "
                      "(bench/peer/README.md)")
    notes = []
    pc.fla_lift_guard(notes)
    return chunk_gated_delta_rule, notes, getattr(fla, "__version__", "unknown")


def make_inputs(T, H, K, V, gen):
    o = dict(device="cuda")
    q = F.normalize(torch.empty(1, T, H, K, **o).uniform_(-1, 1, generator=gen), dim=-1).to(torch.bfloat16)
    k = F.normalize(torch.empty(1, T, H, K, **o).uniform_(-1, 1, generator=gen), dim=-1).to(torch.bfloat16)
    v = torch.empty(1, T, H, V, dtype=torch.bfloat16, **o).uniform_(-1, 1, generator=gen)
    g = torch.empty(1, T, H, dtype=torch.float32, **o).uniform_(-0.1, -0.001, generator=gen)
    beta = torch.empty(1, T, H, dtype=torch.bfloat16, **o).uniform_(0.05, 0.95, generator=gen)
    dout = torch.empty(1, T, H, V, dtype=torch.bfloat16, **o).uniform_(-1, 1, generator=gen)
    return [t.requires_grad_() for t in (q, k, v, g, beta)], dout


def run(fn, T, H, K, V, cu, gen, req):
    ins, dout = make_inputs(T, H, K, V, gen)
    kw = {}
    if len(cu) > 2:
        kw = dict(cu_seqlens=torch.tensor(cu, dtype=torch.long, device="cuda"),
                  cu_seqlens_cpu=torch.tensor(cu, dtype=torch.long))

    def fwd():
        o, _ = fn(*ins, scale=K ** -0.5, output_final_state=False, **kw)
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
    fn, _, _ = import_fla()
    T = 8192
    cu = [0, 3000, 5000, T] if varlen else [0, T]
    req = {"warmup": 0, "reps": 1, "max_s": 0}
    run(fn, T, H, K, V, cu, torch.Generator(device="cuda").manual_seed(0), req)
    print(f"warm H={H} K={K} V={V} varlen={varlen}: {time.time() - t0:.0f} s", flush=True)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--warm-one":
        warm_one(sys.argv[2])
        return
    a = pc.parse_args(__doc__.splitlines()[0])
    req = pc.load_request(a.request, "gdn")
    pc.require_case_keys(req, a.request, ("name", "T", "H", "K", "V", "cu_seqlens"))
    fn, notes, fla_version = import_fla()
    device, sw = pc.device_and_software(torch, {"fla": fla_version})
    if os.environ.get("PEER_GDN_WARM", "1") != "0":
        print("compile warm-up: one subprocess per (H, K, V, varlen) variant ...", flush=True)
        s, n = pc.warm_variants(req["cases"], os.path.abspath(__file__), "PEER_GDN_WARM")
        notes.append(f"compile warm-up: {n} variant subprocesses in parallel, {s:.0f} s (not timed)")
        print(notes[-1], flush=True)
    gen = torch.Generator(device="cuda").manual_seed(req["seed"])
    results, t_start = [], time.time()
    for c in req["cases"]:
        row = {"case": c["name"], "impl": "fla-chunk"}
        try:
            ms_f, ms_fb, n = run(fn, c["T"], c["H"], c["K"], c["V"], c["cu_seqlens"], gen, req)
            row.update(ms_fwd=ms_f, ms_fwdbwd=ms_fb, reps=n)
            print(f"{c['name']}: fwd {ms_f:.3f} ms, fwd+bwd {ms_fb:.3f} ms", flush=True)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            row["error"] = pc.short_error(e)
            print(f"{c['name']}: {row['error']}", flush=True)
        print(f"  at {time.time() - t_start:.0f} s", flush=True)
        results.append(row)
    notes.append("q, k, v, beta bf16, g fp32, scale K^-0.5, no initial or final state; "
                 "one document: no cu_seqlens; several: cu_seqlens + cu_seqlens_cpu")
    pc.write_result(a.out, "gdn", device, sw, notes, results)


if __name__ == "__main__":
    main()
