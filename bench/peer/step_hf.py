"""step_hf.py — the training-step peer of `ringscan bench step --peer`: transformers'
Qwen3NextForCausalLM (or, with STEP_HF_MODEL=qwen3_5, Qwen3_5ForCausalLM) built from the request's
model (the same config as ringscan's), dense MLP in every layer, with flash-linear-attention's kernels
carried in, one optimizer step on one sample of T random token ids on one GPU: tokens/s and peak memory.
A case with cu_seqlens (`bench step --doc-len`) packs documents into the sample as ringscan's step does.

What is configured, exactly:
  - STEP_HF_MODEL=qwen3_next (the default): Qwen3NextConfig(num_experts=0, mlp_only_layers=[0..L-1],
    layer_types from the request, rope_parameters={rope_type: default, rope_theta,
    partial_rotary_factor}, attention_bias=False, attn_implementation="sdpa"): every layer's MLP is
    Qwen3NextMLP (checked), no router, no MoE.
  - STEP_HF_MODEL=qwen3_5 (the Qwen3.5 configs, e.g. bench/gpu_runs.sh qwen35-step): Qwen3_5TextConfig
    with the same keys (Qwen3.5 dense has no experts) and rope_parameters adding Qwen3.5's interleaved
    mrope sections (on text, with the three position ids equal, plain 1-D RoPE, as ringscan computes),
    attn_implementation="sdpa": every layer's MLP is Qwen3_5MLP (checked). Its GDN layer projects
    q|k|v, z, b and a with separate matrices (Qwen3-Next: fused qkvz and ba); the FLA binding below is
    the same.
  - FLA: transformers 5.x resolves its fast kernels when its modeling file is imported (hub kernels,
    else the `fla` package, else the torch reference functions) and calls module-level functions;
    4.x binds instance attributes in __init__. After the model is built this script points both at
    FLA: chunk_gated_delta_rule (behind an adapter that maps transformers' argument names onto FLA's,
    drops keywords FLA does not take, and counts the calls), fused_recurrent_gated_delta_rule, and,
    unless STEP_HF_CONV=torch, the short convolution through FLA's Triton causal_conv1d (causal-conv1d
    is not installed there; STEP_HF_CONV=torch keeps transformers' F.conv1d fallback); a torch gated
    norm is replaced by FLA's FusedRMSNormGated (same weight). After the first step the script stops
    unless FLA's chunk rule ran once per linear-attention layer (no silent torch fallback); the notes
    say how transformers called it, which norm and which conv ran. FLA's #640 guard (Triton < 3.7.1
    on Hopper) is lifted for timing, as in gdn_fla.py.
  - Precision as ringscan trains: fp32 parameters, AdamW (torch, fused) state in fp32, forward and
    backward under torch.autocast(bfloat16).
  - Loss: the last hidden state through FLA's FusedLinearCrossEntropyLoss with lm_head's weight
    (chunked; the 32k x 152k logits never exist, as in ringscan's fused lm_head loss), next-token
    targets, the last token ignored; gradient clipping at the request's grad_clip.
  - Memory: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless the caller set it.
  - Documents (a case's cu_seqlens of more than one document): no token predicts across a document end
    (label -100 there, as ringscan's target -1); FLA's chunk rule and its Triton conv get cu_seqlens (and
    cu_seqlens_cpu, so no host sync), batch 1; each softmax layer's SDPA runs one causal call per document
    (torch.nn.functional.scaled_dot_product_attention wrapped while the case runs; transformers' sdpa path
    must reach it with no mask and is_causal, or the case stops: nothing attends across documents
    silently); positions run 0..T-1 over the sample, as ringscan's bench step gives them. The torch conv
    (STEP_HF_CONV=torch) sees no documents: refused with them.
  - Activation checkpointing: off first; if a warm-up step (at least 2, so that AdamW's state
    exists) runs out of memory, it is turned on (model.gradient_checkpointing_enable,
    non-reentrant) and the warm-up retried. The note says which.
Timing: the warm-up steps, then timed steps (host clock around a synchronised step), the median.
Memory: torch.cuda.max_memory_allocated (peak_alloc_bytes) and max_memory_reserved
(device_used_bytes) over the timed steps, weights and optimizer state included.

Run by `ringscan bench step --peer`; standalone:
  PYTHONPATH=.dev/peer python3 bench/peer/step_hf.py --request runs/bench/request_step.json --out /tmp/hf.json
"""
import gc
import inspect
import os
import statistics
import time

# before torch allocates: PyTorch's expandable segments, the setting long-context training uses against
# fragmentation (the caller's own PYTORCH_CUDA_ALLOC_CONF wins)
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402

import peer_common as pc  # noqa: E402

QKV_NAMES = {"query": "q", "key": "k", "value": "v"}  # transformers' names -> FLA's

# the running case's documents (run_case sets them; None: one document): cu_seqlens on the GPU and the host for
# FLA, (start, end) spans for the attention, and the count of per-document SDPA calls
DOCS = {"cu": None, "cu_cpu": None, "spans": None, "sdpa": [0]}


def fla_adapter(fn, calls=None, seen=None):
    """fn (an FLA function) called the way transformers calls its torch rule: query/key/value renamed
    to q/k/v, keywords FLA does not take dropped (as transformers' own hub wrapper does); the case's
    documents passed as cu_seqlens (DOCS)"""
    params = set(inspect.signature(fn).parameters)

    def call(*args, **kw):
        if seen is not None and not seen:
            seen.append(f"{len(args)} positional + keywords {sorted(kw)}")
        kw = {QKV_NAMES.get(k, k): x for k, x in kw.items()}
        kw = {k: x for k, x in kw.items() if k in params}
        kw.update(doc_kwargs(params))
        if calls is not None:
            calls[0] += 1
        return fn(*args, **kw)

    return call


def doc_kwargs(params):
    """FLA's keywords for the case's documents (none for one document)"""
    if DOCS["cu"] is None:
        return {}
    if "cu_seqlens" not in params:
        pc.usage_exit("an FLA function without cu_seqlens was handed packed documents")
    kw = {"cu_seqlens": DOCS["cu"]}
    if "cu_seqlens_cpu" in params:
        kw["cu_seqlens_cpu"] = DOCS["cu_cpu"]
    return kw


def sdpa_by_document(sdpa):
    """torch's scaled_dot_product_attention, one causal call per document of the running case (DOCS);
    anything else with documents set stops the case (it would attend across documents)"""
    def call(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if DOCS["spans"] is None:
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, **kw)
        T = DOCS["spans"][-1][1]
        if attn_mask is not None or not is_causal or query.shape[2] != T or key.shape[2] != T:
            raise RuntimeError(f"packed documents: SDPA called with a mask ({attn_mask is not None}), is_causal "
                               f"{is_causal}, rows {query.shape[2]} x {key.shape[2]} of {T}: not one causal "
                               "call over the sample, so it cannot be split by document")
        DOCS["sdpa"][0] += 1
        return torch.cat([sdpa(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], dropout_p=dropout_p,
                               is_causal=True, scale=scale, **kw) for a, b in DOCS["spans"]], dim=2)
    return call


# STEP_HF_MODEL -> (transformers' modeling module, config class, model class, MLP class, impl name)
MODELS = {"qwen3_next": ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextConfig",
                         "Qwen3NextForCausalLM", "Qwen3NextMLP", "hf-qwen3next+fla"),
          "qwen3_5": ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                      "Qwen3_5MLP", "hf-qwen3_5+fla")}


def model_kind():
    kind = os.environ.get("STEP_HF_MODEL", "qwen3_next")
    if kind not in MODELS:
        pc.usage_exit(f"STEP_HF_MODEL={kind}: {' or '.join(MODELS)}")
    return kind


def load_model_file(notes):
    """Imports FLA and transformers' modeling file of STEP_HF_MODEL; returns (modeling module, the FLA
    handles, call counter of FLA's chunk_gated_delta_rule)."""
    try:
        from fla.modules import FusedLinearCrossEntropyLoss, FusedRMSNormGated
        from fla.modules.conv.causal_conv1d import causal_conv1d
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError as e:
        pc.usage_exit(f"flash-linear-attention is not importable ({e}); put a snapshot's fla folder on PYTHONPATH")
    pc.fla_lift_guard(notes)
    calls, seen = [0], []
    conv_params = set(inspect.signature(causal_conv1d).parameters)

    def fla_conv(hidden_states, weight, bias=None, activation=None, **kw):
        """transformers' causal_conv1d_fn on (B, D, T) through FLA's Triton causal conv on (B, T, D): the
        transposes are views of the (B, T, D) projection, no copies; the case's documents as cu_seqlens"""
        y, _ = causal_conv1d(hidden_states.transpose(1, 2), weight.to(hidden_states.dtype), bias,
                             activation=activation, **doc_kwargs(conv_params))
        return y.transpose(1, 2)

    import importlib
    try:
        mq = importlib.import_module(MODELS[model_kind()][0])
    except ImportError as e:
        pc.usage_exit(f"transformers has no {MODELS[model_kind()][0]} ({e}); STEP_HF_MODEL={model_kind()} needs it")
    fla_api = {"chunk": fla_adapter(chunk_gated_delta_rule, calls, seen),
               "recurrent": fla_adapter(fused_recurrent_gated_delta_rule), "conv": fla_conv,
               "norm": FusedRMSNormGated, "flce": FusedLinearCrossEntropyLoss, "seen": seen}
    return mq, fla_api, calls


def set_function(module, name, fn):
    """module.name = fn as a plain instance attribute, also where the class bound a kernel module there"""
    module._modules.pop(name, None)
    object.__setattr__(module, name, fn)


def bind_fla(mq, model, fla_api, notes):
    """Points the model's chunk and recurrent rules (and, unless STEP_HF_CONV=torch, its causal conv) at
    FLA's kernels and gives every linear-attention layer FLA's gated RMSNorm; returns the layers bound.
    transformers 5.x calls module-level functions of its modeling file (torch_chunk_gated_delta_rule,
    ...; its hub wrapper would drop keywords it cannot see in a wrapper's signature), 4.x instance
    attributes set in __init__: both are replaced here, after the model is built."""
    conv = os.environ.get("STEP_HF_CONV", "fla")
    if conv not in ("fla", "torch"):
        pc.usage_exit(f"STEP_HF_CONV={conv}: fla or torch")
    bound = []
    if hasattr(mq, "torch_chunk_gated_delta_rule"):  # 5.x
        mq.torch_chunk_gated_delta_rule = fla_api["chunk"]
        mq.torch_recurrent_gated_delta_rule = fla_api["recurrent"]
        bound.append(f"{mq.__name__.rsplit('.', 1)[-1]}.torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule")
        if conv == "fla":
            mq.causal_conv1d_fn = fla_api["conv"]
            bound.append(f"{mq.__name__.rsplit('.', 1)[-1]}.causal_conv1d_fn = FLA's Triton causal_conv1d")
    n = 0
    norm_kinds = set()
    for layer in model.model.layers:
        la = getattr(layer, "linear_attn", None)
        if la is None:
            continue
        if hasattr(la, "chunk_gated_delta_rule"):  # 4.x
            set_function(la, "chunk_gated_delta_rule", fla_api["chunk"])
            for name in ("recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
                if hasattr(la, name):
                    set_function(la, name, fla_api["recurrent"])
            if conv == "fla" and getattr(la, "causal_conv1d_fn", None) is None:
                set_function(la, "causal_conv1d_fn", fla_api["conv"])
            if not n:
                bound.append("GatedDeltaNet.chunk_gated_delta_rule (instance attributes)")
        elif not bound:
            pc.usage_exit(f"{type(la).__name__}: no chunk rule to bind in this transformers "
                          f"(see its {mq.__name__})")
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
    notes.append(f"FLA bound for {n} linear-attention layers: {'; '.join(bound)}; gated norm: "
                 f"{', '.join(sorted(norm_kinds))}; short conv: "
                 f"{'FLA causal_conv1d (Triton)' if conv == 'fla' else 'torch F.conv1d (STEP_HF_CONV=torch)'}")
    return n


def build(mq, c, notes):
    import transformers
    kind = model_kind()
    _, cfg_name, model_name, mlp_name, _ = MODELS[kind]
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
        attention_bias=False, use_cache=False)
    if kind == "qwen3_5":  # the interleaved mrope sections over the rotary half-dims ([11, 11, 10] for 64)
        half = int(m["head_dim"] * m["partial_rotary_factor"]) // 2
        kw["rope_parameters"].update(mrope_section=[half // 3 + (i < half % 3) for i in range(3)],
                                     mrope_interleaved=True)
    else:
        kw.update(num_experts=0, mlp_only_layers=list(range(L)))
    Config = getattr(transformers, cfg_name)
    try:  # transformers 5.x takes partial_rotary_factor inside rope_parameters; older ones as a keyword
        cfg = Config(**kw, partial_rotary_factor=m["partial_rotary_factor"])
    except TypeError:
        cfg = Config(**kw)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = getattr(mq, model_name)(cfg)
    model.train()
    for i, layer in enumerate(model.model.layers):
        if type(layer.mlp).__name__ != mlp_name:
            pc.usage_exit(f"layer {i} has {type(layer.mlp).__name__}, not the dense {mlp_name}")
    rd = model.model.rotary_emb.inv_freq.numel() * 2
    if rd != int(m["head_dim"] * m["partial_rotary_factor"]):
        pc.usage_exit(f"rotary dims {rd}, expected head_dim x partial_rotary_factor")
    n = sum(p.numel() for p in model.parameters())
    dense = "num_experts=0, mlp_only_layers=all" if kind == "qwen3_next" else "dense, all"
    notes.append(f"{model_name}, {n:,} parameters, {dense} {L} layers ({mlp_name}), attention "
                 f"{model.config._attn_implementation}, rotary dims {rd}; "
                 "fp32 params + autocast bf16; "
                 "AdamW(fused)")
    return model, n


def main():
    a = pc.parse_args(__doc__.splitlines()[0])
    req = pc.load_request(a.request, "step")
    notes = []
    mq, fla_api, calls = load_model_file(notes)
    F = torch.nn.functional
    F.scaled_dot_product_attention = sdpa_by_document(F.scaled_dot_product_attention)  # split by document
    import transformers
    device, sw = pc.device_and_software(torch, {"transformers": transformers.__version__})
    results = []
    for c in req["cases"]:
        for key in ("name", "T", "model", "train"):
            if key not in c:
                pc.usage_exit(f"--request {a.request}: a case lacks key {key!r}")
        cu = pc.case_cu_seqlens(c, a.request)
        row = {"case": c["name"], "impl": MODELS[model_kind()][4]}
        try:
            row.update(run_case(mq, fla_api, calls, c, cu, req, notes))
        except (RuntimeError, torch.OutOfMemoryError) as e:
            row["error"] = pc.short_error(e)
        print(row, flush=True)
        results.append(row)
        gc.collect()
        torch.cuda.empty_cache()
    pc.write_result(a.out, "step", device, sw, notes, results)


def set_documents(c, cu, notes):
    """DOCS from the case's cu_seqlens cu (more than one document), else cleared; the labels' mask of
    document ends (True where a token predicts nothing), or None"""
    T = c["T"]
    if len(cu) <= 2:
        DOCS.update(cu=None, cu_cpu=None, spans=None)
        return None
    if os.environ.get("STEP_HF_CONV", "fla") != "fla":
        pc.usage_exit("STEP_HF_CONV=torch convolves across documents: packed documents need FLA's conv")
    DOCS.update(cu=torch.tensor(cu, dtype=torch.long, device="cuda"), cu_cpu=torch.tensor(cu, dtype=torch.long),
                spans=list(zip(cu[:-1], cu[1:])))
    DOCS["sdpa"][0] = 0
    notes.append(f"case {c['name']}: {len(cu) - 1} documents: FLA's chunk rule and conv with cu_seqlens, one causal "
                 "SDPA call per document, no label across a document end")
    ends = torch.zeros(1, T, dtype=torch.bool, device="cuda")
    ends[0, torch.tensor(cu[1:], device="cuda") - 1] = True
    return ends


def run_case(mq, fla_api, calls, c, cu, req, notes):
    T, tr = c["T"], c["train"]
    ends = set_documents(c, cu, notes)
    model, _ = build(mq, c, notes)
    bind_fla(mq, model, fla_api, notes)
    opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"],
                            weight_decay=tr["weight_decay"], fused=True)
    gen = torch.Generator(device="cuda").manual_seed(req["seed"])
    ids = torch.randint(0, c["model"]["vocab_size"], (1, T), device="cuda", generator=gen)
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    if ends is not None:
        labels[ends] = -100  # no token predicts across a document end
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

    # the warm-up steps, at least 2: the second is the first with AdamW's state allocated (the step that
    # ran out of memory at 32k without checkpointing on an 80 GB H100)
    warm = max(req["warmup"], 2)
    try:
        for _ in range(warm):
            step()
        ckpt = False
    except torch.OutOfMemoryError:
        ckpt = True  # retried below, outside this block, so the failed step's tensors are released
    if ckpt:
        opt.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        calls[0] = 0
        for _ in range(warm):
            step()
    torch.cuda.synchronize()
    n_lin = c["model"]["layer_types"].count("linear_attention")
    if calls[0] < warm * n_lin:
        pc.usage_exit(f"FLA's chunk_gated_delta_rule ran {calls[0]} times in {warm} steps of {n_lin} linear-attention layers: "
                      "transformers did not use FLA; refusing to time its torch fallback")
    notes.append(f"FLA chunk_gated_delta_rule calls in the {warm} warm-up steps: {calls[0]} ({n_lin} linear-attention layers); "
                 f"transformers called it with {fla_api['seen'][0] if fla_api['seen'] else '?'}")
    n_attn = c["model"]["layer_types"].count("full_attention")
    if DOCS["spans"] is not None and DOCS["sdpa"][0] < warm * n_attn:
        pc.usage_exit(f"the per-document SDPA ran {DOCS['sdpa'][0]} times in {warm} steps of {n_attn} softmax "
                      "layers: transformers' attention did not reach it; refusing to time attention across documents")
    torch.cuda.reset_peak_memory_stats()
    ms, spent, loss = [], 0.0, float("nan")
    for i in range(req["reps"]):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
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
