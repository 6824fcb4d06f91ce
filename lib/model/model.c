/*
 * model.c — allocation, initialisation and the micro-batch step of the model
 * (see model.h). The per-block math is in model_block.c.
 *
 * Allocation follows the size tables exactly:
 *   - parameters, gradients, AdamW m and v: one flat fp32 buffer each, laid
 *     out by the parameter table (aligned tensor offsets);
 *   - activations kept by the checkpoint policy: one arena, carved in table
 *     order, each layer its own buffers;
 *   - activations not kept: one scratch arena shared by all layers; each
 *     layer carves its own from the start, so its size is the largest
 *     layer's total (model_acts.c's `recompute` term, aligned);
 *   - checkpoint.keep_layers: a kept layer's buffers are kept like none's
 *     (the table's keep bits say so), the rest as the policy says;
 *   - checkpoint.input_rows whole: the input side's buffers of a layer that
 *     recomputes have every row, in the scratch arena like the others;
 *   - gradient scratch: persistent buffers plus one arena shared by the MLP,
 *     GDN and attention backward phases (model_acts.c's `grad_working`).
 *
 * Initialisation (docs/design/model.md): matrices, conv weights,
 * embeddings and the head ~ N(0, initializer_range); zero-centred RMSNorm
 * weights 0; the GDN gated-norm weight and dt_bias 1; A_log = log U(0, 16).
 * Every tensor draws from its own stream (run.seed, tensor index), so the
 * weights do not depend on the number of ranks; the host's threads fill
 * pieces of it, each skipped ahead to its first element (the same values).
 */
#include "model.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/rng.h"
#include "plan/plan.h"

static int64_t model_align(int64_t n) { return (n + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN; }

static int64_t model_offset_of(const Model *m, int layer, const char *name, int required) {
    char full[PARAM_NAME_MAX];
    if (layer >= 0) snprintf(full, sizeof full, "model.layers.%d.%s", layer, name);
    else snprintf(full, sizeof full, "%s", name);
    int i = model_params_find(&m->ptab, full);
    if (i < 0) {
        RS_CHECK(!required, "parameter %s missing from the table", full);
        return -1;
    }
    return m->ptab.t[i].offset;
}

int model_param_decays(const Config *cfg, ParamGroup g) {
    switch (g) {
    case PARAM_GROUP_MATRIX: return 1;
    case PARAM_GROUP_EMBEDDING: return cfg->train.decay_embeddings;
    case PARAM_GROUP_NORM: return cfg->train.decay_norms;
    case PARAM_GROUP_GDN_GATE: return cfg->train.decay_gdn_gates;
    case PARAM_GROUP_CONV: return cfg->train.decay_conv;
    case PARAM_GROUP_NORM_SCALE: return cfg->train.decay_norm_scales;
    default: return 1;
    }
}

/* The initial values of elements [j0, j1) of tensor i (its own stream, skipped to element j0: every element
 * takes a fixed number of draws, so any cut of the work gives the same values). */
static void model_init_span(const Config *cfg, const ParamTensor *p, int i, float *w, int64_t j0, int64_t j1) {
    Rng r;
    rng_init(&r, (uint64_t)cfg->run.seed, (uint64_t)i);
    rng_skip(&r, (uint64_t)j0 * (p->init == PARAM_INIT_NORMAL ? 2 : p->init == PARAM_INIT_A_LOG ? 1 : 0));
    for (int64_t j = j0; j < j1; j++) {
        switch (p->init) {
        case PARAM_INIT_NORMAL: w[j] = (float)(cfg->model.initializer_range * rng_normal(&r)); break;
        case PARAM_INIT_ZEROS: w[j] = 0.0f; break;
        case PARAM_INIT_ONES: w[j] = 1.0f; break;
        case PARAM_INIT_A_LOG: w[j] = (float)log(16.0 * rng_uniform(&r)); break;
        }
    }
}

/* The host threads that fill the buffer: pieces of INIT_SPAN elements of one tensor, taken in turn. */
enum { INIT_SPAN = 1 << 22, INIT_THREADS_MAX = 32 };
typedef struct {
    const Model *m;
    float       *host;    /* (buffer_numel) */
    int32_t     *tensor;  /* (pieces) the tensor of each piece */
    int64_t     *first;   /* (pieces) its first element */
    int64_t      pieces;
    int64_t      next;    /* the next piece to take (atomic) */
} InitWork;

static void *model_init_worker(void *arg) {
    InitWork *w = arg;
    for (int64_t k; (k = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED)) < w->pieces;) {
        const ParamTensor *p = &w->m->ptab.t[w->tensor[k]];
        const int64_t j0 = w->first[k], j1 = j0 + INIT_SPAN < p->numel ? j0 + INIT_SPAN : p->numel;
        model_init_span(w->m->cfg, p, w->tensor[k], w->host + p->offset, j0, j1);
    }
    return NULL;
}

static void model_init_weights(Model *m) {
    const ParamTable *t = &m->ptab;
    InitWork w = {.m = m, .host = RS_CALLOC((size_t)t->buffer_numel, sizeof(float))};
    for (int i = 0; i < t->n; i++) w.pieces += (t->t[i].numel + INIT_SPAN - 1) / INIT_SPAN;
    w.tensor = RS_MALLOC((size_t)w.pieces * sizeof *w.tensor);
    w.first = RS_MALLOC((size_t)w.pieces * sizeof *w.first);
    for (int i = 0, k = 0; i < t->n; i++)
        for (int64_t j = 0; j < t->t[i].numel; j += INIT_SPAN, k++) {
            w.tensor[k] = i;
            w.first[k] = j;
        }
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const int nt = cpus < 1 ? 1 : cpus > INIT_THREADS_MAX ? INIT_THREADS_MAX : (int)cpus;
    pthread_t th[INIT_THREADS_MAX];
    int started = 0;
    while (started < nt - 1 && !pthread_create(&th[started], NULL, model_init_worker, &w)) started++;
    model_init_worker(&w); /* this thread too (alone if none could start: the same values) */
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    model_set_full(m, 0, w.host);
    free(w.host);
    free(w.tensor);
    free(w.first);
}

/* Points the LayerActs field called `name` at `p`. */
static void model_bind(LayerActs *a, const char *name, void *p) {
    static const struct { const char *name; size_t off; } fields[] = {
#define F(n) {#n, offsetof(LayerActs, n)}
        F(x), F(ln1), F(rstd1), F(h), F(ln2), F(rstd2), F(gate_up), F(act),
        F(gdn_proj), F(gdn_conv), F(gdn_halo), F(gdn_normed), F(gdn_norm_rstd), F(gdn_qk_norm), F(gdn_qk_rstd),
        F(gdn_v), F(gdn_z), F(gdn_beta), F(gdn_g), F(gdn_core), F(gdn_cp_states), F(gdn_cp_M), F(gdn_conv_halo),
        F(gdn_kept), F(kda_f), F(kda_unit), F(attn_proj), F(attn_gated), F(attn_q), F(attn_kv), F(attn_gate), F(attn_qk_rstd), F(attn_out),
        F(attn_lse),
#undef F
    };
    char key[48];
    snprintf(key, sizeof key, "%s", name);
    /* the table says "mlp_gate_up"/"mlp_act"; the struct drops the prefix */
    if (!strncmp(key, "mlp_", 4)) memmove(key, key + 4, strlen(key + 4) + 1);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!strcmp(fields[i].name, key)) {
            *(void **)((char *)a + fields[i].off) = p;
            return;
        }
    RS_FATAL("activation buffer '%s' of model_acts.c has no field in LayerActs", name);
}

/* Points the Model gradient-scratch field called `name` at `p`. */
static void model_bind_grad(Model *m, const char *name, void *p) {
    static const struct { const char *name; size_t off; } fields[] = {
#define F(n) {#n, offsetof(Model, n)}
        F(d_resid), F(d_core), F(d_z), F(d_qk), F(d_v), F(d_beta), F(d_g), F(d_attn_out), F(d_gate), F(d_q),
        F(d_kv), F(d_ln), F(d_act), F(d_gate_up), F(d_mix), F(d_proj), F(d_conv), F(d_halo), F(d_kda_f),
        F(d_kda_unit),
#undef F
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!strcmp(fields[i].name, name)) {
            *(void **)((char *)m + fields[i].off) = p;
            return;
        }
    RS_FATAL("unknown gradient buffer '%s' in model_acts.c", name);
}

static void model_alloc_activations(Model *m) {
    const Config *cfg = m->cfg;
    const Backend *be = m->be;
    int pol = cfg->checkpoint.activations;
    int L = (int)cfg->model.num_hidden_layers;
    const int offload = cfg->checkpoint.offload == OFFLOAD_HOST;
    ActTable *t = &m->acts;
    m->la = RS_CALLOC((size_t)L, sizeof *m->la);
    m->kept_at = RS_CALLOC((size_t)L, sizeof *m->kept_at);
    m->kept_len = RS_CALLOC((size_t)L, sizeof *m->kept_len);

    /* sizes: kept buffers per layer (and the head), scratch per kind */
    int64_t kept = 0;
    for (int i = 0; i < t->n; i++) {
        const ActBuffer *b = &t->b[i];
        if (b->keep & (1u << pol)) {
            kept += model_align(b->bytes);
            if (b->layer >= 0) m->kept_len[b->layer] += model_align(b->bytes);
        }
    }
    /* scratch: every layer carves its unkept buffers from the arena's start, so its size is the largest
     * layer's (per kind the same but where checkpoint.keep_layers keeps a layer's per-token buffers) */
    int64_t scratch = 0;
    for (int l = 0; l < L; l++) {
        int64_t s = 0;
        for (int i = 0; i < t->n; i++)
            if (t->b[i].layer == l && !(t->b[i].keep & (1u << pol))) s += model_align(t->b[i].bytes);
        if (s > scratch) scratch = s;
    }
    /* checkpoint.offload host: the head plus two layer slots on the device (layer l in slot l % 2),
     * every layer's kept bytes in host memory (model_offload.c moves them) */
    int64_t slot = t->layer_kept_max[pol], device_kept = offload ? t->offload_device[pol] : kept;
    RS_CHECK(!offload || device_kept == t->head_kept[pol] + 2 * slot, "offload: the head and two slots");
    m->act_arena = be->alloc((size_t)device_kept);
    m->scratch = scratch ? be->alloc((size_t)scratch) : NULL;
    m->bytes_kept = kept;
    m->bytes_kept_device = device_kept;
    m->bytes_scratch = scratch;

    char *kp = m->act_arena, *slots = (char *)m->act_arena + t->head_kept[pol];
    int64_t host_at = 0;
    for (int l = -1; l < L; l++) {
        char *sp = m->scratch; /* every layer of a kind carves the same offsets */
        if (l >= 0) {
            m->kept_at[l] = host_at;
            if (l < L - 2) host_at += m->kept_len[l]; /* the last two layers never leave the device */
            if (offload) kp = slots + (l % 2) * slot;
        }
        char *layer_kept = kp;
        for (int i = 0; i < t->n; i++) {
            const ActBuffer *b = &t->b[i];
            if (b->layer != l) continue;
            void *p;
            if (b->keep & (1u << pol)) {
                p = kp;
                kp += model_align(b->bytes);
            } else {
                p = sp;
                sp += model_align(b->bytes);
            }
            if (l >= 0) {
                if (!strcmp(b->name, "gdn_kept")) { /* the backend's format; model_acts.c counts it per fragment */
                    const ModelConfig *mc = &cfg->model;
                    const int64_t frags = cfg->data.micro_batch * (cfg->parallel.cp > 1 ? 2 : 1);
                    const int64_t n = cfg->data.micro_batch * cfg->data.seq_len / cfg->parallel.cp / frags;
                    const int kind = model_acts_gdn_kept_kind(&m->acts, cfg, l); /* the kind block_gdn_core gives */
                    size_t (*kept_bytes)(int64_t, int, int, int, int) =
                        mc->linear_attention == LINEAR_ATTN_KDA ? be->kda_kept_bytes : be->gdn_kept_bytes;
                    RS_CHECK(kept_bytes, "model.linear_attention %s: the %s backend has no kernels for it",
                             mc->linear_attention == LINEAR_ATTN_KDA ? "kda" : "gdn", be->name);
                    const int64_t need = frags * (int64_t)kept_bytes(n, (int)mc->linear_num_value_heads,
                                                                     (int)mc->linear_key_head_dim,
                                                                     (int)mc->linear_value_head_dim, kind);
                    RS_CHECK(b->rows == frags && need <= b->bytes,
                             "gdn_kept: the %s backend needs %lld bytes, model_acts.c counts %lld", be->name,
                             (long long)need, (long long)b->bytes);
                }
                model_bind(&m->la[l], b->name, p);
            } else if (!strcmp(b->name, "final_in")) m->final_in = p;
            else if (!strcmp(b->name, "final_norm")) m->final_norm = p;
            else if (!strcmp(b->name, "final_rstd")) m->final_rstd = p;
            else if (!strcmp(b->name, "d_final")) m->d_final = p;
            else if (!strcmp(b->name, "tokens_targets")) { /* the batch's metadata lives with the caller */ }
            else RS_FATAL("unknown head buffer '%s' in model_acts.c", b->name);
        }
        if (l >= 0) {
            RS_CHECK(kp - layer_kept == m->kept_len[l], "layer %d kept carving", l);
            m->la[l].kept = layer_kept;
        }
    }
    RS_CHECK(offload || kp - (char *)m->act_arena == kept, "activation carving: %lld of %lld bytes",
             (long long)(kp - (char *)m->act_arena), (long long)kept);
    RS_CHECK(host_at == t->offload_host[pol], "offload: %lld host bytes, model_acts.c counts %lld", (long long)host_at,
             (long long)t->offload_host[pol]);
    m->bytes_host = offload ? host_at : 0;
    m->host_arena = offload && host_at ? be->host_alloc((size_t)host_at) : NULL;

    /* gradient scratch: persistent buffers (the residual stream's, the chunk's), then the mixers'
     * whole-rows phases over one arena */
    int64_t persistent = 0, phase_max = 0, phase[ACT_GRAD_PHASES] = {0};
    for (int i = 0; i < t->ng; i++) {
        if (t->g[i].phase == ACT_GRAD_PERSISTENT) persistent += model_align(t->g[i].bytes);
        else phase[t->g[i].phase] += model_align(t->g[i].bytes);
    }
    for (int ph = ACT_GRAD_PERSISTENT + 1; ph < ACT_GRAD_PHASES; ph++)
        if (phase[ph] > phase_max) phase_max = phase[ph];
    char *g = be->alloc((size_t)(persistent + phase_max));
    m->bytes_grads = persistent + phase_max;
    char *cursor[ACT_GRAD_PHASES];
    cursor[ACT_GRAD_PERSISTENT] = g;
    for (int ph = ACT_GRAD_PERSISTENT + 1; ph < ACT_GRAD_PHASES; ph++) cursor[ph] = g + persistent;
    for (int i = 0; i < t->ng; i++) {
        const ActGradBuffer *b = &t->g[i];
        model_bind_grad(m, b->name, cursor[b->phase]);
        cursor[b->phase] += model_align(b->bytes);
    }
    RS_CHECK(m->d_resid == (void *)g, "d_resid must open the gradient arena (model_free frees it)");

    m->loss_workspace = be->alloc((size_t)(t->loss_chunk_rows * cfg->model.vocab_size) * sizeof(float));
    m->losses = be->alloc((size_t)(cfg->train.grad_accum * t->tokens) * sizeof(float));
}

void model_init(Model *m, const Config *cfg, const Backend *be, Comm *comm, int64_t T) {
    memset(m, 0, sizeof *m);
    m->cfg = cfg;
    m->be = be;
    m->comm = comm;
    RS_CHECK(comm || (cfg->parallel.dp == 1 && cfg->parallel.cp == 1), "dp %lld x cp %lld needs MPI ranks",
             (long long)cfg->parallel.dp, (long long)cfg->parallel.cp);
    model_params_build(&m->ptab, cfg);
    int L = (int)cfg->model.num_hidden_layers;
    m->lp = RS_CALLOC((size_t)L, sizeof *m->lp);
    for (int l = 0; l < L; l++) {
        LayerParams *p = &m->lp[l];
        p->kind = config_layer_kind(cfg, l);
        p->in_ln = model_offset_of(m, l, "input_layernorm", 1);
        p->post_ln = model_offset_of(m, l, "post_attention_layernorm", 1);
        p->gate_up = model_offset_of(m, l, "mlp.gate_up", 1);
        p->down = model_offset_of(m, l, "mlp.down_proj", 1);
        int gdn = p->kind == LAYER_KIND_LINEAR;
        p->kda = gdn && cfg->model.linear_attention == LINEAR_ATTN_KDA;
        p->in_proj = model_offset_of(m, l, gdn ? "linear_attn.in_proj" : "self_attn.in_proj", 1);
        p->out_proj = model_offset_of(m, l, p->kda ? "linear_attn.o_proj" : gdn ? "linear_attn.out_proj" : "self_attn.o_proj", 1);
        p->conv = model_offset_of(m, l, "linear_attn.conv1d", gdn);
        p->dt_bias = model_offset_of(m, l, "linear_attn.dt_bias", gdn);
        p->A_log = model_offset_of(m, l, "linear_attn.A_log", gdn);
        p->gdn_norm = model_offset_of(m, l, p->kda ? "linear_attn.o_norm" : "linear_attn.norm", gdn);
        p->f_b = model_offset_of(m, l, "linear_attn.f_b_proj", p->kda);
        p->g_b = model_offset_of(m, l, "linear_attn.g_b_proj", p->kda);
        p->dt_bias_n = p->kda ? cfg->model.linear_num_value_heads * cfg->model.linear_key_head_dim
                              : cfg->model.linear_num_value_heads;
        p->q_norm = model_offset_of(m, l, "self_attn.q_norm", !gdn);
        p->k_norm = model_offset_of(m, l, "self_attn.k_norm", !gdn);
    }
    m->embed = model_offset_of(m, -1, "model.embed_tokens", 1);
    m->final_norm_w = model_offset_of(m, -1, "model.norm", 1);
    m->lm_head = cfg->model.tie_word_embeddings ? m->embed : model_offset_of(m, -1, "lm_head", 1);

    /* parallel.shard (model_shard.c): the master weights and moments are this rank's pieces only */
    const int64_t N = m->ptab.buffer_numel;
    m->shard = model_shard_stage(cfg);
    m->shard_rank = m->shard != SHARD_NONE ? comm->rank : 0;
    m->shard_numel = N / m->ptab.pieces;
    size_t sbytes = (size_t)m->shard_numel * sizeof(float);
    m->params = be->alloc(sbytes);
    if (m->shard >= SHARD_GRADIENTS) { /* model_shard.c: the head's buckets, two layer slots, the summed pieces */
        const int nb = m->ptab.n_buckets;
        const int64_t *bs = m->ptab.bucket_start;
        for (int b = 1; b < nb - 1; b++)
            if (bs[b + 1] - bs[b] > m->grad_slot_numel) m->grad_slot_numel = bs[b + 1] - bs[b];
        m->grad_head[0] = be->alloc((size_t)(bs[1] - bs[0]) * sizeof(float));
        m->grad_head[1] = be->alloc((size_t)(bs[nb] - bs[nb - 1]) * sizeof(float));
        for (int k = 0; k < 2; k++) m->grad_slot[k] = be->alloc((size_t)m->grad_slot_numel * sizeof(float));
        m->grad_shard = be->alloc(sbytes);
    } else
        m->grads = be->alloc((size_t)N * sizeof(float));
    m->slot_layer[0] = m->slot_layer[1] = -1;
    m->adam_m = be->alloc(sbytes);
    m->adam_v = be->alloc(sbytes);
    if (m->shard == SHARD_WEIGHTS) { /* model_shard.c: the head's buckets whole, the layers' pieces, two slots */
        const int nb = m->ptab.n_buckets;
        const int64_t *bs = m->ptab.bucket_start;
        const size_t es = (size_t)be->act_size;
        m->w_slot_numel = m->grad_slot_numel;
        m->w_head[0] = be->alloc((size_t)(bs[1] - bs[0]) * es);
        m->w_head[1] = be->alloc((size_t)(bs[nb] - bs[nb - 1]) * es);
        for (int k = 0; k < 2; k++) m->w_slot[k] = be->alloc((size_t)m->w_slot_numel * es);
        m->w_shard = be->alloc((size_t)m->shard_numel * es);
        m->weights = NULL;
    } else
        m->weights = be->act_size == (int)sizeof(float) && m->shard == SHARD_NONE
                         ? (void *)m->params
                         : be->alloc((size_t)N * (size_t)be->act_size);
    m->w_cur = m->weights;
    m->w_cur_start = 0;
    m->w_slot_layer[0] = m->w_slot_layer[1] = -1;
    /* the fp32 gates the GDN kernels read: the master weights, or (sharded) the fp32 compute copy on cpu
     * and a compact copy of every GDN layer's A_log and dt_bias on cuda and under shard weights */
    m->f32 = m->shard == SHARD_NONE ? m->params
             : be->act_size == (int)sizeof(float) && m->shard != SHARD_WEIGHTS ? (const float *)m->weights
                                                                                : NULL;
    for (int l = 0; l < L; l++) {
        LayerParams *p = &m->lp[l];
        p->A_log32 = p->A_log;
        p->dt_bias32 = p->dt_bias;
        if (m->f32 || p->kind != LAYER_KIND_LINEAR) continue;
        p->A_log32 = m->gates_numel;
        p->dt_bias32 = m->gates_numel + cfg->model.linear_num_value_heads;
        m->gates_numel += cfg->model.linear_num_value_heads + p->dt_bias_n;
    }
    if (!m->f32) {
        m->gates = be->alloc((size_t)(m->gates_numel > 0 ? m->gates_numel : 1) * sizeof(float));
        m->f32 = m->gates;
    }
    model_init_weights(m);

    /* keep_layers auto, chunk_rows 0 and input_rows auto: plan's figures, the one rule */
    const Config kept = plan_resolve(cfg);
    model_acts_build(&m->acts, &kept);
    RS_CHECK(m->acts.tokens == T, "micro-batch of %lld rows, but the activation table is for %lld",
             (long long)T, (long long)m->acts.tokens);
    m->T = T;
    model_alloc_activations(m);
    model_offload_init(m);
    cp_init(&m->cp, comm, be, cfg);
}

void model_free(Model *m) {
    const Backend *be = m->be;
    model_offload_free(m);
    if (m->weights && m->weights != (void *)m->params) be->free(m->weights);
    for (int k = 0; k < 2; k++) {
        if (m->w_head[k]) be->free(m->w_head[k]);
        if (m->w_slot[k]) be->free(m->w_slot[k]);
    }
    if (m->w_shard) be->free(m->w_shard);
    if (m->gates) be->free(m->gates);
    be->free(m->params);
    if (m->grads) be->free(m->grads);
    for (int k = 0; k < 2; k++) {
        if (m->grad_head[k]) be->free(m->grad_head[k]);
        if (m->grad_slot[k]) be->free(m->grad_slot[k]);
    }
    if (m->grad_shard) be->free(m->grad_shard);
    be->free(m->adam_m);
    be->free(m->adam_v);
    be->free(m->act_arena);
    if (m->scratch) be->free(m->scratch);
    be->free(m->d_resid); /* the gradient arena starts at d_resid */
    if (m->host_arena) be->host_free(m->host_arena);
    free(m->kept_at);
    free(m->kept_len);
    be->free(m->loss_workspace);
    be->free(m->losses);
    cp_free(&m->cp);
    free(m->la);
    free(m->lp);
    model_acts_free(&m->acts);
    model_params_free(&m->ptab);
    memset(m, 0, sizeof *m);
}
