/*
 * config_schema.c — THE table of configuration keys.
 *
 * One row per key: path (which is also the C member designator in Config),
 * type, default (YAML text), range or enum names, unit, owning module and a
 * one-line doc. The loader, `--set`, validation of single values, `config
 * dump`, `config docs`, `--help` and the resolved-config table all read this
 * table; nothing else lists keys. Each row's C member type is checked at
 * compile time against the row's type (CONFIG_TYPECHECK below), so the table
 * and the structs in config.h cannot drift.
 *
 * Model keys use the Hugging Face Qwen3NextConfig names and defaults
 * (docs/design/model.md), except that the MLP is dense everywhere.
 *
 * Cross-key rules (divisibility, world size, ...) are in config_validate.c.
 */
#include "config.h"

#include <stddef.h>
#include <string.h>

const char *const device_kind_names[] = {"cpu", "cuda", NULL};
const char *const act_policy_names[]  = {"none", "full", "remat", NULL};
const char *const gdn_keep_names[]    = {"none", "wy", "states", NULL};
const char *const offload_names[]     = {"none", "host", NULL};
const char *const input_rows_names[]  = {"auto", "chunk", "whole", NULL};
const char *const mlp_act_names[]     = {"auto", "kept", "rewritten", NULL};
const char *const shard_names[]       = {"none", "optimizer", "gradients", "weights", NULL};
static const char *const int_auto_names[] = {"auto", NULL};
const char *const ring_calls_names[]  = {"auto", "pairs", "steps", NULL};
const char *const lr_schedule_names[] = {"cosine", "wsd", "constant", NULL};
const char *const data_format_names[] = {"flat", "megatron", NULL};
const char *const layer_kind_names[]  = {"linear_attention", "full_attention", NULL};
const char *const hidden_act_names[]  = {"silu", NULL};
const char *const linear_attention_names[] = {"gdn", "kda", NULL};
const char *const slurm_launcher_names[] = {"srun", "mpirun", NULL};
const char *const attn_kernel_names[] = {"ringscan", "cudnn", "cudnn_det", "auto", NULL};

_Static_assert(sizeof device_kind_names / sizeof *device_kind_names == DEVICE_KIND_COUNT + 1, "names");
_Static_assert(sizeof act_policy_names / sizeof *act_policy_names == ACT_POLICY_COUNT + 1, "names");
_Static_assert(sizeof gdn_keep_names / sizeof *gdn_keep_names == GDN_KEEP_COUNT + 1, "names");
_Static_assert(sizeof offload_names / sizeof *offload_names == OFFLOAD_COUNT + 1, "names");
_Static_assert(sizeof input_rows_names / sizeof *input_rows_names == INPUT_ROWS_COUNT + 1, "names");
_Static_assert(sizeof mlp_act_names / sizeof *mlp_act_names == MLP_ACT_COUNT + 1, "names");
_Static_assert(sizeof shard_names / sizeof *shard_names == SHARD_COUNT + 1, "names");
_Static_assert(sizeof ring_calls_names / sizeof *ring_calls_names == RING_CALLS_COUNT + 1, "names");
_Static_assert(sizeof lr_schedule_names / sizeof *lr_schedule_names == LR_SCHEDULE_COUNT + 1, "names");
_Static_assert(sizeof data_format_names / sizeof *data_format_names == DATA_FORMAT_COUNT + 1, "names");
_Static_assert(sizeof layer_kind_names / sizeof *layer_kind_names == LAYER_KIND_COUNT + 1, "names");
_Static_assert(sizeof hidden_act_names / sizeof *hidden_act_names == HIDDEN_ACT_COUNT + 1, "names");
_Static_assert(sizeof linear_attention_names / sizeof *linear_attention_names == LINEAR_ATTN_COUNT + 1, "names");
_Static_assert(sizeof slurm_launcher_names / sizeof *slurm_launcher_names == SLURM_LAUNCHER_COUNT + 1, "names");
_Static_assert(sizeof attn_kernel_names / sizeof *attn_kernel_names == ATTN_KERNEL_COUNT + 1, "names");

const char *const config_sections[] = {
    "run", "model", "data", "parallel", "train", "checkpoint", "slurm", "device", "debug", NULL,
};
const char *const config_section_docs[] = {
    "the run: where it writes, its seed, when it stops",
    "the model, with Hugging Face Qwen3-Next key names (dense MLP in every layer)",
    "training data: the token file and how samples are cut from it",
    "how ranks are arranged: world = dp x cp",
    "optimizer, schedule and batch",
    "checkpoint files and activation checkpointing",
    "the Slurm job `ringscan submit` renders",
    "the device the run uses",
    "for tests only: make one rank stall, to exercise the communication watchdog",
    NULL,
};

/* C type of each ConfigType: a row whose member has another type fails to compile. */
#define CONFIG_TYPECHECK_INT(m)       _Generic((m), int64_t: 1, default: 0)
#define CONFIG_TYPECHECK_FLOAT(m)     _Generic((m), double: 1, default: 0)
#define CONFIG_TYPECHECK_BOOL(m)      _Generic((m), bool: 1, default: 0)
#define CONFIG_TYPECHECK_STR(m)       _Generic((m), char *: 1, default: 0)
#define CONFIG_TYPECHECK_ENUM(m)      _Generic((m), int32_t: 1, default: 0)
#define CONFIG_TYPECHECK_ENUM_LIST(m) _Generic((m), ConfigEnumList: 1, default: 0)

#define CONFIG_ROW(path_, type_, def_, min_, max_, names_, charset_, unit_, module_, doc_)         \
    {#path_, CONFIG_TYPE_##type_,                                                                 \
     offsetof(Config, path_) +                                                                    \
         0 * sizeof(char[CONFIG_TYPECHECK_##type_(((Config *)0)->path_) ? 1 : -1]),               \
     def_, min_, max_, names_, CONFIG_CHARSET_##charset_, unit_, module_, doc_}

#define INT(p, def, lo, hi, unit, mod, doc)  CONFIG_ROW(p, INT, def, lo, hi, NULL, ANY, unit, mod, doc)
/* an integer or the word auto (stored as CONFIG_AUTO) */
#define INTA(p, def, lo, hi, unit, mod, doc) CONFIG_ROW(p, INT, def, lo, hi, int_auto_names, ANY, unit, mod, doc)
#define FLT(p, def, lo, hi, unit, mod, doc)  CONFIG_ROW(p, FLOAT, def, lo, hi, NULL, ANY, unit, mod, doc)
#define BOOL(p, def, mod, doc)               CONFIG_ROW(p, BOOL, def, 0, 0, NULL, ANY, "", mod, doc)
#define STR(p, def, cs, mod, doc)            CONFIG_ROW(p, STR, def, 0, 0, NULL, cs, "", mod, doc)
#define ENUM(p, def, names, mod, doc)        CONFIG_ROW(p, ENUM, def, 0, 0, names, ANY, "", mod, doc)
#define ENUMS(p, def, names, mod, doc)       CONFIG_ROW(p, ENUM_LIST, def, 0, 0, names, ANY, "", mod, doc)

#define BIG 9.0e18 /* "no upper bound" for integers */

const ConfigKey config_schema[] = {
    /* ---- run ---- */
    STR(run.name, "ringscan", NAME, "train", "run name; also the Slurm job name"),
    STR(run.out_dir, "runs/ringscan", PATH, "train",
        "run directory: config.resolved.yaml, log.txt, metrics.jsonl, ckpt/"),
    INT(run.seed, "1234", 0, BIG, "", "train", "seed for initialisation and data order"),
    INT(run.stop_after_step, "0", 0, BIG, "steps", "train",
        "checkpoint and stop cleanly after this step (0: run to train.steps)"),
    INT(run.log_every, "1", 1, 1e9, "steps", "train", "steps between log lines"),

    /* ---- model (HF Qwen3NextConfig names) ---- */
    INT(model.vocab_size, "151936", 2, 1 << 24, "tokens", "model", "vocabulary size"),
    INT(model.hidden_size, "2048", 8, 65536, "", "model", "width of the residual stream"),
    INT(model.intermediate_size, "5632", 8, 1 << 20, "", "model", "width of the dense SwiGLU MLP"),
    INT(model.num_hidden_layers, "48", 1, CONFIG_LIST_MAX, "", "model", "number of decoder layers"),
    INT(model.num_attention_heads, "16", 1, 1024, "", "model", "query heads of full-attention layers"),
    INT(model.num_key_value_heads, "2", 1, 1024, "", "model", "key/value heads of full-attention layers (GQA)"),
    INT(model.head_dim, "256", 8, 1024, "", "model", "head width of full-attention layers (not hidden/heads)"),
    INT(model.linear_num_key_heads, "16", 1, 1024, "", "model", "query/key heads of Gated DeltaNet layers"),
    INT(model.linear_num_value_heads, "32", 1, 4096, "", "model",
        "value heads of Gated DeltaNet layers (a multiple of the key heads)"),
    INT(model.linear_key_head_dim, "128", 8, 1024, "", "model", "key head width of Gated DeltaNet layers"),
    INT(model.linear_value_head_dim, "128", 8, 1024, "", "model", "value head width of Gated DeltaNet layers"),
    INT(model.linear_conv_kernel_dim, "4", 1, 16, "tokens", "model", "causal depthwise conv width over [q|k|v]"),
    ENUM(model.linear_attention, "gdn", linear_attention_names, "model",
         "the mixer of every linear_attention layer: gdn (Gated DeltaNet, Qwen3-Next's) or kda (Kimi Delta "
         "Attention, kimi_linear's: a decay per key channel, low-rank decay and output gates, a sigmoid-gated "
         "output norm; needs linear_num_key_heads = linear_num_value_heads and linear_key_head_dim = "
         "linear_value_head_dim; on cuda head dims 64 or 128; docs/design/kda.md)"),
    INT(model.full_attention_interval, "4", 1, CONFIG_LIST_MAX, "layers", "model",
        "every Nth layer is full attention (used when layer_types is empty)"),
    ENUMS(model.layer_types, "[]", layer_kind_names, "model",
          "explicit kind of every layer; empty: derived from full_attention_interval"),
    INT(model.max_position_embeddings, "0", 0, 1LL << 40, "tokens", "model",
        "written to the exported config.json; 0: data.seq_len"),
    FLT(model.rms_norm_eps, "1e-6", 1e-12, 1e-2, "", "model", "epsilon of every RMSNorm"),
    FLT(model.rope_theta, "10000.0", 1.0, 1e12, "", "model", "RoPE base"),
    FLT(model.partial_rotary_factor, "0.25", 0.0, 1.0, "", "model", "fraction of head_dim that RoPE rotates"),
    FLT(model.initializer_range, "0.02", 0.0, 1.0, "", "model", "std of the normal init of every matrix"),
    BOOL(model.tie_word_embeddings, "false", "model", "lm_head shares embed_tokens"),
    BOOL(model.attention_bias, "false", "model", "q/k/v/o biases (ringscan supports false only)"),
    ENUM(model.hidden_act, "silu", hidden_act_names, "model", "activation of MLP, conv and gated norm"),
    STR(model.init_from, "", PATH, "hf",
        "initial weights of a new run: a Hugging Face folder (ringscan export) or a ringscan run or "
        "checkpoint directory; shapes must match; the optimizer starts fresh. Empty: random init"),

    /* ---- data ---- */
    ENUM(data.format, "flat", data_format_names, "data",
         "flat: ringscan token file; megatron: Megatron-LM indexed dataset (.bin + .idx)"),
    STR(data.path, "", ANY, "data", "token file, or the Megatron prefix (without .bin/.idx)"),
    INT(data.seq_len, "4096", 64, 1LL << 34, "tokens", "data", "tokens per sample, before CP splits it"),
    INT(data.micro_batch, "1", 1, 65536, "samples", "data", "samples per data-parallel replica per micro-step"),
    BOOL(data.shuffle, "true", "data", "shuffle sample order (deterministic from run.seed)"),
    BOOL(data.accept_changed, "false", "data",
         "resume only, and only as --set on its command line: continue although the data's fingerprint differs "
         "from the checkpoint's (the data position then points into other data: the resume is no longer exact)"),

    /* ---- parallel ---- */
    INT(parallel.dp, "1", 1, 1 << 20, "ranks", "comm", "data-parallel replicas"),
    INT(parallel.cp, "1", 1, 1 << 16, "ranks", "cp", "context-parallel ranks per replica (zigzag layout)"),
    BOOL(parallel.gdn_chain_staged, "true", "cp",
         "cp 2 to 4, with checkpoint.gdn_keep: states: the GDN layers' state passing hands each state on after a "
         "state pass, not after a fragment's whole forward or backward (the outputs and the gradients come after, "
         "from what the passes kept): at cp 2 the chain between the two ranks, at cp 3 and 4 the hybrid (the first "
         "halves chained, the second halves folded from their transitions); its backward keeps the chunk state "
         "gradients of the rank's two fragments per sample between the passes at cp 2, of its first at cp 3 and 4 "
         "(cuda about nv dv (2 dk / 64 + 4) bytes per local token at cp 2, half that above, in plan's CP scan "
         "buffers); false, or another gdn_keep: cp 2 runs each fragment's "
         "pass whole, with one state pass more per rank each way, cp 3 and 4 the prefix scan (as above cp 4). Keep "
         "it on (the ranks wait less); turn it off where those kept gradients do not fit (`ringscan plan` names "
         "the schedule; docs/design/gdn-cp.md; figures in docs/performance.md)"),
    ENUM(parallel.ring_calls, "auto", ring_calls_names, "cp",
         "how ring attention calls the kernel per ring step and sample. auto: one call over the step's rows (the "
         "zigzag rule's diagonals and rectangles together) where the kernel runs it fast: always with ours (it skips "
         "masked tiles), with cuDNN for one document (a rank's own block causal by row index, the rest dense); with "
         "documents, the rule's calls where cuDNN takes most of their work (documents longer than a fragment). "
         "pairs: the rule's calls one by one (cuDNN's workspace then grows to a fragment's rows only, not a rank's: "
         "the 1M-token config at 80 GB): pick it where cuDNN's workspace does not fit; steps: one call always "
         "(docs/design/ring-attention.md)"),
    BOOL(parallel.ring_keep_kv, "true", "cp",
         "cp 2 only: the ring forward keeps the K|V block it received (the other rank's) for every softmax layer "
         "until the backward (local rows x 2 (K, V) x kv heads x head_dim x 2 bytes per layer, in plan's CP ring "
         "buffers; no K|V receive buffers are then needed), so the backward exchanges no K|V, runs the other rank's block "
         "first and sends its dK|dV home while its own block runs; false: the backward passes K|V again and its last "
         "dK|dV hop (fp32) waits alone: pick false only where the kept blocks do not fit"),
    BOOL(parallel.overlap_comm, "true", "comm",
         "run communication beside compute; false: wait for each transfer at once (measurement, debugging)"),
    ENUM(parallel.shard, "none", shard_names, "comm",
         "what is cut over every rank of the world (dp x cp; every parameter bucket, a layer's or the head's, is "
         "padded to world x 64 elements and rank r holds its r-th piece). none: every rank holds everything (18 "
         "bytes per parameter on cuda); optimizer (ZeRO-1): the fp32 master weights and both AdamW moments are "
         "the rank's piece only, the gradients are reduce-scattered per layer bucket and the updated weights "
         "all-gathered after the step; gradients (ZeRO-2): also the fp32 gradients: each layer's are "
         "reduce-scattered after its backward in every micro-batch, whole only for two layers at a time (and "
         "embed_tokens and the head); weights (ZeRO-3): also the layers' compute copy (bf16 on cuda): each "
         "layer is all-gathered one layer ahead in the forward and again for its backward, whole for two layers "
         "at a time (embed_tokens and the head stay whole). A world of 1 "
         "runs as none (said). `ringscan plan` counts each (docs/design/sharding.md)"),
    FLT(parallel.comm_timeout_s, "600", 0.0, 1e7, "s", "comm",
        "a rank waiting longer than this for the others (a collective, a transfer; cuda: the step's end) ends the run "
        "with exit 76 and a report naming the collective, step, layer and the ranks that had not arrived (written "
        "to <run.out_dir>/.watchdog/); it must exceed the longest legitimate wait: a checkpoint write, a cuda step; "
        "0: off"),
    FLT(parallel.startup_timeout_s, "1800", 0.0, 1e7, "s", "comm",
        "a rank whose start-up (MPI_Init, then the set-up up to the first step, where parallel.comm_timeout_s takes "
        "over) takes longer than this ends the run with exit 76, saying where it still is (a rank that died or stalls "
        "in MPI_Init leaves the others waiting there); it must exceed the longest healthy start-up: reading a "
        "checkpoint or model.init_from; 0: off"),

    /* ---- train ---- */
    INT(train.steps, "1000", 1, BIG, "steps", "train", "optimizer steps of the whole run"),
    INT(train.grad_accum, "1", 1, 1 << 20, "micro-steps", "train", "micro-batches per optimizer step"),
    FLT(train.lr, "3e-4", 0.0, 10.0, "", "train", "peak learning rate"),
    FLT(train.min_lr, "3e-5", 0.0, 10.0, "", "train", "final learning rate of the decay"),
    INT(train.warmup_steps, "100", 0, BIG, "steps", "train", "linear warmup from 0 to train.lr"),
    ENUM(train.schedule, "cosine", lr_schedule_names, "train",
         "after warmup: cosine to min_lr; wsd: constant then linear decay; constant"),
    INT(train.decay_steps, "0", 0, BIG, "steps", "train", "wsd: length of the final decay (0: 20% of steps)"),
    FLT(train.weight_decay, "0.1", 0.0, 10.0, "", "train", "AdamW decoupled weight decay of matrices"),
    FLT(train.beta1, "0.9", 0.0, 0.999999, "", "train", "AdamW beta1"),
    FLT(train.beta2, "0.95", 0.0, 0.999999, "", "train", "AdamW beta2"),
    FLT(train.eps, "1e-8", 1e-30, 1.0, "", "train", "AdamW epsilon"),
    FLT(train.grad_clip, "1.0", 0.0, 1e6, "", "train", "clip the global gradient norm to this (0: off)"),
    BOOL(train.decay_embeddings, "true", "train", "weight decay on embed_tokens and lm_head"),
    BOOL(train.decay_norms, "true", "train",
         "weight decay on the zero-centred RMSNorm weights (scale 1 + w: decay pulls the scale toward 1, its init; "
         "Qwen3-Next decays them)"),
    BOOL(train.decay_norm_scales, "false", "train",
         "weight decay on plain-scale norm weights, the GDN output norm linear_attn.norm (scale w, init 1): decay "
         "would pull the scale toward 0, not toward its init, so it is off unless asked"),
    BOOL(train.decay_gdn_gates, "false", "train", "weight decay on A_log and dt_bias"),
    BOOL(train.decay_conv, "true", "train", "weight decay on the GDN conv1d weights"),

    /* ---- checkpoint ---- */
    ENUM(checkpoint.activations, "remat", act_policy_names, "model",
         "none: keep all, recompute nothing; full: keep block inputs, recompute blocks; remat: also keep "
         "attention out+LSE and GDN CP states, so recompute runs no attention and no communication"),
    ENUM(checkpoint.gdn_keep, "states", gdn_keep_names, "model",
         "what the delta rule's forward keeps for its backward, per GDN layer under none, in the recompute "
         "scratch otherwise: none (the backward recomputes everything: least memory); wy: the WY factors (cuda "
         "W, U and the gate cumsum, T nv (2 dk + 2 dv + 4) bytes, and where the recompute's scratch holds it Tinv, "
         "T nv 128 bytes more; cpu Tinv), so the backward skips their solve; "
         "states: also the chunk states (cuda h and vn, T nv dv (dk / 32 + 2) bytes more), one state pass less "
         "per layer: the fastest; step down to wy, then none, where memory is short (figures in "
         "docs/performance.md)"),
    INT(checkpoint.chunk_rows, "0", 0, BIG, "tokens", "model",
        "a layer's per-token work (norms, projections, conv, gates, MLP and their backward) runs over each local "
        "fragment in chunks of this many rows, so its scratch does not grow with tokens per GPU; the math is the "
        "same (parameter gradients sum the chunks in order); 0: plan's choice, the largest multiple of 64 whose "
        "chunk scratch (forward + gradients) fits 4, else 2, else 1 GiB, the largest that keeps the run within "
        "device memory less 5% beside the layers checkpoint.keep_layers keeps (fewer, longer kernel calls), at "
        "most the fragment (plan prints it); at least model.linear_conv_kernel_dim - 1 (the conv's halo). Under "
        "checkpoint.activations none the per-token tensors the backward reads are kept whole per layer (nothing "
        "is recomputed); the chunks then bound each kernel call and the scratch (conv output, gradients)"),
    ENUM(checkpoint.offload, "none", offload_names, "model",
         "host: each layer's kept activations go to (page-locked) host memory right after its forward and come "
         "back one layer ahead in the backward, on a copy stream beside the compute; the device holds two layers' "
         "worth; plan counts host memory per node (device.host_memory_gib); results are bitwise those of none"),
    INTA(checkpoint.keep_layers, "0", 0, BIG, "layers", "model",
         "under checkpoint.activations full or remat: the last this many layers keep every activation their "
         "backward reads, as under none (their backward recomputes nothing), the others follow the policy; the "
         "last because their backward runs first; auto: the most layers whose plan fits device.memory_gib less "
         "a margin of 5% (plan prints the choice); at most model.num_hidden_layers; not with checkpoint.offload "
         "host; nothing changes the math"),
    ENUM(checkpoint.input_rows, "auto", input_rows_names, "model",
         "under checkpoint.activations full or remat, what a layer that recomputes holds of its input side (ln1 "
         "and the in_proj output) from its recompute to its backward: chunk: one row chunk, so the backward runs "
         "ln1 and the in_proj of every chunk once more (least memory); whole: every row, in the recompute's "
         "scratch (tokens per GPU x (hidden_size + the in_proj's width) activations more, one layer at a time), "
         "so the in_proj runs once per recompute; auto: whole where the plan with it fits device.memory_gib less "
         "5% before checkpoint.keep_layers auto takes memory, else chunk (plan prints the choice); nothing "
         "changes the math"),
    ENUM(checkpoint.mlp_act, "auto", mlp_act_names, "model",
         "what a layer that keeps its activations (every layer under none; under full or remat those of "
         "checkpoint.keep_layers) does with the MLP's act = silu(gate) up, the down projection's input: kept: "
         "it keeps it, tokens per GPU x intermediate_size activations a layer; rewritten: its backward writes it "
         "again from gate_up beside the SwiGLU gradient (a few more bytes a token; layers that recompute always "
         "do this); auto: kept where the plan with it fits device.memory_gib less 5% after checkpoint.keep_layers "
         "auto and the row chunks have taken memory, else rewritten (plan prints the choice); the same bits "
         "either way"),
    INT(checkpoint.every, "0", 0, BIG, "steps", "ckpt", "steps between checkpoints (0: only at the end and on stop)"),
    INT(checkpoint.keep, "2", 1, 1000000, "checkpoints", "ckpt", "newest checkpoints kept on disk"),

    /* ---- slurm ---- */
    STR(slurm.partition, "", NAMES, "scheduler", "partition(s), comma separated; empty: the cluster default"),
    STR(slurm.account, "", NAME, "scheduler", "account to charge; empty: your default"),
    STR(slurm.qos, "", NAME, "scheduler", "quality of service; empty: the default"),
    INT(slurm.nodes, "1", 1, 100000, "nodes", "scheduler", "nodes of the allocation"),
    INT(slurm.gpus_per_node, "0", 0, 1024, "tasks", "scheduler",
        "GPUs and tasks per node, one rank per GPU (cpu backend: ranks per node); slurm.nodes x this must be "
        "parallel.dp x parallel.cp; 0: parallel.dp x parallel.cp / slurm.nodes"),
    STR(slurm.time, "01:00:00", TIME, "scheduler",
        "time limit: [D-]HH:MM:SS, MM:SS or MM; 0: none (the partition's maximum)"),
    INT(slurm.signal_s, "120", 0, 65535, "s", "scheduler",
        "SIGUSR1 this long before the time limit (Slurm may send it up to 60 s earlier): checkpoint, "
        "exit 75, requeue; 0: no warning"),
    INT(slurm.max_restarts, "10", 0, 100000, "restarts", "scheduler",
        "requeues after a checkpoint-and-stop (exit 75); the job fails with 75 once they are used up"),
    ENUM(slurm.launcher, "srun", slurm_launcher_names, "scheduler",
         "how the job starts one rank per task, on every node: srun --mpi=<slurm.srun_mpi>, or Open MPI's "
         "mpirun inside the allocation (--map-by ppr:<tasks per node>:node; where srun cannot start MPI programs)"),
    STR(slurm.srun_mpi, "pmix", NAME, "scheduler",
        "srun's MPI plugin (srun --mpi=...); `srun --mpi=list` shows the cluster's; Open MPI needs pmix"),
    STR(slurm.site_env, "", PATH, "scheduler",
        "file the job sources before launching: site NCCL/UCX settings (see slurm/site.env); empty: none"),

    /* ---- device ---- */
    ENUM(device.kind, "cpu", device_kind_names, "device", "cpu: fp32 oracle backend over MPI; cuda: GPUs over NCCL"),
    FLT(device.memory_gib, "80", 0.01, 1e6, "GiB", "device", "memory per GPU (cpu: per rank) that plan checks against"),
    FLT(device.host_memory_gib, "0", 0.0, 1e7, "GiB", "device",
        "host memory per node that plan checks checkpoint.offload: host against (every rank of the node pins its "
        "layers there); 0: what the machine running plan has (MemTotal of /proc/meminfo: set it where plan runs "
        "on another machine than the job)"),
    FLT(device.peak_tflops, "0", 0.0, 1e6, "TFLOP/s", "device", "dense bf16 peak for MFU; 0: from the device table"),
    INT(device.threads, "1", 1, 1024, "threads", "device", "cpu backend: BLAS threads per rank (fixed: deterministic)"),
    BOOL(device.profile, "false", "device",
         "cuda backend: time every Backend entry (CUDA events and the host clock) and print the GPU and host ms "
         "of each, sorted, to stderr at exit (information only: the run is slightly slower)"),
    ENUM(device.attention_kernel, "auto", attn_kernel_names, "device",
         "cuda: the block attention kernel. auto (the default): cudnn where cuDNN can be loaded, ours where it cannot (the start of the run says which and why), the same on every rank (where cuDNN loads on some ranks only, ours on all, the first lacking rank named); on the cpu backend ours. cudnn: cuDNN's fused attention (loaded at start, device.cudnn_library) for the calls it can take (one document: the ring's dense rectangles and causal diagonals, one-GPU causal; packed documents causal within each, where the query rows are the key rows: one-GPU calls and a ring rank's diagonal pieces, as cuDNN's variable-length batch), ours for the other document-masked calls; its backward adds key blocks into dQ in any order, so reruns and resumes agree to rounding, not bitwise. ringscan: ours everywhere, deterministic (bitwise reruns and resumes): set it for bitwise reproducibility. cudnn_det: cuDNN's deterministic backward, whose workspace is a rows x rows x heads bf16 matrix (32 GiB at 32k rows and 16 heads; `ringscan plan` counts it, the run stops naming it where it cannot be allocated): short calls only. auto is the default because cuDNN's kernel is markedly faster than ours on the long one-document calls that dominate a long-context step, more than the cost the project accepts for bitwise reruns (docs/design/attention-kernels.md; figures in docs/performance.md)"),
    STR(device.cudnn_library, "", PATH, "device",
        "path of libcudnn.so.9 for attention_kernel cudnn, cudnn_det or auto; empty: the default loader path, then PyTorch's nvidia/cudnn/lib in the usual virtual-environment places and /usr/local/cuda/lib64"),

    /* ---- debug (tests only) ---- */
    INT(debug.stall_rank, "-1", -1, BIG, "rank", "comm",
        "tests only: this world rank stops forever before its first communication of debug.stall_layer at "
        "debug.stall_step, so the watchdog must end the run; -1: never"),
    INT(debug.stall_step, "1", 0, BIG, "steps", "comm",
        "tests only: the step debug.stall_rank stalls at; 0: in the start-up, before MPI_Init (the launcher's rank), "
        "so the start-up guard must end the run"),
    INT(debug.stall_layer, "0", 0, CONFIG_LIST_MAX, "layer", "comm",
        "tests only: the layer debug.stall_rank stalls at; model.num_hidden_layers: at the write of its shard of a "
        "sharded checkpoint (parallel.shard)"),
};

const int config_schema_count = (int)(sizeof config_schema / sizeof config_schema[0]);
_Static_assert(sizeof config_schema / sizeof config_schema[0] <= CONFIG_MAX_KEYS, "raise CONFIG_MAX_KEYS");

int config_find_key(const char *path) {
    for (int i = 0; i < config_schema_count; i++)
        if (strcmp(config_schema[i].path, path) == 0) return i;
    return -1;
}
