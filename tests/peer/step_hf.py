"""step_hf.py — the training-step peer of `ringscan bench step --peer`: transformers'
Qwen3NextForCausalLM built from the request's model (the same config as ringscan's), dense MLP in
every layer, with flash-linear-attention's kernels carried in, one optimizer step on one sample of
T random token ids on one GPU: tokens/s and peak memory.

What is configured, exactly:
  - Qwen3NextConfig(num_experts=0, mlp_only_layers=[0..L-1], layer_types from the request,
    rope_parameters={rope_type: default, rope_theta, partial_rotary_factor}, attention_bias=False,
    attn_implementation="sdpa"): every layer's MLP is Qwen3NextMLP (checked), no router, no MoE.
  - FLA: transformers enables its fast path only when the `fla` package has install metadata (4.x)
    or when its hub-kernel loader finds one (5.x); a snapshot folder on PYTHONPATH has neither, and
    5.x binds its kernels to the torch fallbacks. So after the model is built this script sets, on
    every linear-attention layer, FLA's chunk_gated_delta_rule (behind an adapter that maps
    transformers' argument names onto FLA's and counts the calls) and fused_recurrent_gated_delta_rule
    as instance attributes, and replaces a torch gated norm by FLA's FusedRMSNormGated (same weight).
    After the first step the script stops unless FLA's chunk rule ran once per linear-attention
    layer (no silent torch fallback); the notes say how transformers called it and which norm ran.
    causal-conv1d is not installed there: the short convolution is torch's F.conv1d (transformers'
    own fallback). FLA's #640 guard (Triton < 3.7.1 on Hopper) is lifted for timing, as in gdn_fla.py.
  - Precision as ringscan trains: fp32 parameters, AdamW (torch, fused) state in fp32, forward and
    backward under torch.autocast(bfloat16).
  - Loss: the last hidden state through FLA's FusedLinearCrossEntropyLoss with lm_head's weight
    (chunked; the 32k x 152k logits never exist, as in ringscan's fused lm_head loss), next-token
    targets, the last token ignored; gradient clipping at the request's grad_clip.
  - Activation checkpointing: off first; if the first step runs out of memory, it is turned on
    (model.gradient_checkpointing_enable, non-reentrant) and the step retried. The note says which.
Timing: warm-up steps, then timed steps (host clock around a synchronised step), the median.
Memory: torch.cuda.max_memory_allocated (peak_alloc_bytes) and max_memory_reserved
(device_used_bytes) over the timed steps, weights and optimizer state included.

Run by `ringscan bench step --peer`; standalone:
  PYTHONPATH=.dev/peer python3 tests/peer/step_hf.py --request runs/bench/request_step.json --out /tmp/hf.json
"""
import gc
import statistics
import time

import torch

import peer_common as pc

QKV_NAMES = {"query": "q", "key": "k", "value": "v"}  # transformers' names -> FLA's


def load_model_file(notes):
    """Imports FLA and transformers' qwen3_next so that the model can be built with FLA's kernels;
    returns (modeling module, the fla handles, call counter of FLA's chunk_gated_delta_rule)."""
    try:
        import fla.ops.common.chunk_o as chunk_o
        from fla.modules import FusedLinearCrossEntropyLoss, FusedRMSNormGated
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError as e:
        pc.usage_exit(f"flash-linear-attention is not importable ({e}); put a snapshot's fla folder on PYTHONPATH")
    if not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        notes.append("FLA's guard against Triton < 3.7.1 on Hopper (issue #640: wrong gated dqkwg gradients) "
                     "lifted in memory for timing only")
    calls = [0]
    seen = []

    def fla_chunk(*args, **kw):
        """transformers' call of its chunk rule, in either naming (query/key/value or q/k/v), onto FLA's"""
        if not seen:
            seen.append(f"{len(args)} positional + keywords {sorted(kw)}")
        kw = {QKV_NAMES.get(k, k): x for k, x in kw.items()}
        kw.pop("chunk_size", None)  # the torch fallback's argument; FLA's chunk is fixed at 64
        calls[0] += 1
        return chunk_gated_delta_rule(*args, **kw)

    # transformers' availability checks need install metadata, which a snapshot folder lacks: the model
    # file then imports FLA's names itself (4.x) or, in 5.x, binds its hub kernels to the torch fallbacks;
    # either way bind_fla below sets FLA's functions on every GatedDeltaNet after construction
    import transformers.utils.import_utils as iu
    iu.is_flash_linear_attention_available = lambda: True
    from transformers.models.qwen3_next import modeling_qwen3_next as mq
    fla_api = {"chunk": fla_chunk, "recurrent": fused_recurrent_gated_delta_rule, "norm": FusedRMSNormGated,
               "flce": FusedLinearCrossEntropyLoss, "seen": seen}
    return mq, fla_api, calls


def set_function(module, name, fn):
    """module.name = fn as a plain instance attribute, also where the class bound a kernel module there"""
    module._modules.pop(name, None)
    object.__setattr__(module, name, fn)


def bind_fla(model, fla_api, notes):
    """Sets FLA's chunk and fused-recurrent rules and its gated RMSNorm on every linear-attention layer
    (instance attributes override whatever the class bound); returns the number of layers bound."""
    n = 0
    norm_kinds = set()
    for layer in model.model.layers:
        la = getattr(layer, "linear_attn", None)
        if la is None:
            continue
        if not hasattr(la, "chunk_gated_delta_rule"):
            pc.usage_exit(f"{type(la).__name__} has no chunk_gated_delta_rule attribute; this transformers "
                          "calls its rule some other way (see its modeling_qwen3_next.py)")
        set_function(la, "chunk_gated_delta_rule", fla_api["chunk"])
        for name in ("recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
            if hasattr(la, name):
                set_function(la, name, fla_api["recurrent"])
        if not isinstance(la.norm, fla_api["norm"]):
            old = la.norm
            new = fla_api["norm"](old.weight.numel(), eps=getattr(old, "variance_epsilon", getattr(old, "eps", 1e-6)),
                                  activation="silu", device=old.weight.device, dtype=old.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(old.weight)
            norm_kinds.add(f"{type(old).__name__} replaced by FLA's FusedRMSNormGated")
            la.norm = new
        else:
            norm_kinds.add("FLA's FusedRMSNormGated (transformers' own choice)")
        n += 1
    notes.append(f"FLA bound on {n} linear-attention layers: chunk_gated_delta_rule, fused_recurrent_gated_delta_rule; "
                 f"gated norm: {', '.join(sorted(norm_kinds))}")
    return n


def build(mq, c, notes):
    from transformers import Qwen3NextConfig
    m = c["model"]
    L = m["num_hidden_layers"]
    kw = dict(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["intermediate_size"],
        num_hidden_layers=L, layer_types=m["layer_types"], num_attention_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_key_value_heads"], head_dim=m["head_dim"],
        rope_parameters={"rope_type": "default", "rope_theta": m["rope_theta"],
                         "partial_rotary_factor": m["partial_rotary_factor"]},
        linear_num_key_heads=m["linear_num_key_heads"], linear_num_value_heads=m["linear_num_value_heads"],
        linear_key_head_dim=m["linear_key_head_dim"], linear_value_head_dim=m["linear_value_head_dim"],
        linear_conv_kernel_dim=m["linear_conv_kernel_dim"], rms_norm_eps=m["rms_norm_eps"],
        tie_word_embeddings=m["tie_word_embeddings"], hidden_act=m["hidden_act"],
        initializer_range=m["initializer_range"], max_position_embeddings=m["max_position_embeddings"],
        num_experts=0, mlp_only_layers=list(range(L)), attention_bias=False, use_cache=False)
    try:  # transformers 5.x takes partial_rotary_factor inside rope_parameters; older ones as a keyword
        cfg = Qwen3NextConfig(**kw, partial_rotary_factor=m["partial_rotary_factor"])
    except TypeError:
        cfg = Qwen3NextConfig(**kw)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = mq.Qwen3NextForCausalLM(cfg)
    model.train()
    for i, layer in enumerate(model.model.layers):
        if type(layer.mlp).__name__ != "Qwen3NextMLP":
            pc.usage_exit(f"layer {i} has {type(layer.mlp).__name__}, not the dense Qwen3NextMLP")
    rd = model.model.rotary_emb.inv_freq.numel() * 2
    if rd != int(m["head_dim"] * m["partial_rotary_factor"]):
        pc.usage_exit(f"rotary dims {rd}, expected head_dim x partial_rotary_factor")
    n = sum(p.numel() for p in model.parameters())
    notes.append(f"Qwen3NextForCausalLM, {n:,} parameters, num_experts=0, mlp_only_layers=all {L} layers "
                 f"(dense Qwen3NextMLP), attention {model.config._attn_implementation}, rotary dims {rd}; "
                 "fp32 params + autocast bf16; "
                 "AdamW(fused); short conv = torch F.conv1d (causal-conv1d absent)")
    return model, n


def main():
    a = pc.parse_args(__doc__.splitlines()[0])
    req = pc.load_request(a.request, "step")
    notes = []
    mq, fla_api, calls = load_model_file(notes)
    import transformers
    device, sw = pc.device_and_software(torch, {"transformers": transformers.__version__})
    results = []
    for c in req["cases"]:
        for key in ("name", "T", "model", "train"):
            if key not in c:
                pc.usage_exit(f"--request {a.request}: a case lacks key {key!r}")
        row = {"case": c["name"], "impl": "hf-qwen3next+fla"}
        try:
            row.update(run_case(mq, fla_api, calls, c, req, notes))
        except (RuntimeError, torch.OutOfMemoryError) as e:
            row["error"] = pc.short_error(e)
        print(row, flush=True)
        results.append(row)
        gc.collect()
        torch.cuda.empty_cache()
    pc.write_result(a.out, "step", device, sw, notes, results)


def run_case(mq, fla_api, calls, c, req, notes):
    T, tr = c["T"], c["train"]
    model, _ = build(mq, c, notes)
    bind_fla(model, fla_api, notes)
    opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"],
                            weight_decay=tr["weight_decay"], fused=True)
    gen = torch.Generator(device="cuda").manual_seed(req["seed"])
    ids = torch.randint(0, c["model"]["vocab_size"], (1, T), device="cuda", generator=gen)
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    loss_fn = fla_api["flce"]()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model.model(input_ids=ids, use_cache=False).last_hidden_state
            loss = loss_fn(h, labels, model.lm_head.weight.to(torch.bfloat16))
        loss.backward()
        if tr["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tr["grad_clip"])
        opt.step()
        return loss.item()

    try:
        step()
        ckpt = False
    except torch.OutOfMemoryError:
        ckpt = True  # retried below, outside this block, so the failed step's tensors are released
    if ckpt:
        opt.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        step()
    torch.cuda.synchronize()
    n_lin = c["model"]["layer_types"].count("linear_attention")
    if calls[0] < n_lin:
        pc.usage_exit(f"FLA's chunk_gated_delta_rule ran {calls[0]} times in a step of {n_lin} linear-attention layers: "
                      "transformers did not use FLA; refusing to time its torch fallback")
    notes.append(f"FLA chunk_gated_delta_rule calls in the first step: {calls[0]} ({n_lin} linear-attention layers); "
                 f"transformers called it with {fla_api['seen'][0] if fla_api['seen'] else '?'}")
    torch.cuda.reset_peak_memory_stats()
    ms, spent, loss = [], 0.0, float("nan")
    for i in range(max(req["warmup"] - 1, 0) + req["reps"]):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i < req["warmup"] - 1:
            continue
        ms.append(dt * 1e3)
        spent += dt
        if len(ms) >= 3 and spent > req["max_s"]:
            break
    med = statistics.median(ms)
    note = ("activation checkpointing ON (the step without it ran out of memory)" if ckpt
            else "activation checkpointing off (the step fits without it)")
    out = {"ms_step": med, "tokens_per_s": T / (med / 1e3), "peak_alloc_bytes": torch.cuda.max_memory_allocated(),
           "device_used_bytes": torch.cuda.max_memory_reserved(), "reps": len(ms), "loss": loss, "note": note}
    del model, opt
    return out


if __name__ == "__main__":
    main()
