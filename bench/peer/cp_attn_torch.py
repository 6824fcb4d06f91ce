"""cp_attn_torch.py — the ring-attention peer of `ringscan bench cp --peer`: torch's context parallelism
(torch.distributed.tensor.experimental.context_parallel, torch 2.11) with the cuDNN SDPA backend forced
(torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)), causal, bf16, forward and forward+backward,
on the P GPUs of torchrun, and the same attention on one GPU (every rank at once, rank 0's time) for its
CP efficiency. Cases (T, nh, nkv, hd) from the request; inputs as ringscan draws them: q, k, v, dO
uniform in [-1, 1), layout (1, heads, T, hd), the same global tensors on every rank.

What torch is told:
  - a one-dimensional DeviceMesh of the P ranks; `context_parallel(mesh, buffers=[q, k, v, dO],
    buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers={...})` shards the four in place along T with
    torch's default load balancer for causal attention (head-tail, the zigzag: rank r keeps chunks r and
    2P-1-r; `_cp_options.enable_load_balance`, True by default, recorded in the notes) and patches
    F.scaled_dot_product_attention with the ring for as long as the context is open;
  - `set_rotate_method(ROTATE)`: "alltoall" (K|V passed to the next rank each step, the ring ringscan
    runs) by default, PEER_CP_ROTATE=allgather for torch's default (all of K|V gathered at the first
    step); `_set_cp_global_var`, where torch has it, sets flex attention's shard dimension only and is
    not needed for SDPA: not called;
  - GQA: F.scaled_dot_product_attention(..., enable_gqa=True) with nkv K/V heads first; if the CP ring
    or the cuDNN backend refuses it, K and V are expanded to nh heads by repeat_interleave BEFORE
    sharding (outside the timed region; the ring then moves nh/nkv times the bytes) and the row's note
    says so. The one-GPU rows follow the same rule on their own.
The timed region is F.scaled_dot_product_attention(q, k, v, is_causal=True) and o.backward(dO) on the
local shards, fresh gradients each run; before each run every rank syncs and meets the others at a
barrier; a CP run counts as its slowest rank's (peer_common.time_fwd_bwd with dist).

Rows: impl torch-cp-cudnn (gpus P) and torch-1gpu-cudnn (gpus 1), family torch-cudnn (ringscan computes
the efficiency and the ratios). Rank 0 writes the result.

Run by `ringscan bench cp --peer` (bench/peer/README.md); standalone:
  python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/peer/cp_attn_torch.py \\
      --request runs/bench/request_cp_attn.json --out /tmp/cp_attn.json
"""
import gc
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import peer_common as pc

FAMILY = "torch-cudnn"


def import_cp():
    """(context_parallel, set_rotate_method, the options object or None, notes) of this torch."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError as e:
        pc.usage_exit(f"this torch ({torch.__version__}) has no context_parallel ({e}); torch 2.11 is expected")
    mod = None
    for name in ("torch.distributed.tensor.experimental._context_parallel._attention",
                 "torch.distributed.tensor.experimental._attention"):
        try:
            mod = __import__(name, fromlist=["set_rotate_method"])
            break
        except ImportError:
            continue
    if mod is None or not hasattr(mod, "set_rotate_method"):
        pc.usage_exit(f"this torch ({torch.__version__}) has no set_rotate_method")
    return init_device_mesh, context_parallel, mod


def make(shape, gen):
    return torch.empty(*shape, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)


def inputs(c, gen, expand):
    T, nh, nkv, hd = c["T"], c["nh"], c["nkv"], c["hd"]
    q, k, v, dout = make((1, nh, T, hd), gen), make((1, nkv, T, hd), gen), make((1, nkv, T, hd), gen), \
        make((1, nh, T, hd), gen)
    if expand:
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    return q, k, v, dout


def timed(q, k, v, dout, nh, req, dist, slowest):
    """Times sdpa + backward on these tensors (the CP patch applies when the caller opened the context)."""
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    gqa = k.shape[1] != nh

    def fwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def bwd(o):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o.backward(dout)

    def clear():
        for t in (q, k, v):
            t.grad = None

    return pc.time_fwd_bwd(torch, fwd, bwd, req, before=clear, dist=dist, slowest=slowest)


def run_case(c, req, seed, mesh, context_parallel, dist, world):
    rows = []
    for impl, gpus in (("torch-cp-cudnn", world), ("torch-1gpu-cudnn", 1)):
        row = {"case": c["name"], "impl": impl, "family": FAMILY, "gpus": gpus}
        first = None
        for expand in ((False, True) if c["nkv"] != c["nh"] else (False,)):
            gen = torch.Generator(device="cuda").manual_seed(seed)  # the same global tensors on every rank
            q, k, v, dout = inputs(c, gen, expand)
            try:
                if gpus > 1:
                    bufs = [q, k, v, dout]
                    with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2],
                                          no_restore_buffers=set(bufs)):
                        try:  # an error must not escape the context: torch would leave SDPA patched
                            ms_f, ms_fb, n = timed(q, k, v, dout, c["nh"], req, dist, True)
                        except (RuntimeError, NotImplementedError, torch.OutOfMemoryError) as e:
                            raise_after = e
                        else:
                            raise_after = None
                    if raise_after is not None:
                        raise raise_after
                else:
                    ms_f, ms_fb, n = timed(q, k, v, dout, c["nh"], req, dist, False)
                row.update(ms_fwd=ms_f, ms_fwdbwd=ms_fb, reps=n)
                row.pop("error", None)
                if expand:
                    row["note"] = ("enable_gqa refused: k, v expanded to nh heads by repeat_interleave before "
                                   f"sharding, outside the timed region (first error: {first})")
                break
            except (RuntimeError, NotImplementedError, torch.OutOfMemoryError) as e:
                row["error"] = pc.short_error(e)
                first = first or row["error"]
            finally:
                del q, k, v, dout
                gc.collect()
                torch.cuda.empty_cache()
        rows.append(row)
        if dist.get_rank() == 0:
            print(f"{c['name']} {impl}: " + (f"fwd {row['ms_fwd']:.3f} ms, fwd+bwd {row['ms_fwdbwd']:.3f} ms"
                                              if "ms_fwd" in row else row.get("error", "?")), flush=True)
    return rows


def main():
    a = pc.parse_args(__doc__.splitlines()[0])
    req = pc.load_request(a.request, "cp_attn")
    pc.require_case_keys(req, a.request, ("name", "T", "nh", "nkv", "hd"))
    init_device_mesh, context_parallel, cpmod = import_cp()
    dist, rank, world = pc.init_dist(torch, a.request, req)
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
    rotate = os.environ.get("PEER_CP_ROTATE", "alltoall")
    cpmod.set_rotate_method(rotate)
    opts = getattr(cpmod, "_cp_options", None)
    notes = [f"torch context_parallel over {world} GPUs (module {cpmod.__name__}), set_rotate_method({rotate!r}), "
             f"load balance (head-tail zigzag) {getattr(opts, 'enable_load_balance', 'unknown')}, "
             f"fp32 merge {getattr(opts, 'convert_to_f32', 'unknown')}; _set_cp_global_var "
             f"{'present, not needed for SDPA' if hasattr(cpmod, '_set_cp_global_var') else 'absent'}",
             "cuDNN SDPA forced (sdpa_kernel(CUDNN_ATTENTION)), is_causal=True, bf16, layout (1, heads, T, hd); "
             "GQA by enable_gqa=True unless a row's note says K/V were expanded",
             "one-GPU rows: the same call without CP at the full T, every rank at once, rank 0's time"]
    device, sw = pc.device_and_software(torch, {"cudnn": str(torch.backends.cudnn.version())})
    results = []
    for i, c in enumerate(req["cases"]):
        results += run_case(c, req, req["seed"] * 1000 + i, mesh, context_parallel, dist, world)
    pc.finish_dist(dist, rank, a.out, "cp_attn", device, sw, notes, results)


if __name__ == "__main__":
    main()
