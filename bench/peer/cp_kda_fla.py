"""cp_kda_fla.py — the Kimi Delta Attention peer of `ringscan bench cp --parts kda --peer`: flash-linear-attention's
own context parallelism for KDA (fla.ops.cp: chunk_kda with a cp_context, as fla/ops/cp/README.md shows) over the
P GPUs of torchrun, forward and forward+backward, and the same layer on one GPU (every rank at once, rank 0's
time) for its CP efficiency. Cases (T, H key = value heads, K, V, one document) from the request.

The timed span is the one `ringscan bench cp` times for its KDA layer (bench/bench_cp.c): the short conv over
[q|k|v] with its halo from the previous rank, then the chunked KDA rule with its state passed across ranks:
  y = fla.modules.convolution.causal_conv1d(x, weight, activation="swish", cp_context=ctx)
  q, k, v = split(y);  o = chunk_kda(q, k, v, g, beta, scale=K^-0.5, use_qk_l2norm_in_kernel=True,
                                     use_gate_in_kernel=False, state_v_first=SVF, cp_context=ctx)
  o.backward(dO)
kimi_linear has three short convolutions (q, k, v); one depthwise conv over [q|k|v] computes the same thing, and
both sides run one. g is precomputed (the gate is per token, outside both timings), beta after its sigmoid.
ctx = fla.ops.cp.build_cp_context([0, T], group=WORLD, conv1d_kernel_size=request's conv_kernel) is built once
per case, outside the timed region (metadata, as ringscan's cp_batch_begin). FLA shards contiguously: rank r
holds tokens [r T/P, (r+1) T/P). The L2 norm of q and k runs inside FLA's call; ringscan runs it as its own
kernel between the conv and the core. SVF as kda_fla.py (FLA's KDA layer's state_v_first=True;
PEER_KDA_STATE_V_FIRST=0: false). The one-GPU rows run the same two calls without cp_context at the full T.

Inputs as ringscan draws them: the pre-conv x and dO uniform in [-1, 1), conv weights in [-0.5, 0.5) (the same
on every rank), beta (fp32) in [0.05, 0.95), g (fp32, (1, T, H, K)) kimi_linear's gate of random f with FLA's
layer initialisation of A_log and dt_bias (kda_fla.kda_gate; A_log, dt_bias the same on every rank); x, q, k, v bf16.

FLA's issue #640 guard is not on this path (kda_fla.py): nothing is lifted. Compile time: FLA autotunes every
kernel per variant on first use, in the warm-up runs (not timed); carry a Triton cache (TRITON_CACHE_DIR) from an
earlier run, or give --peer-timeout room.

Rows: impl fla-cp (gpus P) and fla-1gpu (gpus 1), family fla. Rank 0 writes the result. The request is checked
before torch is imported (a bad one: exit 2 naming the file and key).

Run by `ringscan bench cp --parts kda --peer`; standalone:
  PYTHONPATH=.dev/peer python3 -m torch.distributed.run --standalone --nproc_per_node 2 \\
      bench/peer/cp_kda_fla.py --request runs/bench/request_cp_kda.json --out /tmp/cp_kda.json
"""
import gc

import peer_common as pc
from kda_fla import check_cases, fla_backends_used, import_fla, import_torch, kda_gate, state_v_first

FAMILY = "fla"


def import_fla_cp():
    try:
        from fla.modules.convolution import causal_conv1d
        from fla.ops.cp import build_cp_context
    except ImportError as e:
        pc.usage_exit(f"flash-linear-attention's CP is not importable ({e}); put a snapshot's fla folder (with "
                      "fla/ops/cp) on PYTHONPATH (bench/peer/README.md)")
    return causal_conv1d, build_cp_context


def run(torch, F, c, W, T, seed, rank, req, dist, ctx, fns, slowest):
    """T tokens on this rank (T/P with ctx, the whole sample without); returns (ms_f, ms_fb, runs)."""
    chunk, causal_conv1d = fns
    H, K, V = c["H"], c["K"], c["V"]
    C = 2 * H * K + H * V
    o = dict(device="cuda")
    gw = torch.Generator(device="cuda").manual_seed(seed)  # the weights and gate parameters: the same on every rank
    w = torch.empty(C, W, dtype=torch.bfloat16, **o).uniform_(-0.5, 0.5, generator=gw).requires_grad_()
    gen = torch.Generator(device="cuda").manual_seed(seed * 131 + rank + 1)
    x = torch.empty(1, T, C, dtype=torch.bfloat16, **o).uniform_(-1, 1, generator=gen).requires_grad_()
    g = kda_gate(torch, F, T, H, K, gen, gw).requires_grad_()
    beta = torch.empty(1, T, H, dtype=torch.float32, **o).uniform_(0.05, 0.95, generator=gen).requires_grad_()
    dout = torch.empty(1, T, H, V, dtype=torch.bfloat16, **o).uniform_(-1, 1, generator=gen)
    kw = {"cp_context": ctx} if ctx is not None else {}
    svf = state_v_first()

    def fwd():
        y, _ = causal_conv1d(x=x, weight=w, bias=None, activation="swish", **kw)
        q, k, v = y.split([H * K, H * K, H * V], dim=-1)
        out, _ = chunk(q.reshape(1, T, H, K), k.reshape(1, T, H, K), v.reshape(1, T, H, V), g, beta,
                       scale=K ** -0.5, output_final_state=False, use_qk_l2norm_in_kernel=True,
                       use_gate_in_kernel=False, state_v_first=svf, **kw)
        return out

    def bwd(out):
        out.backward(dout)

    def clear():
        for t in (x, w, g, beta):
            t.grad = None

    return pc.time_fwd_bwd(torch, fwd, bwd, req, before=clear, dist=dist, slowest=slowest)


def main():
    a = pc.parse_args(__doc__.splitlines()[0])
    req = pc.load_request(a.request, "cp_kda")
    check_cases(req, a.request, one_document=True)
    if not isinstance(req.get("conv_kernel"), int) or req["conv_kernel"] < 1:
        pc.usage_exit(f"--request {a.request}: key 'conv_kernel' missing or not a positive integer")
    if not isinstance(req.get("P"), int) or req["P"] < 1:
        pc.usage_exit(f"--request {a.request}: key 'P' missing or not a positive integer")
    for c in req["cases"]:
        if c["T"] % req["P"]:
            pc.usage_exit(f"--request {a.request}: case {c['name']!r}: T = {c['T']} is not divisible by P = {req['P']}")
    torch, F = import_torch()
    chunk, notes, fla_version = import_fla()
    causal_conv1d, build_cp_context = import_fla_cp()
    dist, rank, world = pc.init_dist(torch, a.request, req)
    device, sw = pc.device_and_software(torch, {"fla": fla_version})
    W = req["conv_kernel"]
    notes += [f"fla.ops.cp over {world} GPUs, contiguous shards of T/{world} tokens; causal_conv1d(activation="
              f"'swish', width {W}) over [q|k|v] and chunk_kda(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=False, "
              f"state_v_first={state_v_first()}) with one cp_context per case, built outside the timed region",
              "q, k, v bf16 (from the conv); g (natural-log decay per key channel, kimi_linear's gate of random f) and "
              "beta fp32; scale K^-0.5, no initial or final state",
              "one-GPU rows: the same calls without cp_context at the full T, every rank at once, rank 0's time"]
    results = []
    for i, c in enumerate(req["cases"]):
        T, seed = c["T"], req["seed"] * 1000 + i
        cu = [0, T]
        ctx = build_cp_context(torch.tensor(cu, dtype=torch.long, device="cuda"), group=dist.group.WORLD,
                               conv1d_kernel_size=W, cu_seqlens_cpu=torch.tensor(cu, dtype=torch.long))
        for impl, gpus, ctx_, n, slowest in (("fla-cp", world, ctx, T // world, True),
                                             ("fla-1gpu", 1, None, T, False)):
            row = {"case": c["name"], "impl": impl, "family": FAMILY, "gpus": gpus}
            try:
                ms_f, ms_fb, reps = run(torch, F, c, W, n, seed, rank, req, dist, ctx_, (chunk, causal_conv1d),
                                        slowest)
                row.update(ms_fwd=ms_f, ms_fwdbwd=ms_fb, reps=reps)
            except (RuntimeError, torch.OutOfMemoryError) as e:
                row["error"] = pc.short_error(e)
            gc.collect()  # the case's tensors went with run()'s frame
            torch.cuda.empty_cache()
            if rank == 0:
                print(f"{c['name']} {impl}: " + (f"fwd {row['ms_fwd']:.3f} ms, fwd+bwd {row['ms_fwdbwd']:.3f} ms"
                                                  if "ms_fwd" in row else row["error"]), flush=True)
            results.append(row)
    notes.append(fla_backends_used())
    pc.finish_dist(dist, rank, a.out, "cp_kda", device, sw, notes, results)


if __name__ == "__main__":
    main()
