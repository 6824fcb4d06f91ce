/*
 * config_validate.c — rules that involve more than one key.
 *
 * Single values were already checked against their range or enum while
 * loading (config.c). Here live the rules between keys, grouped by the module
 * that owns them. Every message quotes each key involved, its value and where
 * that value came from, Megatron-style:
 *
 *   data.seq_len = 1000 (configs/x.yaml:9:12) is not divisible by
 *   2 x parallel.cp x 64 = 256 (parallel.cp = 2, default) ...
 *
 * Callers: cmd/ringscan.c after loading and overrides; the launcher calls
 * config_validate_world() once it knows how many ranks were started.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VALIDATE_CPU_HEAD_DIM_MAX 512 /* kernels/cpu/cpu_attention.c ATTN_HD_MAX */

/* "key = value (source)" for a message. */
static const char *validate_quote(const Config *cfg, const char *path, char *buf, size_t n) {
    int key = config_find_key(path);
    char v[256], s[600];
    config_format_value(cfg, key, v, sizeof v);
    config_format_source(cfg, key, s, sizeof s);
    snprintf(buf, n, "%s = %s (%s)", path, v, s);
    return buf;
}

static int validate_model(const Config *cfg, ConfigErrors *err) {
    const ModelConfig *m = &cfg->model;
    char a[900], b[900], c[900];
    int before = err->count;

    if (m->linear_num_value_heads % m->linear_num_key_heads != 0)
        config_errors_add(err, "%s must be a multiple of %s: each value head reads one key head",
                          validate_quote(cfg, "model.linear_num_value_heads", a, sizeof a),
                          validate_quote(cfg, "model.linear_num_key_heads", b, sizeof b));
    if (m->num_attention_heads % m->num_key_value_heads != 0)
        config_errors_add(err, "%s must be a multiple of %s: query heads share key/value heads in equal groups (GQA)",
                          validate_quote(cfg, "model.num_attention_heads", a, sizeof a),
                          validate_quote(cfg, "model.num_key_value_heads", b, sizeof b));
    int64_t rd = config_rotary_dim(cfg);
    if (rd % 2 != 0)
        config_errors_add(err, "int(%s x %s) = %lld rotary dims must be even: RoPE rotates pairs",
                          validate_quote(cfg, "model.head_dim", a, sizeof a),
                          validate_quote(cfg, "model.partial_rotary_factor", b, sizeof b), (long long)rd);
    if (m->layer_types.n > 0 && m->layer_types.n != m->num_hidden_layers)
        config_errors_add(err, "model.layer_types has %d entries but %s: give one kind per layer, or leave "
                               "layer_types empty to use model.full_attention_interval",
                          m->layer_types.n, validate_quote(cfg, "model.num_hidden_layers", a, sizeof a));
    if (m->linear_attention == LINEAR_ATTN_KDA) {
        /* kimi_linear's KimiDeltaAttention: one head count and one head width (its decay gate f_b_proj gives a
         * decay per key channel of each value head, its low-rank gates have rank head_dim) */
        if (m->linear_num_key_heads != m->linear_num_value_heads)
            config_errors_add(err, "%s with %s and %s: a KDA layer has as many key heads as value heads (each value "
                                   "head decays its own key channels)",
                              validate_quote(cfg, "model.linear_attention", a, sizeof a),
                              validate_quote(cfg, "model.linear_num_key_heads", b, sizeof b),
                              validate_quote(cfg, "model.linear_num_value_heads", c, sizeof c));
        if (m->linear_key_head_dim != m->linear_value_head_dim)
            config_errors_add(err, "%s with %s and %s: a KDA layer's key and value heads have one width (kimi_linear's "
                                   "head_dim, also the rank of its low-rank gates)",
                              validate_quote(cfg, "model.linear_attention", a, sizeof a),
                              validate_quote(cfg, "model.linear_key_head_dim", b, sizeof b),
                              validate_quote(cfg, "model.linear_value_head_dim", c, sizeof c));
    }
    if (m->attention_bias)
        config_errors_add(err, "%s: ringscan's attention has no biases (Qwen3-Next uses none); set it to false",
                          validate_quote(cfg, "model.attention_bias", a, sizeof a));
    if (m->max_position_embeddings > 0 && m->max_position_embeddings < cfg->data.seq_len)
        config_errors_add(err, "%s is smaller than %s: samples would run past the positions the model declares",
                          validate_quote(cfg, "model.max_position_embeddings", a, sizeof a),
                          validate_quote(cfg, "data.seq_len", b, sizeof b));
    if (cfg->device.kind == DEVICE_KIND_CPU) {
        /* the cpu kernels' own limits (each RS_CHECKs it): attention keeps a row of hd floats per query
         * on the stack (cpu_attention.c, ATTN_HD_MAX); the conv's width is bounded by the schema; BLAS
         * and the loss take a micro-batch's rows as an int (cpu_matmul.c, cpu_loss.c) */
        if (m->head_dim > VALIDATE_CPU_HEAD_DIM_MAX)
            config_errors_add(err, "%s with %s: the cpu attention kernel supports head_dim up to %d",
                              validate_quote(cfg, "model.head_dim", a, sizeof a),
                              validate_quote(cfg, "device.kind", b, sizeof b), VALIDATE_CPU_HEAD_DIM_MAX);
        int64_t rows = cfg->data.micro_batch * (cfg->data.seq_len / cfg->parallel.cp);
        if (rows > INT32_MAX)
            config_errors_add(err, "%s x %s / %s = %lld rows per rank and micro-batch: the cpu backend's BLAS calls "
                                   "take at most %d",
                              validate_quote(cfg, "data.micro_batch", a, sizeof a),
                              validate_quote(cfg, "data.seq_len", b, sizeof b),
                              validate_quote(cfg, "parallel.cp", c, sizeof c), (long long)rows, INT32_MAX);
    }
    if ((cfg->device.attention_kernel == ATTN_KERNEL_CUDNN || cfg->device.attention_kernel == ATTN_KERNEL_CUDNN_DET) &&
        cfg->device.kind != DEVICE_KIND_CUDA)
        config_errors_add(err, "%s with %s: cuDNN's attention runs on the cuda backend only (device.kind: cuda)",
                          validate_quote(cfg, "device.attention_kernel", a, sizeof a),
                          validate_quote(cfg, "device.kind", b, sizeof b));
    if (cfg->device.cudnn_library[0] && cfg->device.attention_kernel == ATTN_KERNEL_RINGSCAN)
        config_errors_add(err, "%s is set but %s: nothing would load it (set attention_kernel to cudnn, cudnn_det or auto, "
                               "or leave the path empty)",
                          validate_quote(cfg, "device.cudnn_library", a, sizeof a),
                          validate_quote(cfg, "device.attention_kernel", b, sizeof b));
    if (cfg->device.kind == DEVICE_KIND_CUDA) {
        if (m->head_dim != 64 && m->head_dim != 128 && m->head_dim != 256)
            config_errors_add(err, "%s with %s: the cuda attention kernels are built for head_dim 64, 128 or 256",
                              validate_quote(cfg, "model.head_dim", a, sizeof a),
                              validate_quote(cfg, "device.kind", b, sizeof b));
        if ((m->linear_key_head_dim != 64 && m->linear_key_head_dim != 128) ||
            (m->linear_value_head_dim != 64 && m->linear_value_head_dim != 128))
            config_errors_add(err, "%s and %s with %s: the cuda delta-rule kernels (Gated DeltaNet, Kimi Delta "
                                   "Attention) are built for head dims 64 or 128",
                              validate_quote(cfg, "model.linear_key_head_dim", a, sizeof a),
                              validate_quote(cfg, "model.linear_value_head_dim", b, sizeof b),
                              validate_quote(cfg, "device.kind", c, sizeof c));
        if (m->hidden_size % 8 || m->intermediate_size % 8)
            config_errors_add(err, "%s and %s must be multiples of 8 on cuda (16-byte aligned bf16 rows for cuBLASLt)",
                              validate_quote(cfg, "model.hidden_size", a, sizeof a),
                              validate_quote(cfg, "model.intermediate_size", b, sizeof b));
    }
    return err->count - before;
}

static int validate_layout(const Config *cfg, ConfigErrors *err) {
    char a[900], b[900], c[900], d[900];
    int before = err->count;
    int64_t cp = cfg->parallel.cp, T = cfg->data.seq_len;
    int64_t unit = 2 * cp * 64;
    if (T % unit != 0) {
        char near[64];
        int64_t lo = T / unit * unit, hi = lo + unit; /* lo = 0 is no length */
        if (lo > 0) snprintf(near, sizeof near, "%lld or %lld", (long long)lo, (long long)hi);
        else snprintf(near, sizeof near, "%lld", (long long)hi);
        config_errors_add(err, "%s is not divisible by 2 x parallel.cp x 64 = %lld (%s): the zigzag layout cuts each "
                               "sample into 2 x cp segments of whole 64-token chunks; nearest valid: %s",
                          validate_quote(cfg, "data.seq_len", a, sizeof a), (long long)unit,
                          validate_quote(cfg, "parallel.cp", b, sizeof b), near);
    }
    const int64_t halo = cfg->model.linear_conv_kernel_dim - 1, rows = cfg->checkpoint.chunk_rows;
    if (rows > 0 && rows < halo)
        config_errors_add(err, "%s is shorter than the conv halo, %s - 1 = %lld rows: a chunk's conv reads the "
                               "previous chunk's last rows; use 0 (plan chooses) or at least %lld",
                          validate_quote(cfg, "checkpoint.chunk_rows", a, sizeof a),
                          validate_quote(cfg, "model.linear_conv_kernel_dim", b, sizeof b), (long long)halo,
                          (long long)halo);
    const int64_t keep = cfg->checkpoint.keep_layers;
    if (keep > cfg->model.num_hidden_layers)
        config_errors_add(err, "%s is more than %s: it counts the last layers that keep their "
                               "activations; at most %lld (every layer: checkpoint.activations none)",
                          validate_quote(cfg, "checkpoint.keep_layers", a, sizeof a),
                          validate_quote(cfg, "model.num_hidden_layers", b, sizeof b),
                          (long long)cfg->model.num_hidden_layers);
    if (keep != 0 && cfg->checkpoint.offload == OFFLOAD_HOST)
        config_errors_add(err, "%s with %s: offload moves every layer's kept activations through two device slots "
                               "of the largest layer's size, which a kept layer would make as large as under none; "
                               "use keep_layers 0 with offload, or offload none",
                          validate_quote(cfg, "checkpoint.keep_layers", a, sizeof a),
                          validate_quote(cfg, "checkpoint.offload", b, sizeof b));
    const SlurmConfig *s = &cfg->slurm;
    int64_t world = config_world(cfg);
    bool cuda = cfg->device.kind == DEVICE_KIND_CUDA; /* a cuda job runs one task (rank) per GPU */
    if (s->gpus_per_node > 0 && s->nodes * s->gpus_per_node != world)
        config_errors_add(err, "%s x %s = %lld %s, but %s x %s = %lld ranks: %s",
                          validate_quote(cfg, "slurm.nodes", a, sizeof a),
                          validate_quote(cfg, "slurm.gpus_per_node", b, sizeof b), (long long)(s->nodes * s->gpus_per_node),
                          cuda ? "GPUs" : "tasks", validate_quote(cfg, "parallel.dp", c, sizeof c),
                          validate_quote(cfg, "parallel.cp", d, sizeof d), (long long)world,
                          cuda ? "device.kind = cuda runs one rank per GPU, so the two must be equal"
                               : "the allocation must hold exactly one task per rank");
    if (s->gpus_per_node == 0 && world % s->nodes != 0)
        config_errors_add(err, "%s x %s = %lld ranks do not split evenly over %s; set slurm.gpus_per_node%s",
                          validate_quote(cfg, "parallel.dp", a, sizeof a),
                          validate_quote(cfg, "parallel.cp", b, sizeof b), (long long)world,
                          validate_quote(cfg, "slurm.nodes", c, sizeof c),
                          cuda ? " (GPUs per node, one rank each)" : "");
    return err->count - before;
}

static int validate_train(const Config *cfg, ConfigErrors *err) {
    const TrainConfig *t = &cfg->train;
    char a[900], b[900], c[900];
    int before = err->count;
    if (t->warmup_steps > t->steps)
        config_errors_add(err, "%s is longer than %s",
                          validate_quote(cfg, "train.warmup_steps", a, sizeof a),
                          validate_quote(cfg, "train.steps", b, sizeof b));
    if (t->min_lr > t->lr)
        config_errors_add(err, "%s is above %s: the schedule decays from lr down to min_lr",
                          validate_quote(cfg, "train.min_lr", a, sizeof a), validate_quote(cfg, "train.lr", b, sizeof b));
    if (t->schedule == LR_SCHEDULE_WSD && t->decay_steps > t->steps - t->warmup_steps)
        config_errors_add(err, "%s does not fit after warmup: %s, %s",
                          validate_quote(cfg, "train.decay_steps", a, sizeof a),
                          validate_quote(cfg, "train.steps", b, sizeof b),
                          validate_quote(cfg, "train.warmup_steps", c, sizeof c));
    if (cfg->run.stop_after_step > t->steps)
        config_errors_add(err, "%s is after the last step: %s",
                          validate_quote(cfg, "run.stop_after_step", a, sizeof a),
                          validate_quote(cfg, "train.steps", b, sizeof b));
    return err->count - before;
}

/* Seconds of a Slurm time limit (a value that passed CONFIG_CHARSET_TIME):
 * MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS. */
static int64_t validate_slurm_seconds(const char *s) {
    long long d = 0, f[3] = {0, 0, 0};
    int n = 0;
    const char *p = s, *dash = strchr(s, '-');
    if (dash) {
        d = strtoll(s, NULL, 10);
        p = dash + 1;
    }
    for (; n < 3; n++) {
        char *next;
        f[n] = strtoll(p, &next, 10);
        p = next;
        if (*p != ':') { n++; break; }
        p++;
    }
    /* huge fields only need to stay huge, not overflow */
    if (d > 1000000000) d = 1000000000;
    for (int i = 0; i < 3; i++)
        if (f[i] > 1000000000) f[i] = 1000000000;
    if (dash) /* D-HH[:MM[:SS]] */
        return ((d * 24 + f[0]) * 60 + (n > 1 ? f[1] : 0)) * 60 + (n > 2 ? f[2] : 0);
    if (n == 1) return f[0] * 60;          /* MM */
    if (n == 2) return f[0] * 60 + f[1];   /* MM:SS */
    return (f[0] * 60 + f[1]) * 60 + f[2]; /* HH:MM:SS */
}

static int validate_slurm(const Config *cfg, ConfigErrors *err) {
    const SlurmConfig *s = &cfg->slurm;
    char a[900], b[900];
    int before = err->count;
    int64_t limit = validate_slurm_seconds(s->time);
    /* a limit of 0 is Slurm's "no limit" (the partition's maximum applies) */
    if (limit > 0 && s->signal_s >= limit)
        config_errors_add(err, "%s is not shorter than %s = %lld s: the warning would be due before the run "
                               "starts; lower slurm.signal_s or raise slurm.time",
                          validate_quote(cfg, "slurm.signal_s", a, sizeof a),
                          validate_quote(cfg, "slurm.time", b, sizeof b), (long long)limit);
    return err->count - before;
}

/* debug.stall_*: a stall the watchdog (the start-up guard, at step 0) cannot end would hang the run forever */
static int validate_debug(const Config *cfg, ConfigErrors *err) {
    char a[900], b[900];
    int before = err->count;
    if (cfg->debug.stall_rank < 0) return 0;
    const int startup = cfg->debug.stall_step == 0;
    const char *ender = startup ? "parallel.startup_timeout_s" : "parallel.comm_timeout_s";
    if ((startup ? cfg->parallel.startup_timeout_s : cfg->parallel.comm_timeout_s) <= 0)
        config_errors_add(err, "%s with %s: nothing would end the stalled run",
                          validate_quote(cfg, "debug.stall_rank", a, sizeof a), validate_quote(cfg, ender, b, sizeof b));
    if (config_world(cfg) == 1)
        config_errors_add(err, "%s in a world of one rank: it waits for no one, so no watchdog runs",
                          validate_quote(cfg, "debug.stall_rank", a, sizeof a));
    else if (cfg->debug.stall_rank >= config_world(cfg))
        config_errors_add(err, "%s is not a rank of the world of %lld",
                          validate_quote(cfg, "debug.stall_rank", a, sizeof a), (long long)config_world(cfg));
    /* num_hidden_layers: a sharded checkpoint's shard write (lib/run/train_ckpt.c) */
    const int sharded = cfg->parallel.shard != SHARD_NONE && config_world(cfg) > 1;
    if (cfg->debug.stall_layer > cfg->model.num_hidden_layers ||
        (cfg->debug.stall_layer == cfg->model.num_hidden_layers && !sharded))
        config_errors_add(err, "%s is not a layer of the %lld (%lld itself: the shard write of a sharded checkpoint, "
                               "with parallel.shard and more than one rank)",
                          validate_quote(cfg, "debug.stall_layer", a, sizeof a),
                          (long long)cfg->model.num_hidden_layers, (long long)cfg->model.num_hidden_layers);
    return err->count - before;
}

int config_validate(const Config *cfg, ConfigErrors *err) {
    return validate_model(cfg, err) + validate_layout(cfg, err) + validate_train(cfg, err) +
           validate_slurm(cfg, err) + validate_debug(cfg, err);
}

int config_validate_world(const Config *cfg, int64_t world, const char *launcher, ConfigErrors *err) {
    char a[900], b[900];
    if (world == config_world(cfg)) return 0;
    config_errors_add(err, "%s started %lld ranks, but %s x %s = %lld", launcher, (long long)world,
                      validate_quote(cfg, "parallel.dp", a, sizeof a), validate_quote(cfg, "parallel.cp", b, sizeof b),
                      (long long)config_world(cfg));
    return 1;
}
