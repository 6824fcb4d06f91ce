/*
 * plan.c — memory, FLOPs and communication of a run, and the fit verdict (plan.h has the conventions).
 * Callers: `ringscan plan`, `submit` (scheduler/submit.c), the trainer's start-up check, `ringscan bench`.
 *
 * Device memory per rank, by category: weights (bf16, cuda only: what the GEMMs read), master weights,
 * gradients and AdamW m, v (fp32: 4, 4 and 8 bytes per parameter; with parallel.shard optimizer or gradients
 * the master weights and moments are this rank's pieces of the padded buffer, 12 B / world, while the compute
 * copy stays whole (cuda bf16; cpu a full fp32 copy of its own); the gradients stay whole under optimizer,
 * and under gradients are embed_tokens' and the head's buckets, two layers' and the rank's pieces of all,
 * model_shard.c; under weights the compute copy is too, and the layers' all-gathers of every micro-batch are
 * counted with the gradients' communication); activations (the
 * peak model_acts.c gives the policy; with checkpoint.offload host its kept term is the head's buffers
 * and two layer slots, the rest host memory); CP ring and CP scan (model_acts.c's CP table: the buffers
 * cp_init allocates, one softmax or GDN layer at a time); workspaces (the loss row chunk, cuBLASLt's and
 * the kernels' scratch, the attention backward's row statistics, and the cuDNN route's workspace as the
 * backend reports it, BackendSizes); runtime (cuda: the CUDA context and each NCCL communicator of two or
 * more ranks, as measured on the GPU machine; the figures are the constants below).
 *
 * Host memory per node (checked with checkpoint.offload host): per rank the offloaded activations and 2 GiB
 * for the process, times the ranks per node, plus the checkpoint staging (rank 0's 12 bytes per parameter;
 * with parallel.shard every rank's 12 bytes per parameter over the world);
 * capacity device.host_memory_gib, or MemTotal of the machine running plan. The fit verdict compares each
 * with device.memory_gib and names the settings that would fit. The reasoning: docs/design/measurement-notes.md
 * (memory and plan).
 */
#include "plan.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/error.h"
#include "cp/cp.h"

const char *const plan_mem_names[PLAN_MEM_COUNT] = {
    "weights (bf16)", "master weights (fp32)", "gradients (fp32)", "AdamW m, v (fp32)", "activations",
    "CP ring buffers", "CP scan buffers", "workspaces", "runtime (context, NCCL)",
};
const char *const plan_comm_names[PLAN_COMM_COUNT] = {
    "gradients and weights (dp x cp)", "ring attention send/recv", "GDN state passing", "conv halo all-gather",
};

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Chunked gated delta rule FLOPs per chunk and value head, in FLA's kernel
 * split (docs/design/gdn-kernels.md, "FLOPs counted"; at C=64, K=V=128 these give 11.3 and 32.5
 * MFLOP). */
static double plan_gdn_fwd_chunk(double C, double K, double V) {
    double kkt = 1.25 * C * C * K, solve = 0.61 * C * C * C, wu = 2 * C * C * (K + V), h = 4 * C * K * V;
    double o = 2 * C * K * V + 2 * C * C * K + 2 * C * C * V;
    return kkt + solve + wu + h + o;
}
static double plan_gdn_bwd_chunk(double C, double K, double V) {
    double re_wu = 2 * C * C * (K + V), re_h = 4 * C * K * V, dv_local = 2 * C * C * (K + V);
    double dhu = 6 * C * K * V, dqkwg = 6 * C * K * V + 4 * C * C * K + 2 * C * C * V;
    double wy = 12 * C * C * K + 4 * C * C * V;
    return re_wu + re_h + dv_local + dhu + dqkwg + wy;
}
void plan_gdn_chunk_flops(double C, double K, double V, double *fwd, double *bwd) {
    *fwd = plan_gdn_fwd_chunk(C, K, V);
    *bwd = plan_gdn_bwd_chunk(C, K, V);
}

/* MemTotal of /proc/meminfo in bytes, or -1 */
static int64_t plan_mem_total(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %lld kB", &kib) == 1) break;
    fclose(f);
    return kib < 0 ? -1 : (int64_t)kib * 1024;
}

/* host memory per node and its capacity (see the header) */
static void plan_host(Plan *p, const Config *cfg) {
    const bool cuda = cfg->device.kind == DEVICE_KIND_CUDA;
    p->tasks_per_node = config_tasks_per_node(cfg);
    p->host_runtime = cuda ? 2LL << 30 : 0;
    /* checkpoint staging: rank 0 stages the whole state; sharded, every rank its pieces (train_ckpt.c) */
    p->host_staging = p->shard == SHARD_NONE ? 12 * p->params.total
                                             : p->tasks_per_node * 12 * p->buffer_numel / p->world;
    for (int pol = 0; pol < ACT_POLICY_COUNT; pol++) {
        p->host_offload[pol] = p->offload ? p->acts.offload_host[pol] : 0;
        p->host_rank_device[pol] = cuda ? 0 : p->total[pol];
        p->host_node[pol] = p->tasks_per_node * (p->host_offload[pol] + p->host_runtime + p->host_rank_device[pol]) +
                            p->host_staging;
    }
    if (cfg->device.host_memory_gib > 0) {
        p->host_capacity = (int64_t)(cfg->device.host_memory_gib * GIB);
        snprintf(p->host_source, sizeof p->host_source, "device.host_memory_gib");
        return;
    }
    char host[64] = "?";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    p->host_capacity = plan_mem_total();
    snprintf(p->host_source, sizeof p->host_source, "MemTotal of /proc/meminfo on %s (device.host_memory_gib = 0)",
             host);
}

/* The cuda runtime's device memory for dp x cp ranks, as measured on the GPU machine (device memory in use
 * less the backend's peak): the CUDA context and its modules, and one NCCL communicator per group of two or
 * more ranks (comm_nccl.c makes world, cp and dp; NVLink, NCCL 2.28). */
static int64_t plan_cuda_runtime(int dp, int cp) {
    const int64_t context = 550LL << 20, per_comm = 1100LL << 20;
    int comms = (dp * cp > 1) + (cp > 1) + (dp > 1);
    return context + comms * per_comm;
}

static int plan_keep_layers(const Config *cfg);

/* plan_build with checkpoint.chunk_rows as cfg gives it (0: model_acts.c's rule, 1 GiB of chunk scratch) */
static void plan_build_as(Plan *p, const Config *cfg) {
    const ModelConfig *m = &cfg->model;
    memset(p, 0, sizeof *p);
    p->dp = cfg->parallel.dp;
    p->cp = cfg->parallel.cp;
    p->world = p->dp * p->cp;
    int64_t T = cfg->data.seq_len, P = p->cp;
    p->segment_tokens = T / (2 * P);
    p->tokens_per_rank = cfg->data.micro_batch * T / P;
    p->tokens_per_step = p->dp * cfg->data.micro_batch * cfg->train.grad_accum * T;
    for (int l = 0; l < m->num_hidden_layers; l++) {
        if (config_layer_kind(cfg, l) == LAYER_KIND_FULL) p->n_full++;
        else p->n_linear++;
    }

    ParamTable tab;
    model_params_build(&tab, cfg);
    model_params_count(&p->params, &tab, cfg);
    p->shard = model_shard_stage(cfg);
    p->buffer_numel = tab.buffer_numel;
    p->shard_pad = tab.shard_pad;
    /* shard gradients keeps whole gradients of embed_tokens' and the head's buckets and two layers' (model.c) */
    int64_t layer_max = 0;
    const int nb = tab.n_buckets;
    for (int b = 1; b < nb - 1; b++)
        if (tab.bucket_start[b + 1] - tab.bucket_start[b] > layer_max) layer_max = tab.bucket_start[b + 1] - tab.bucket_start[b];
    const int64_t head_numel = tab.bucket_start[1] + (tab.bucket_start[nb] - tab.bucket_start[nb - 1]);
    p->grad_numel = p->shard >= SHARD_GRADIENTS ? head_numel + 2 * layer_max + tab.buffer_numel / p->world
                                                : tab.buffer_numel;
    /* shard weights: the same for the compute copy; the layers' gathers per step (model_shard.c): the step's
     * first forward gathers every layer; a backward all but the last two (the forward left them in the slots),
     * every later forward all but the first two (the backward left them) */
    p->weights_numel = p->shard == SHARD_WEIGHTS ? p->grad_numel : tab.buffer_numel;
    if (p->shard == SHARD_WEIGHTS) {
        const int L = nb - 2, two = L < 2 ? L : 2;
        const double all = (double)(tab.bucket_start[nb - 1] - tab.bucket_start[1]);
        const double first2 = (double)(tab.bucket_start[1 + two] - tab.bucket_start[1]);
        const double last2 = (double)(tab.bucket_start[nb - 1] - tab.bucket_start[nb - 1 - two]);
        const double accum = (double)cfg->train.grad_accum, W = (double)p->world;
        const double elems = all + (all - last2) + (accum - 1) * ((all - first2) + (all - last2));
        p->weight_gather = (W - 1) / W * (cfg->device.kind == DEVICE_KIND_CUDA ? 2 : 4) * elems;
    }
    /* each layer's GEMM parameters (the recompute FLOPs of the layers checkpoint.keep_layers spares) */
    const int L = (int)m->num_hidden_layers;
    double *mm_layer = RS_CALLOC((size_t)L, sizeof *mm_layer);
    for (int i = 0; i < tab.n; i++)
        if (tab.t[i].layer >= 0 && tab.t[i].ndim == 2 && tab.t[i].group != PARAM_GROUP_CONV)
            mm_layer[tab.t[i].layer] += (double)tab.t[i].numel;
    HfTable hf;
    model_params_build_hf(&hf, cfg);
    p->hf_params = hf.count;
    model_params_free_hf(&hf);
    model_params_free(&tab);

    bool cuda = cfg->device.kind == DEVICE_KIND_CUDA;
    int e = cuda ? 2 : 4;
    double N = (double)p->params.total;
    Config kept = *cfg; /* keep_layers as it runs: every layer under none (plan_keep_layers builds numbers only) */
    kept.checkpoint.keep_layers = plan_keep_layers(cfg);
    model_acts_build(&p->acts, &kept);

    int64_t nh = m->num_attention_heads, nkv = m->num_key_value_heads, hd = m->head_dim;
    int64_t nv = m->linear_num_value_heads, dk = m->linear_key_head_dim, dv = m->linear_value_head_dim;
    int64_t Cc = 2 * m->linear_num_key_heads * dk + nv * dv;
    p->offload = cfg->checkpoint.offload == OFFLOAD_HOST;
    /* the CP buffers cp_init allocates (model_acts.c lists them) */
    int64_t ring = p->acts.cp_bytes[ACT_CP_RING], scan = p->acts.cp_bytes[ACT_CP_SCAN];
    /* the cuda attention backward's workspace (kernels/cuda/attention/tiles.cu attn_plan): two fp32 row
     * statistics per head and query row, with its 1/4 headroom; the tile masks and semaphores are small */
    int64_t attn_ws = 2 * nh * p->tokens_per_rank * 4 * 5 / 4 + (4LL << 20);
    /* device.attention_kernel cudnn | cudnn_det | auto: the cuDNN route's workspace beside ours (the backend's
     * figure, BackendSizes), grown to the largest call, a backward with Tq = Tk = one ring call's rows: at cp > 1
     * a rank's (seq_len / cp: parallel.ring_calls auto or steps, a step's one call over the rank's own block) or
     * a fragment's (seq_len / 2cp: pairs), a sample (seq_len) at cp 1 */
    if (cuda && cfg->device.attention_kernel != ATTN_KERNEL_RINGSCAN && p->n_full) {
        const int64_t call = P == 1 ? T : cfg->parallel.ring_calls == RING_CALLS_PAIRS ? T / (2 * P) : T / P;
        p->cudnn_call_rows = call;
        p->cudnn_workspace = (int64_t)p->acts.sizes->attention_workspace_bytes(cfg->device.attention_kernel, call,
                                                                              (int)nh, (int)nkv, (int)hd);
        attn_ws += p->cudnn_workspace;
    }
    for (int pol = 0; pol < ACT_POLICY_COUNT; pol++) {
        int64_t *mem = p->mem[pol];
        if (p->shard == SHARD_NONE) {
            mem[PLAN_MEM_WEIGHTS_BF16] = cuda ? (int64_t)(2 * N) : 0;
            mem[PLAN_MEM_MASTER] = (int64_t)(4 * N);
            mem[PLAN_MEM_GRADS] = (int64_t)(4 * N);
            mem[PLAN_MEM_ADAMW] = (int64_t)(8 * N);
        } else { /* the allocations of model.c: whole compute copy and gradients, the master and moments cut */
            mem[PLAN_MEM_WEIGHTS_BF16] = (int64_t)e * p->weights_numel;
            mem[PLAN_MEM_MASTER] = 4 * p->buffer_numel / p->world;
            mem[PLAN_MEM_GRADS] = 4 * p->grad_numel;
            mem[PLAN_MEM_ADAMW] = 8 * p->buffer_numel / p->world;
        }
        mem[PLAN_MEM_ACTIVATIONS] = p->offload ? p->acts.peak_offload[pol] : p->acts.peak[pol];
        mem[PLAN_MEM_CP_RING] = ring;
        mem[PLAN_MEM_CP_SCAN] = scan;
        mem[PLAN_MEM_WORKSPACE] = p->acts.loss_workspace + (cuda ? (64LL << 20) + attn_ws : 0);
        mem[PLAN_MEM_RUNTIME] = cuda ? plan_cuda_runtime(p->dp, p->cp) : 0;
        for (int c = 0; c < PLAN_MEM_COUNT; c++) p->total[pol] += mem[c];
    }
    p->capacity = (int64_t)(cfg->device.memory_gib * GIB);
    plan_host(p, cfg);

    /* FLOPs per token of training */
    double layer_mm = (double)(p->params.matmul - m->vocab_size * m->hidden_size); /* without the head */
    p->flops_dense = 6.0 * (double)p->params.matmul;
    double attn_fwd_full = 4.0 * (double)nh * (double)hd * (double)T; /* QK^T and PV over all T keys */
    p->flops_attn_full = 3.0 * attn_fwd_full * p->n_full;
    p->flops_attn_causal = p->flops_attn_full / 2;
    /* KDA's chunk (model.linear_attention kda) is counted as GDN's: FLA's chunk_kda forms the same products (its
     * K K^T and Q K^T from decay-scaled keys in 16-row sub-chunks: the same multiply-adds); the per-channel decays
     * are elementwise work, not counted (docs/design/kda.md) */
    double C = GDN_CHUNK;
    double gdn_fwd = (double)nv * plan_gdn_fwd_chunk(C, (double)dk, (double)dv) / C;
    double gdn_bwd = (double)nv * plan_gdn_bwd_chunk(C, (double)dk, (double)dv) / C;
    p->flops_gdn = (gdn_fwd + gdn_bwd) * p->n_linear;
    p->flops_model = p->flops_dense + p->flops_attn_causal + p->flops_gdn;
    /* the row chunks (model_block.c): under full and remat the backward reruns every chunk's per-token
     * forward, its in_proj, the mixer's output projection and the MLP's gate/up (not down: nothing reads its
     * output again), and the block's recompute before it reruns the in_proj once more (and the rest of the
     * mixer up to its core; full: attention too). Under none nothing reruns (but the CP halo's Kc-1 tail
     * rows per fragment, which the forward projects twice: not counted) */
    int64_t Pg = Cc + nv * dv + 2 * nv, Pa = 2 * nh * hd + 2 * nkv * hd;
    if (cfg->model.linear_attention == LINEAR_ATTN_KDA) /* [q|k|v|f_a|g_a|b], then f_b's and g_b's GEMMs */
        Pg = Cc + 2 * dv + nv + (nv * dk + nv * dv) * dv / m->hidden_size;
    double in_proj = (double)m->hidden_size * (double)(p->n_linear * Pg + p->n_full * Pa);
    double per_chunk = layer_mm - (double)m->num_hidden_layers * (double)m->intermediate_size * (double)m->hidden_size;
    p->flops_recompute[ACT_POLICY_NONE] = 0;
    /* checkpoint.input_rows whole: the backward finds the recompute's in_proj outputs, so no in_proj again */
    const double in_again = p->acts.inputs_whole ? 0 : 1;
    p->flops_recompute[ACT_POLICY_FULL] = 2 * (per_chunk + in_again * in_proj) + p->flops_attn_causal / 3 +
                                          gdn_fwd * p->n_linear;
    p->flops_recompute[ACT_POLICY_REMAT] = 2 * (per_chunk + in_again * in_proj) + gdn_fwd * p->n_linear;
    /* checkpoint.keep_layers: the kept layers' share of the config's policy's recompute is gone (each layer's
     * part of the sums above: its GEMMs but down, its in_proj again, its mixer's forward) */
    const int kpol = cfg->checkpoint.activations;
    for (int l = p->acts.first_kept; l < L && kpol != ACT_POLICY_NONE; l++) {
        const int lin = config_layer_kind(cfg, l) == LAYER_KIND_LINEAR;
        const double chunk_l = mm_layer[l] - (double)m->intermediate_size * (double)m->hidden_size;
        const double in_l = (double)m->hidden_size * (double)(lin ? Pg : Pa);
        const double mixer = lin ? gdn_fwd : kpol == ACT_POLICY_FULL ? p->flops_attn_causal / 3 / p->n_full : 0;
        p->flops_recompute[kpol] -= 2 * (chunk_l + in_again * in_l) + mixer;
    }
    if (kpol != ACT_POLICY_NONE && p->acts.first_kept == 0) p->flops_recompute[kpol] = 0; /* no rounding residue */
    free(mm_layer);

    /* communication per step per rank */
    double micro = (double)cfg->train.grad_accum * (double)cfg->data.micro_batch; /* samples per step per rank */
    double W = (double)p->world;
    double grad = W > 1 ? 2.0 * (W - 1) / W * 4.0 * N : 0;
    /* sharded: optimizer all-reduces; gradients reduce-scatters (half an all-reduce's bytes), the layers every
     * micro-batch, the head at the step's end; both all-gather the compute copy */
    if (p->shard >= SHARD_GRADIENTS)
        grad = (W - 1) / W * 4.0 * ((double)(p->buffer_numel - head_numel) * (double)cfg->train.grad_accum +
                                    (double)head_numel);
    /* after the step the compute copy is all-gathered (shard weights: the head's buckets; the layers are
     * gathered per micro-batch instead) */
    if (p->shard == SHARD_WEIGHTS) grad += (W - 1) / W * (double)e * (double)head_numel + p->weight_gather;
    else if (p->shard != SHARD_NONE) grad += (W - 1) / W * (double)e * (double)p->buffer_numel;
    double ring_fwd = 0, ring_bwd = 0, scan1 = 0, halo1 = 0;
    if (P > 1) {
        double seg2 = (double)(T / P); /* 2s tokens per sample per rank */
        double kv_tok = 2.0 * nkv * hd;
        ring_fwd = (P - 1) * seg2 * kv_tok * e * p->n_full;
        ring_bwd = ring_fwd + P * seg2 * kv_tok * 4 * p->n_full; /* KV again + fp32 dK|dV */
        /* per sample and pass: the scan all-gathers two [M | H] slots per rank; the chain's hand-offs carry one
         * state each way (the receiver's side too: an exchange); the hybrid's two hand-offs and one all-gathered
         * slot; the chain of every fragment at cp >= 3 four hand-offs (cp_gdn.c, docs/design/gdn-cp.md) */
        const double slot = (double)nv * dk * (dk + dv) * 4, state = (double)nv * dk * dv * 4;
        const CpGdnMethod gm = cp_gdn_method(cfg);
        scan1 = gm == CP_GDN_HYBRID ? 2 * state + (P - 1) * slot
                : gm == CP_GDN_CHAIN ? (P == 2 ? 2 : 4) * state : (P - 1) * 2.0 * slot;
        scan1 *= p->n_linear;
        halo1 = (P - 1) * 2.0 * (m->linear_conv_kernel_dim - 1) * Cc * e * p->n_linear;
    }
    for (int pol = 0; pol < ACT_POLICY_COUNT; pol++) {
        double again = pol == ACT_POLICY_FULL ? 1 : 0; /* full reruns the forward's communication */
        p->comm[pol][PLAN_COMM_GRAD_ALLREDUCE] = grad;
        p->comm[pol][PLAN_COMM_RING_P2P] = micro * (ring_fwd * (1 + again) + ring_bwd);
        p->comm[pol][PLAN_COMM_GDN_STATES] = micro * scan1 * (2 + again);
        p->comm[pol][PLAN_COMM_HALO_ALLGATHER] = micro * halo1 * (2 + again);
    }
}

void plan_free(Plan *p) { model_acts_free(&p->acts); }

bool plan_host_fits(const Plan *p, ActPolicy policy) {
    return !p->offload || (p->host_capacity >= 0 && p->host_node[policy] <= p->host_capacity);
}

int plan_shard_fit(const Config *cfg, ActPolicy policy, int64_t need[SHARD_COUNT]) {
    int first = -1;
    for (int st = 0; st < SHARD_COUNT; st++) {
        need[st] = -1;
        if (st != SHARD_NONE && config_world(cfg) == 1) continue; /* nothing to cut */
        Config c = *cfg; /* plan_build reads the copy only */
        c.parallel.shard = st;
        Plan q;
        plan_build(&q, &c);
        need[st] = q.total[policy];
        if (first < 0 && plan_fits(&q, policy)) first = st;
        plan_free(&q);
    }
    return first;
}

/* plan q's total under cfg's policy within device memory less PLAN_KEEP_MARGIN (and host memory) */
static bool plan_fits_margin(const Plan *q, const Config *cfg) {
    const ActPolicy pol = (ActPolicy)cfg->checkpoint.activations;
    return q->total[pol] <= (int64_t)((double)q->capacity * (1.0 - PLAN_KEEP_MARGIN)) && plan_host_fits(q, pol);
}

/* checkpoint.keep_layers as it runs: the number, or for auto the most layers (the last ones) whose plan total
 * under the config's policy fits device.memory_gib less PLAN_KEEP_MARGIN of it (and host memory), else 0; every
 * layer under none. chunk_rows as cfg gives it (0: model_acts.c's rule, 1 GiB of chunk scratch). */
static int plan_keep_layers(const Config *cfg) {
    const int L = (int)cfg->model.num_hidden_layers;
    if (cfg->checkpoint.activations == ACT_POLICY_NONE) return L;
    if (cfg->checkpoint.keep_layers != CONFIG_AUTO) return (int)cfg->checkpoint.keep_layers;
    for (int n = L; n > 0; n--) { /* the most layers that fit: plan's total, from the same table, at each n */
        Config c = *cfg; /* plan_build_as reads the copy only; chunk_rows as given (0: the 1 GiB rule) */
        c.checkpoint.keep_layers = n;
        Plan q;
        plan_build_as(&q, &c);
        const bool fits = plan_fits_margin(&q, cfg);
        plan_free(&q);
        if (fits) return n;
    }
    return 0;
}

/* checkpoint.chunk_rows as it runs, for c with keep_layers a number: the number, or for 0 the rows of the largest
 * chunk scratch among PLAN_CHUNK_BYTES_MAX, half of it, ... down to twice model_acts.c's rule
 * (ACT_CHUNK_BYTES_RULE) whose plan fits as plan_keep_layers asks, else the rule's (at most a fragment) */
static int64_t plan_chunk_rows(const Config *c) {
    if (c->checkpoint.chunk_rows) return c->checkpoint.chunk_rows;
    Config q = *c;
    Plan p;
    plan_build_as(&p, &q);
    const int64_t row_bytes = p.acts.chunk_row_bytes, rule = p.acts.chunk_rows, frag = p.acts.frag_rows;
    plan_free(&p);
    for (int64_t budget = PLAN_CHUNK_BYTES_MAX; budget >= 2 * ACT_CHUNK_BYTES_RULE; budget /= 2) {
        int64_t rows = budget / row_bytes / GDN_CHUNK * GDN_CHUNK;
        if (rows > frag) rows = frag;
        if (rows <= rule) break; /* no larger than the rule's */
        q.checkpoint.chunk_rows = rows;
        plan_build_as(&p, &q);
        const bool fits = plan_fits_margin(&p, c);
        plan_free(&p);
        if (fits) return rows;
    }
    return rule;
}

/* checkpoint.input_rows as it runs: chunk or whole as given, or for auto whole where the plan with it fits as
 * plan_keep_layers asks with keep_layers as given (auto: none kept), else chunk; chunk under none (every layer
 * keeps every row) */
static int plan_input_rows(const Config *cfg) {
    if (cfg->checkpoint.activations == ACT_POLICY_NONE) return INPUT_ROWS_CHUNK;
    if (cfg->checkpoint.input_rows != INPUT_ROWS_AUTO) return cfg->checkpoint.input_rows;
    Config c = *cfg; /* plan_build_as reads the copy only */
    c.checkpoint.input_rows = INPUT_ROWS_WHOLE;
    if (c.checkpoint.keep_layers == CONFIG_AUTO) c.checkpoint.keep_layers = 0;
    if (c.checkpoint.mlp_act == MLP_ACT_AUTO) c.checkpoint.mlp_act = MLP_ACT_REWRITTEN;
    Plan q;
    plan_build_as(&q, &c);
    const bool fits = plan_fits_margin(&q, cfg);
    plan_free(&q);
    return fits ? INPUT_ROWS_WHOLE : INPUT_ROWS_CHUNK;
}

/* checkpoint.mlp_act auto as it runs, for c with the layers and chunks resolved: kept where the plan with it fits as
 * plan_keep_layers asks, else rewritten. Last: a kept act spares the SwiGLU backward's store of act and the down
 * projection's backward split in two calls around it (docs/design/model.md), where the memory it takes would hold a
 * kept layer or larger chunks, which spare whole recomputes. */
static int plan_mlp_act(const Config *c) {
    /* no layer keeps under full / remat at keep_layers 0: nothing to decide for the run; plan's none column counts act
     * kept, as a run under none that fits its memory keeps it */
    if (c->checkpoint.activations != ACT_POLICY_NONE && c->checkpoint.keep_layers == 0) return MLP_ACT_KEPT;
    Config q = *c; /* plan_build_as reads the copy only */
    q.checkpoint.mlp_act = MLP_ACT_KEPT;
    Plan p;
    plan_build_as(&p, &q);
    const bool fits = plan_fits_margin(&p, c);
    plan_free(&p);
    return fits ? MLP_ACT_KEPT : MLP_ACT_REWRITTEN;
}

Config plan_resolve(const Config *cfg) {
    Config c = *cfg;
    c.checkpoint.input_rows = plan_input_rows(cfg); /* first: per byte it spares more recompute than a kept layer */
    const bool act_auto = c.checkpoint.mlp_act == MLP_ACT_AUTO; /* auto: the layers and chunks first, act rewritten */
    if (act_auto) c.checkpoint.mlp_act = MLP_ACT_REWRITTEN;
    c.checkpoint.keep_layers = plan_keep_layers(&c); /* at the rule's chunks: the layers before the chunk size */
    c.checkpoint.chunk_rows = plan_chunk_rows(&c);
    if (act_auto) c.checkpoint.mlp_act = plan_mlp_act(&c);
    return c;
}

void plan_build(Plan *p, const Config *cfg) {
    const Config c = plan_resolve(cfg); /* cfg itself is printed as given */
    plan_build_as(p, &c);
}

bool plan_fits(const Plan *p, ActPolicy policy) {
    return p->total[policy] <= p->capacity && plan_host_fits(p, policy);
}

/* ---- printing ----------------------------------------------------------- */

static void plan_commas(int64_t v, char *buf, size_t n) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", (long long)(v < 0 ? -v : v));
    size_t len = strlen(tmp), k = 0;
    if (v < 0 && k < n - 1) buf[k++] = '-';
    for (size_t i = 0; i < len && k < n - 1; i++) {
        buf[k++] = tmp[i];
        if ((len - i - 1) % 3 == 0 && i + 1 < len && k < n - 1) buf[k++] = ',';
    }
    buf[k] = 0;
}

static void plan_bytes(double b, char *buf, size_t n) {
    if (b >= GIB) snprintf(buf, n, "%.2f GiB", b / GIB);
    else if (b >= 1024.0 * 1024.0) snprintf(buf, n, "%.2f MiB", b / (1024.0 * 1024.0));
    else if (b >= 1024.0) snprintf(buf, n, "%.2f KiB", b / 1024.0);
    else snprintf(buf, n, "%.0f B", b);
}

static void plan_flops(double v, char *buf, size_t n) {
    if (v >= 1e15) snprintf(buf, n, "%.3f PFLOP", v / 1e15);
    else if (v >= 1e12) snprintf(buf, n, "%.3f TFLOP", v / 1e12);
    else if (v >= 1e9) snprintf(buf, n, "%.3f GFLOP", v / 1e9);
    else if (v >= 1e6) snprintf(buf, n, "%.3f MFLOP", v / 1e6);
    else snprintf(buf, n, "%.0f FLOP", v);
}

/* A run over its device memory whose ring attention trades memory for speed (lib/cp/cp_ring.c): whether the cheaper
 * choices fit with the same checkpoint.activations. At cp 2 the kept K|V holds every softmax layer's received
 * block to its backward; with the cuDNN route one call per ring step sizes cuDNN's workspace for a rank's rows,
 * the rule's calls for a fragment's (half). The fewest changes that fit are named, each with its plan total; a
 * change that saves nothing here (cp 1, no softmax layer, our kernel, already set) plans the same and is not. */
static void plan_print_ring_hints(const Config *cfg, ActPolicy pol, FILE *f) {
    int64_t need[3]; /* keep off; pairs; both */
    int fits[3];
    for (int v = 0; v < 3; v++) {
        Config c = *cfg; /* plan_build reads the copy only; its strings are the original's */
        if (v != 1) c.parallel.ring_keep_kv = false;
        if (v != 0) c.parallel.ring_calls = RING_CALLS_PAIRS;
        Plan q;
        plan_build(&q, &c);
        need[v] = q.total[pol];
        fits[v] = plan_fits(&q, pol);
        plan_free(&q);
    }
    static const char *const key[2] = {"parallel.ring_keep_kv=false", "parallel.ring_calls=pairs"};
    static const char *const why[2] = {
        "the cp 2 backward passes K|V again instead of keeping each softmax layer's received block, and its last "
        "dK|dV hop waits exposed",
        "the zigzag rule's calls one by one, cuDNN's workspace sized for a fragment's rows, not a rank's"};
    char a[32];
    for (int v = 0; v < 2; v++)
        if (fits[v]) {
            plan_bytes((double)need[v], a, sizeof a);
            fprintf(f, "  hint: %s fits (%s): %s\n", key[v], a, why[v]);
        }
    if (!fits[0] && !fits[1] && fits[2]) {
        plan_bytes((double)need[2], a, sizeof a);
        fprintf(f, "  hint: %s and %s together fit (%s): %s; %s\n", key[0], key[1], a, why[0], why[1]);
    }
}

/* parallel.shard: each stage's weights, gradients and optimizer state per rank and total, with this policy */
static void plan_print_shard(const Plan *p, const Config *cfg, ActPolicy pol, FILE *f) {
    char a[32], b[32];
    int64_t need[SHARD_COUNT];
    plan_shard_fit(cfg, pol, need);
    fprintf(f, "\nparallel.shard over the world of %lld (now: %s%s)\n", (long long)p->world,
            shard_names[cfg->parallel.shard], p->world == 1 && cfg->parallel.shard ? ", runs as none: one rank" : "");
    const double N = (double)p->params.total;
    for (int st = 0; st < SHARD_COUNT; st++) {
        if (need[st] < 0) {
            fprintf(f, "  %-10s needs more than one rank\n", shard_names[st]);
            continue;
        }
        Config c = *cfg;
        c.parallel.shard = st;
        Plan q;
        plan_build(&q, &c);
        int64_t states = 0;
        for (int k = PLAN_MEM_WEIGHTS_BF16; k <= PLAN_MEM_ADAMW; k++) states += q.mem[pol][k];
        const double gather = q.weight_gather;
        plan_free(&q);
        plan_bytes((double)states, a, sizeof a);
        plan_bytes((double)need[st], b, sizeof b);
        fprintf(f, "  %-10s states %s (%.1f B per parameter), total %s: %s", shard_names[st], a, states / N, b,
                need[st] <= p->capacity ? "fits" : "does not fit");
        if (st == SHARD_WEIGHTS) {
            plan_bytes(gather, a, sizeof a);
            fprintf(f, "; the layers' all-gathers %s per step", a);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "  (optimizer: fp32 master and AdamW m, v cut, gradients whole; gradients: also the gradients, but for "
               "embed_tokens', the head's and two layers' whole ones the backward adds into; the compute copy "
               "stays whole; weights: also the layers' compute copy, two layers whole at a time, embed_tokens' and "
               "the head's whole)\n");
}

int plan_print(const Plan *p, const Config *cfg, FILE *f) {
    char a[64], b[64], c[64];
    int pol = cfg->checkpoint.activations;
    const char *dev = device_kind_names[cfg->device.kind];

    fprintf(f, "\nlayout\n");
    fprintf(f, "  world %lld = dp %lld x cp %lld, device %s, %.1f GiB per %s\n", (long long)p->world,
            (long long)p->dp, (long long)p->cp, dev, cfg->device.memory_gib,
            cfg->device.kind == DEVICE_KIND_CUDA ? "GPU" : "rank");
    plan_commas(cfg->data.seq_len, a, sizeof a);
    plan_commas(p->segment_tokens, b, sizeof b);
    fprintf(f, "  sample %s tokens = %lld zigzag segments of %s; rank r holds segments r and %lld-r\n", a,
            (long long)(2 * p->cp), b, (long long)(2 * p->cp - 1));
    if (p->cp > 1 && p->n_linear > 0) {
        static const char *const how[CP_GDN_METHODS] = {
            "", "the prefix scan (every fragment's transition, one all-gather, the fold)",
            "the chain (state passes alone, rank to rank)",
            "the hybrid (segments 0 .. cp-1 chained by state passes, the rest folded from their transitions)"};
        const CpGdnMethod gm = cp_gdn_method(cfg);
        fprintf(f, "  GDN state passing: %s, %s\n", cp_gdn_method_names[gm], how[gm]);
    }
    plan_commas(p->tokens_per_rank, a, sizeof a);
    plan_commas(p->tokens_per_step, b, sizeof b);
    fprintf(f, "  tokens per rank per micro-batch %s (micro_batch %lld); micro-batches per step %lld; "
               "tokens per step %s\n",
            a, (long long)cfg->data.micro_batch, (long long)cfg->train.grad_accum, b);

    fprintf(f, "\nmodel\n");
    fprintf(f, "  %lld layers: %d linear_attention (%s), %d full_attention\n", (long long)cfg->model.num_hidden_layers,
            p->n_linear, cfg->model.linear_attention == LINEAR_ATTN_KDA ? "Kimi Delta Attention" : "Gated DeltaNet",
            p->n_full);
    plan_commas(p->params.total, a, sizeof a);
    plan_commas(p->hf_params, b, sizeof b);
    fprintf(f, "  parameters %s (%.3f B); Hugging Face state dict %s%s\n", a, p->params.total / 1e9, b,
            p->hf_params == p->params.total ? " (equal)" : " (MISMATCH: a bug)");
    for (int g = 0; g < PARAM_GROUP_COUNT; g++) {
        plan_commas(p->params.per_group[g], a, sizeof a);
        fprintf(f, "    %-10s %s\n", param_group_names[g], a);
    }
    plan_commas(p->params.matmul, a, sizeof a);
    fprintf(f, "    (in GEMMs per token, incl. lm_head: %s)\n", a);

    fprintf(f, "\n%-36s %-16s %-16s %-16s   (checkpoint.activations: %s)\n",
            cfg->device.kind == DEVICE_KIND_CUDA ? "memory per GPU" : "memory per rank", "none", "full", "remat",
            act_policy_names[pol]);
    for (int k = 0; k < PLAN_MEM_COUNT; k++) {
        plan_bytes((double)p->mem[0][k], a, sizeof a);
        plan_bytes((double)p->mem[1][k], b, sizeof b);
        plan_bytes((double)p->mem[2][k], c, sizeof c);
        fprintf(f, "  %-34s %-16s %-16s %-16s\n", plan_mem_names[k], a, b, c);
    }
    const ActTable *t = &p->acts;
    for (int k = 0; k < 5; k++) {
        static const char *names[] = {"  kept forward -> backward", "  recompute of one layer",
                                      "  backward gradients", "  delta-rule workspace", "  (kept in host memory)"};
        const char *name = k == 0 && p->offload ? "  kept on device (head, 2 slots)" : names[k];
        if (k == 4 && !p->offload) break;
        double v[3];
        for (int q = 0; q < 3; q++)
            v[q] = k == 0 ? (double)(p->offload ? t->offload_device[q] : t->kept[q])
                 : k == 1 ? (double)t->recompute[q] : k == 2 ? (double)t->grad_working
                 : k == 3 ? (double)t->gdn_states : (double)t->offload_host[q];
        plan_bytes(v[0], a, sizeof a);
        plan_bytes(v[1], b, sizeof b);
        plan_bytes(v[2], c, sizeof c);
        fprintf(f, "  %-34s %-16s %-16s %-16s\n", name, a, b, c);
    }
    if (p->cudnn_workspace) {
        plan_bytes((double)p->cudnn_workspace, a, sizeof a);
        fprintf(f, "  %-34s %-16s %-16s %-16s   (in workspaces; %s, one ring call of %lld rows)\n",
                "  cuDNN attention workspace", a, a, a, attn_kernel_names[cfg->device.attention_kernel],
                (long long)p->cudnn_call_rows);
    }
    plan_bytes((double)p->total[0], a, sizeof a);
    plan_bytes((double)p->total[1], b, sizeof b);
    plan_bytes((double)p->total[2], c, sizeof c);
    fprintf(f, "  %-34s %-16s %-16s %-16s\n", "total", a, b, c);
    fprintf(f, "  %-34s %-16s %-16s %-16s\n", "fits device.memory_gib?", p->total[0] <= p->capacity ? "yes" : "no",
            p->total[1] <= p->capacity ? "yes" : "no", p->total[2] <= p->capacity ? "yes" : "no");

    if (pol != ACT_POLICY_NONE) {
        const int L = (int)cfg->model.num_hidden_layers;
        char why[160];
        const int64_t more = t->kept[pol] - t->pure_kept;
        plan_bytes((double)more, a, sizeof a);
        if (cfg->checkpoint.keep_layers == CONFIG_AUTO) {
            plan_bytes((double)p->capacity * (1.0 - PLAN_KEEP_MARGIN), b, sizeof b);
            snprintf(why, sizeof why, "auto: the most that fit %s", b);
        } else
            snprintf(why, sizeof why, "checkpoint.keep_layers");
        if (t->keep_layers > 0)
            fprintf(f, "\nselective: layers %d..%d of %d keep their activations as under none (%s), %s kept more "
                       "than %s alone\n", t->first_kept, L - 1, L, why, a, act_policy_names[pol]);
        else fprintf(f, "\nselective: no layer keeps its activations whole (%s: 0)\n", why);
        const int whole = t->inputs_whole;
        if (cfg->checkpoint.input_rows == INPUT_ROWS_AUTO)
            snprintf(why, sizeof why, "checkpoint.input_rows auto: %s", whole ? "fits memory less 5%" : "would not fit "
                     "memory less 5%");
        else snprintf(why, sizeof why, "checkpoint.input_rows %s", input_rows_names[cfg->checkpoint.input_rows]);
        fprintf(f, "input rows: %s (%s)\n", whole ? "whole: a recomputed layer's ln1 and in_proj outputs have every "
                "row in the recompute's scratch; the backward reruns no in_proj" : "chunk: the backward reruns each "
                "chunk's ln1 and in_proj", why);
    }
    if (t->keep_layers > 0) {
        char why[96];
        if (cfg->checkpoint.mlp_act == MLP_ACT_AUTO)
            snprintf(why, sizeof why, "checkpoint.mlp_act auto: %s", t->act_kept ? "fits memory less 5%" : "would not "
                     "fit memory less 5%");
        else snprintf(why, sizeof why, "checkpoint.mlp_act %s", mlp_act_names[cfg->checkpoint.mlp_act]);
        fprintf(f, "%sMLP act: %s (%s)\n", pol == ACT_POLICY_NONE ? "\n" : "", t->act_kept ? "kept: a layer that keeps "
                "its activations keeps the down projection's input too" : "rewritten: the backward of every layer "
                "writes the down projection's input again from gate_up, beside the SwiGLU gradient", why);
    }
    plan_commas(t->chunk_rows, a, sizeof a);
    plan_bytes((double)t->chunk_scratch[pol], b, sizeof b);
    fprintf(f, "\nrow chunks: %s rows (%s), %s of chunk scratch (%s)\n", a,
            cfg->checkpoint.chunk_rows ? "checkpoint.chunk_rows"
                                       : "checkpoint.chunk_rows 0: the largest multiple of 64 whose chunk scratch "
                                         "fits the largest of 4, 2, 1 GiB that keeps the plan within memory less 5% "
                                         "(1 GiB whatever it leaves), at most a fragment",
            b, pol == ACT_POLICY_NONE ? "the conv output + gradients" : "forward + gradients");
    fprintf(f, "  %s\n", pol == ACT_POLICY_NONE
                             ? "none: the per-token tensors the backward reads are kept whole per layer; nothing is "
                               "recomputed"
                             : "the backward recomputes each chunk's per-token forward before its own");
    fprintf(f, "  every row, because the mixer's core reads across tokens: GDN q, k, v, z, beta, g, the delta rule's\n"
               "  output and their gradients (its recurrence runs through the fragment); attention q, k|v, gate,\n"
               "  output, LSE and their gradients (the ring passes whole K|V blocks); the residual stream's\n"
               "  gradient (every layer's backward adds into it). CP ring: K|V receive buffers (the block in\n"
               "  flight; at cp 2 with parallel.ring_keep_kv each softmax layer's received block, kept for its\n"
               "  backward), fp32 dQ (every query sums over all ring steps), fp32 dK|dV partials (the message);\n"
               "  the ring forward's buffers share memory with the backward's\n");
    if (p->offload) {
        fprintf(f, "\nhost memory per node (checkpoint.offload: host; %lld ranks per node)\n",
                (long long)p->tasks_per_node);
        for (int k = 0; k < 5; k++) {
            static const char *names[] = {"offloaded activations per rank", "process per rank (cuda)",
                                          "rank memory (cpu: host memory)", "checkpoint staging (rank 0)",
                                          "total per node"};
            double v[3];
            for (int q = 0; q < 3; q++)
                v[q] = k == 0 ? (double)p->host_offload[q] : k == 1 ? (double)p->host_runtime
                     : k == 2 ? (double)p->host_rank_device[q] : k == 3 ? (double)p->host_staging
                     : (double)p->host_node[q];
            plan_bytes(v[0], a, sizeof a);
            plan_bytes(v[1], b, sizeof b);
            plan_bytes(v[2], c, sizeof c);
            fprintf(f, "  %-34s %-16s %-16s %-16s\n", names[k], a, b, c);
        }
        if (p->host_capacity >= 0) plan_bytes((double)p->host_capacity, a, sizeof a);
        else snprintf(a, sizeof a, "unknown");
        fprintf(f, "  capacity %s (%s)\n", a, p->host_source);
    }

    fprintf(f, "\ntraining FLOPs per token (2 per multiply-add; attention counted causal = half the pairs)\n");
    plan_flops(p->flops_dense, a, sizeof a);
    fprintf(f, "  dense GEMMs (6 x %.3f B matmul params)       %s\n", p->params.matmul / 1e9, a);
    plan_flops(p->flops_attn_causal, a, sizeof a);
    plan_flops(p->flops_attn_full, b, sizeof b);
    fprintf(f, "  softmax attention, %d layers, causal          %s   (non-causal convention: %s)\n", p->n_full, a, b);
    plan_flops(p->flops_gdn, a, sizeof a);
    fprintf(f, "  %s chunk core, %d layers          %s\n",
            cfg->model.linear_attention == LINEAR_ATTN_KDA ? "KDA (Kimi Delta)" : "Gated DeltaNet  ", p->n_linear, a);
    plan_flops(p->flops_model, a, sizeof a);
    plan_flops(p->flops_model - p->flops_attn_causal + p->flops_attn_full, b, sizeof b);
    fprintf(f, "  model FLOPs per token (for MFU)               %s   (non-causal convention: %s)\n", a, b);
    plan_flops(p->flops_recompute[pol], a, sizeof a);
    fprintf(f, "  + recompute under %-5s (hardware only)       %s", act_policy_names[pol], a);
    if (pol != ACT_POLICY_NONE && t->keep_layers > 0) fprintf(f, "   (%d kept layers recompute nothing)", t->keep_layers);
    fprintf(f, "\n");
    plan_flops(p->flops_model * (double)p->tokens_per_step, a, sizeof a);
    fprintf(f, "  model FLOPs per step                          %s\n", a);

    fprintf(f, "\ncommunication per step, bytes sent per rank (%s)\n", act_policy_names[pol]);
    for (int k = 0; k < PLAN_COMM_COUNT; k++) {
        plan_bytes(p->comm[pol][k], a, sizeof a);
        fprintf(f, "  %-34s %s\n", plan_comm_names[k], a);
    }

    plan_print_shard(p, cfg, (ActPolicy)pol, f);

    int64_t tot = p->total[pol];
    plan_bytes((double)tot, a, sizeof a);
    plan_bytes((double)p->capacity, b, sizeof b);
    const char *per = cfg->device.kind == DEVICE_KIND_CUDA ? "GPU" : "rank";
    if (plan_fits(p, pol)) {
        plan_bytes((double)(p->capacity - tot), c, sizeof c);
        fprintf(f, "\nverdict: FITS with checkpoint.activations=%s: %s of %s per %s, %s free", act_policy_names[pol], a,
                b, per, c);
        if (p->offload) {
            plan_bytes((double)p->host_node[pol], a, sizeof a);
            plan_bytes((double)p->host_capacity, b, sizeof b);
            fprintf(f, "; host %s of %s per node", a, b);
        }
        fprintf(f, "\n");
        return RS_EXIT_OK;
    }
    if (tot > p->capacity) {
        plan_bytes((double)(tot - p->capacity), c, sizeof c);
        fprintf(f, "\nverdict: DOES NOT FIT with checkpoint.activations=%s: needs %s, device.memory_gib gives %s, over by "
                   "%s\n",
                act_policy_names[pol], a, b, c);
    }
    if (!plan_host_fits(p, (ActPolicy)pol)) {
        plan_bytes((double)p->host_node[pol], a, sizeof a);
        if (p->host_capacity < 0)
            fprintf(f, "\nverdict: DOES NOT FIT with checkpoint.offload=host: the node's host memory is unknown (no "
                       "/proc/meminfo here); set device.host_memory_gib (needs %s per node)\n",
                    a);
        else {
            plan_bytes((double)p->host_capacity, b, sizeof b);
            plan_bytes((double)(p->host_node[pol] - p->host_capacity), c, sizeof c);
            fprintf(f, "\nverdict: DOES NOT FIT with checkpoint.offload=host: host memory per node needs %s, %s gives %s, "
                       "over by %s (fewer ranks per node, or checkpoint.offload=none)\n",
                    a, p->host_source, b, c);
        }
    }
    for (int q = 0; q < ACT_POLICY_COUNT; q++)
        if (q != pol && plan_fits(p, (ActPolicy)q))
            fprintf(f, "  hint: checkpoint.activations=%s fits\n", act_policy_names[q]);
    int64_t need[SHARD_COUNT];
    int st = plan_shard_fit(cfg, (ActPolicy)pol, need);
    if (st > (int)p->shard) {
        plan_bytes((double)need[st], c, sizeof c);
        fprintf(f, "  hint: parallel.shard=%s fits (%s with checkpoint.activations=%s)\n", shard_names[st], c,
                act_policy_names[pol]);
    }
    if (tot > p->capacity) plan_print_ring_hints(cfg, pol, f);
    if (tot > p->capacity && p->acts.inputs_whole && cfg->checkpoint.input_rows == INPUT_ROWS_WHOLE) {
        Config ch = *cfg; /* plan_build reads the copy only */
        ch.checkpoint.input_rows = INPUT_ROWS_CHUNK;
        Plan q;
        plan_build(&q, &ch);
        if (plan_fits(&q, (ActPolicy)pol)) {
            plan_bytes((double)q.total[pol], c, sizeof c);
            fprintf(f, "  hint: checkpoint.input_rows=chunk fits (%s): the backward reruns each chunk's ln1 and "
                       "in_proj instead of holding every row of them (auto picks it where whole does not fit)\n",
                    c);
        }
        plan_free(&q);
    }
    if (cfg->device.attention_kernel == ATTN_KERNEL_CUDNN_DET && tot > p->capacity) {
        plan_bytes((double)p->cudnn_workspace, c, sizeof c);
        fprintf(f, "  hint: %s of it is device.attention_kernel=cudnn_det's workspace (cuDNN's deterministic "
                   "backward keeps a rows x rows x heads matrix); ringscan (ours, deterministic) or cudnn does not\n",
                c);
    }
    return RS_EXIT_FAIL;
}

void plan_print_json(const Plan *p, const Config *cfg, FILE *f) {
    json_t *root = json_object();
    json_t *layout = json_pack("{sI sI sI sI sI sI sI sI}", "world", (json_int_t)p->world, "dp", (json_int_t)p->dp,
                               "cp", (json_int_t)p->cp, "seq_len", (json_int_t)cfg->data.seq_len, "segment_tokens",
                               (json_int_t)p->segment_tokens, "tokens_per_rank", (json_int_t)p->tokens_per_rank,
                               "tokens_per_step", (json_int_t)p->tokens_per_step, "layers_full", (json_int_t)p->n_full);
    json_object_set_new(layout, "layers_linear", json_integer(p->n_linear));
    json_object_set_new(layout, "gdn_cp", json_string(cp_gdn_method_names[cp_gdn_method(cfg)]));
    json_object_set_new(root, "layout", layout);
    json_t *params = json_pack("{sI sI sI sI}", "total", (json_int_t)p->params.total, "hf_state_dict",
                               (json_int_t)p->hf_params, "matmul", (json_int_t)p->params.matmul, "embedding",
                               (json_int_t)p->params.embedding);
    json_t *groups = json_object();
    for (int g = 0; g < PARAM_GROUP_COUNT; g++)
        json_object_set_new(groups, param_group_names[g], json_integer(p->params.per_group[g]));
    json_object_set_new(params, "groups", groups);
    json_object_set_new(root, "parameters", params);
    json_t *mem = json_object();
    for (int pol = 0; pol < ACT_POLICY_COUNT; pol++) {
        json_t *m = json_object();
        for (int c = 0; c < PLAN_MEM_COUNT; c++) json_object_set_new(m, plan_mem_names[c], json_integer(p->mem[pol][c]));
        json_object_set_new(m, "total", json_integer(p->total[pol]));
        json_object_set_new(m, "cudnn_workspace", json_integer(p->cudnn_workspace));
        json_object_set_new(m, "activations_kept", json_integer(p->acts.kept[pol]));
        json_object_set_new(m, "activations_kept_device",
                            json_integer(p->offload ? p->acts.offload_device[pol] : p->acts.kept[pol]));
        json_object_set_new(m, "activations_host", json_integer(p->host_offload[pol]));
        json_object_set_new(m, "host_per_node", json_integer(p->host_node[pol]));
        json_object_set_new(m, "host_fits", json_boolean(plan_host_fits(p, (ActPolicy)pol)));
        json_object_set_new(m, "fits", json_boolean(plan_fits(p, (ActPolicy)pol)));
        json_object_set_new(mem, act_policy_names[pol], m);
    }
    json_object_set_new(mem, "capacity", json_integer(p->capacity));
    json_object_set_new(mem, "host_capacity", json_integer(p->host_capacity));
    json_object_set_new(mem, "host_capacity_from", json_string(p->host_source));
    json_object_set_new(mem, "offload", json_string(offload_names[cfg->checkpoint.offload]));
    json_object_set_new(mem, "chunk_rows", json_integer(p->acts.chunk_rows));
    json_object_set_new(mem, "policy", json_string(act_policy_names[cfg->checkpoint.activations]));
    json_object_set_new(mem, "keep_layers", json_integer(p->acts.keep_layers));
    json_object_set_new(mem, "keep_layers_auto", json_boolean(cfg->checkpoint.keep_layers == CONFIG_AUTO));
    json_object_set_new(mem, "input_rows", json_string(p->acts.inputs_whole ? "whole" : "chunk"));
    json_object_set_new(mem, "input_rows_auto", json_boolean(cfg->checkpoint.input_rows == INPUT_ROWS_AUTO));
    json_object_set_new(mem, "mlp_act", json_string(p->acts.act_kept ? "kept" : "rewritten"));
    json_object_set_new(mem, "mlp_act_auto", json_boolean(cfg->checkpoint.mlp_act == MLP_ACT_AUTO));
    json_object_set_new(root, "memory", mem);
    json_t *fl = json_pack("{sf sf sf sf sf}", "dense", p->flops_dense, "attention_causal", p->flops_attn_causal,
                           "attention_noncausal", p->flops_attn_full, "gdn", p->flops_gdn, "model", p->flops_model);
    json_object_set_new(fl, "recompute", json_real(p->flops_recompute[cfg->checkpoint.activations]));
    json_object_set_new(root, "flops_per_token", fl);
    json_t *comm = json_object();
    for (int k = 0; k < PLAN_COMM_COUNT; k++)
        json_object_set_new(comm, plan_comm_names[k], json_real(p->comm[cfg->checkpoint.activations][k]));
    json_object_set_new(root, "comm_bytes_per_step", comm);
    json_object_set_new(root, "fits", json_boolean(plan_fits(p, (ActPolicy)cfg->checkpoint.activations)));
    int64_t need[SHARD_COUNT];
    int fit = plan_shard_fit(cfg, (ActPolicy)cfg->checkpoint.activations, need);
    json_t *sh = json_pack("{ss sI}", "stage", shard_names[p->shard], "padding", (json_int_t)p->shard_pad);
    json_t *tot = json_object();
    for (int st = 0; st < SHARD_COUNT; st++)
        if (need[st] >= 0) json_object_set_new(tot, shard_names[st], json_integer(need[st]));
    json_object_set_new(sh, "total", tot);
    json_object_set_new(sh, "weight_gather_bytes_per_step", json_real(p->weight_gather));
    json_object_set_new(sh, "first_that_fits", fit >= 0 ? json_string(shard_names[fit]) : json_null());
    json_object_set_new(root, "shard", sh);
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    fprintf(f, "%s\n", s);
    free(s);
    json_decref(root);
}
