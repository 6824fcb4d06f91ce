"""attn_sdpa.py — the attention peer of `ringscan bench attn --peer`: PyTorch's
torch.nn.functional.scaled_dot_product_attention, once with the flash backend and once with the
cuDNN backend forced (torch.nn.attention.sdpa_kernel), causal, bf16, forward and forward+backward,
at the cases of the request (T, nh, nkv, hd). Inputs as ringscan draws them: q, k, v, dO uniform
in [-1, 1), layout (1, heads, T, hd). GQA through enable_gqa=True; a backend that refuses it gets
k and v expanded to nh heads before the timed region, and the row's note says so. A case with
documents (cu_seqlens of more than one document, `bench attn --doc-len`) runs one causal SDPA call per
document on its slice of the rows (SDPA has no document mask on these backends), the outputs
concatenated; the row's note says so.

Run by `ringscan bench attn --peer` (bench/peer/README.md); standalone:
  python3 bench/peer/attn_sdpa.py --request runs/bench/request_attn.json --out /tmp/sdpa.json
"""
import gc

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import peer_common as pc

BACKENDS = (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION))


def run_case(c, req, gen):
    T, nh, nkv, hd = c["T"], c["nh"], c["nkv"], c["hd"]
    opts = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.empty(1, nh, T, hd, **opts).uniform_(-1, 1, generator=gen).requires_grad_()
    k = torch.empty(1, nkv, T, hd, **opts).uniform_(-1, 1, generator=gen).requires_grad_()
    v = torch.empty(1, nkv, T, hd, **opts).uniform_(-1, 1, generator=gen).requires_grad_()
    dout = torch.empty(1, nh, T, hd, **opts).uniform_(-1, 1, generator=gen)
    cu = c.get("cu_seqlens") or [0, T]
    docs = list(zip(cu[:-1], cu[1:])) if len(cu) > 2 else None
    rows = []
    for impl, backend in BACKENDS:
        row = {"case": c["name"], "impl": impl}
        if docs:
            row["note"] = f"{len(docs)} documents: one causal SDPA call per document, outputs concatenated"
        for expand in ((False, True) if nkv != nh else (False,)):
            kk, vv = k, v
            if expand:
                kk = k.detach().repeat_interleave(nh // nkv, dim=1).requires_grad_()
                vv = v.detach().repeat_interleave(nh // nkv, dim=1).requires_grad_()

            def fwd():
                gqa = kk.shape[1] != nh
                with sdpa_kernel(backend):
                    if not docs:
                        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
                    return torch.cat([F.scaled_dot_product_attention(q[:, :, a:b], kk[:, :, a:b], vv[:, :, a:b],
                                                                     is_causal=True, enable_gqa=gqa)
                                      for a, b in docs], dim=2)

            def bwd(o):
                o.backward(dout)

            def clear():
                for t in (q, kk, vv):
                    t.grad = None

            try:
                ms_f, ms_fb, n = pc.time_fwd_bwd(torch, fwd, bwd, req, before=clear)
                row.update(ms_fwd=ms_f, ms_fwdbwd=ms_fb, reps=n)
                row.pop("error", None)
                if expand:
                    note = ("backend refused enable_gqa: k, v expanded to nh heads before the timed region "
                            f"(first error: {row.pop('first_error')})")
                    row["note"] = row["note"] + "; " + note if "note" in row else note
                break
            except RuntimeError as e:
                row["error"] = pc.short_error(e)
                if not expand:
                    row["first_error"] = row["error"]
            finally:
                clear()
        row.pop("first_error", None)
        rows.append(row)
        print(f"{c['name']} {impl}: " + (f"fwd {row['ms_fwd']:.3f} ms, fwd+bwd {row['ms_fwdbwd']:.3f} ms"
                                          if "ms_fwd" in row else row.get("error", "?")), flush=True)
    del q, k, v, dout
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main():
    a = pc.parse_args(__doc__.splitlines()[0])
    req = pc.load_request(a.request, "attn")
    device, sw = pc.device_and_software(torch, {"cudnn": str(torch.backends.cudnn.version())})
    gen = torch.Generator(device="cuda").manual_seed(req["seed"])
    results = []
    pc.require_case_keys(req, a.request, ("name", "T", "nh", "nkv", "hd"))
    for c in req["cases"]:
        results += run_case(c, req, gen)
    notes = ["layout (1, heads, T, hd) contiguous; is_causal=True; fwd+bwd = o.backward(dO) with fresh grads"]
    pc.write_result(a.out, "attn", device, sw, notes, results)


if __name__ == "__main__":
    main()
