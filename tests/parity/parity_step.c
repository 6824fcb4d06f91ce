/*
 * parity_step.c — the C side of the whole-model parity tests (build/parity_step).
 *
 *   [mpirun -np N] build/parity_step CASE_DIR [--policy none|full|remat] [--set key=value]...
 *                                    [--out FILE] [--emulate-bf16] [--steps N] [--threads N]
 *                                    [--hf HF_DIR] [--gdn-cp chain|hybrid|scan] [--draw SEED]
 *
 * Reads CASE_DIR/config.yaml, weights.safetensors and batch.safetensors (the
 * files tests/parity/README.md defines, written by make_case.py), runs one
 * forward + backward of the whole batch through the real model code
 * (lib/model*.c, lib/cp*.c on the cpu backend) with zeroed gradients, scale
 * 1 / (tokens with a target in the whole batch), no clipping and no
 * optimizer step, and writes (rank 0) FILE (default CASE_DIR/grads.safetensors):
 * "loss" (F64 scalar) and every parameter's gradient (F32, internal names),
 * summed over the world exactly as training does. compare.py checks it
 * against the float64 PyTorch reference, and the CP tests compare layouts.
 *
 * The layout is the config's parallel section after --set: launched with
 * dp x cp ranks, data-parallel rank d takes samples [d·mb, (d+1)·mb) of the
 * batch (mb = data.micro_batch, so the batch must hold dp x mb samples) and
 * CP rank r reads its zigzag fragments of each (cp_read_sample). Without
 * mpirun it runs as one process (cp = dp = 1 unless --set says otherwise).
 * --policy overrides checkpoint.activations.
 *
 * Started without a launcher (no mpirun/srun environment) it runs as one
 * process without MPI at all, so it also runs where no MPI runtime is
 * installed (GPU machines).
 *
 * The cuda backend (--set device.kind=cuda; one process on GPU 0, or under
 * mpirun one rank per GPU with NCCL, the trainer's comm_cuda_init): weights,
 * batch and gradients go through host buffers. --emulate-bf16 runs the cpu
 * kernels with every activation stored in bf16 and the GEMM/norm weights
 * rounded to bf16, as on cuda (backend_bf16emu.c): what bf16 storage alone
 * costs, measured on any machine. --steps N (N > 1, one process) then trains
 * N AdamW steps on the same batch (lr 2e-4, betas 0.9/0.95, the config's
 * weight decay and groups, clipping at 1) and writes FILE's name with
 * ".curve.jsonl" appended: {"step", "loss", "grad_norm"} per step, a loss
 * curve that needs no data set. tests/cuda/model_check.sh compares cuda,
 * emulated bf16 and cpu this way. --threads sets OpenBLAS's threads
 * (default 1; results do not depend on it). --hf HF_DIR takes the weights
 * from a Hugging Face folder (`ringscan export`, read by the import of
 * lib/io/hf.h) instead of weights.safetensors, and writes the gradients under
 * the Hugging Face names and layouts (the export's row maps): what
 * tests/parity/hf_check.py compares with transformers. --gdn-cp runs the GDN layers' state passing
 * across the CP group by that schedule instead of cp_gdn_method's (cp_gdn_set_method). --draw SEED (with
 * --emulate-bf16, SEED >= 1) rounds the emulation's bf16 stores stochastically, one independent draw
 * of the rounding per seed (bf16emu_set_draw): compare_bf16.py --draws reads a few such runs.
 *
 * It prints, on rank 0, one line with the loss and the step's work counters
 * (per layer, this rank) as JSON, which the tests parse:
 *   parity_step DIR: policy P, dp D, cp C, loss L over N tokens; attention forward calls A, block recomputes R
 *   gdn cp M                    (the GDN layers' schedule across the CP group: cp.h CpGdnMethod)
 *   counters {"attn_forwards": [...], ...}
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/runtime.h"
#include "backend_bf16emu.h"
#include "comm/comm.h"
#include "config/config.h"
#include "cp/cp.h"
#include "core/error.h"
#include "io/hf.h"
#include "model/model.h"
#include "io/safetensors.h"

#define PARITY_TRAIN_LR 2e-4f /* slow enough that 50 steps on one batch do not memorise it */

/* The whole batch, [B, T] each, read by every rank. */
typedef struct {
    int64_t  B, T;
    int32_t *tokens, *targets, *pos, *doc_pos;
} ParityBatch;

static void parity_read_i32(const SafetensorsFile *f, const char *name, int64_t B, int64_t T, int32_t *dst) {
    char err[2048];
    int64_t shape[2] = {B, T};
    if (safetensors_read(f, name, ST_DTYPE_I32, 2, shape, dst, err, sizeof err)) RS_FATAL("%s", err);
}

/* cp_read_sample's reader over the in-memory batch */
static int parity_read_span(void *ctx, int64_t g, int64_t t0, int64_t len, int32_t *tokens, int32_t *targets,
                            int32_t *pos, int32_t *doc_pos) {
    const ParityBatch *pb = ctx;
    RS_CHECK(g >= 0 && g < pb->B && t0 >= 0 && t0 + len <= pb->T, "span [%lld, +%lld) of sample %lld",
             (long long)t0, (long long)len, (long long)g);
    size_t o = (size_t)(g * pb->T + t0), n = (size_t)len * sizeof(int32_t);
    memcpy(tokens, pb->tokens + o, n);
    memcpy(targets, pb->targets + o, n);
    memcpy(pos, pb->pos + o, n);
    memcpy(doc_pos, pb->doc_pos + o, n);
    return 0;
}

static void parity_print_counters(const Model *m) {
    json_t *c = cp_counters_json(&m->cp);
    json_object_set_new(c, "activation_bytes_kept", json_integer(m->bytes_kept));
    json_object_set_new(c, "activation_bytes_device", json_integer(m->bytes_kept_device));
    json_object_set_new(c, "activation_bytes_host", json_integer(m->bytes_host));
    json_object_set_new(c, "offload_bytes_to_host", json_integer(m->count.offload_bytes_to_host));
    json_object_set_new(c, "offload_bytes_to_device", json_integer(m->count.offload_bytes_to_device));
    json_object_set_new(c, "block_recomputes", json_integer(m->count.block_recomputes));
    json_object_set_new(c, "chunk_recomputes", json_integer(m->count.chunk_recomputes));
    char *text = json_dumps(c, JSON_COMPACT);
    printf("counters %s\n", text);
    free(text);
    json_decref(c);
}

/* --steps: N AdamW steps on the batch b; step 1's gradients and loss are already there */
static void parity_train(Model *m, const Batch *b, int64_t n, double loss1, int steps, const char *path) {
    const Backend *be = m->be;
    const int64_t N = m->ptab.buffer_numel;
    FILE *f = fopen(path, "w");
    if (!f) RS_FATAL("cannot write %s", path);
    for (int s = 1; s <= steps; s++) {
        double loss = loss1;
        if (s > 1) {
            be->memset_zero(m->grads, (size_t)N * sizeof(float));
            model_forward_backward(m, b, (float)(1.0 / (double)n), 0);
            loss = model_loss_sum(m, 1) / (double)n;
        }
        const double gnorm = sqrt(be->sum_squares(m->grads, N));
        const float clip = gnorm > 1.0 ? (float)(1.0 / gnorm) : 1.0f;
        for (int i = 0; i < m->ptab.n; i++) {
            const ParamTensor *p = &m->ptab.t[i];
            const float wd = model_param_decays(m->cfg, (ParamGroup)p->group) ? (float)m->cfg->train.weight_decay : 0;
            void *compute = m->weights == (void *)m->params ? NULL : (char *)m->weights + p->offset * be->act_size;
            be->adamw_update(m->params + p->offset, m->adam_m + p->offset, m->adam_v + p->offset, compute,
                             m->grads + p->offset, p->numel, PARITY_TRAIN_LR, 0.9f, 0.95f, 1e-8f, wd, clip, s);
        }
        fprintf(f, "{\"step\": %d, \"loss\": %.9f, \"grad_norm\": %.9f}\n", s, loss, gnorm);
    }
    fclose(f);
    printf("parity_step: %s, %d AdamW steps on the batch, curve in %s\n", be->name, steps, path);
}

int main(int argc, char **argv) {
    Comm comm_storage, *comm = NULL;
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") || getenv("SLURM_PROCID")) {
        comm_init(&comm_storage, &argc, &argv);
        comm = &comm_storage;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: parity_step CASE_DIR [--policy none|full|remat] [--set key=value]... [--out FILE] "
                        "[--emulate-bf16] [--steps N] [--threads N] [--hf HF_DIR] [--gdn-cp chain|hybrid|scan] "
                        "[--draw SEED]\n");
        return RS_EXIT_USAGE;
    }
    const char *dir = argv[1], *out_path = NULL, *hf_dir = NULL;
    char path[4096], err[4096];
    int emulate = 0, steps = 1, threads = 1, gdn_cp = -1;
    unsigned long long draw = 0;

    Config cfg;
    ConfigErrors ce = {0};
    config_init_defaults(&cfg);
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    config_load_file(&cfg, path, &ce);
    /* one process unless --set asks for a layout: the case's config describes the model and batch */
    config_apply_set(&cfg, "parallel.dp=1", 0, &ce);
    config_apply_set(&cfg, "parallel.cp=1", 1, &ce);
    /* on cuda our attention kernel unless --set says otherwise: the parity is of our kernels */
    config_apply_set(&cfg, "device.attention_kernel=ringscan", 2, &ce);
    int nset = 3;
    for (int i = 2; i < argc && ce.count == 0; i += 2) {
        char set[512];
        if (!strcmp(argv[i], "--emulate-bf16")) {
            emulate = 1;
            i--;
            continue;
        }
        if (i + 1 >= argc) RS_USAGE("parity_step CASE_DIR [options]", "%s needs a value", argv[i]);
        if (!strcmp(argv[i], "--steps") || !strcmp(argv[i], "--threads")) {
            int v = atoi(argv[i + 1]);
            if (v < 1) RS_USAGE("parity_step CASE_DIR [options]", "%s %s: need a count >= 1", argv[i], argv[i + 1]);
            *(!strcmp(argv[i], "--steps") ? &steps : &threads) = v;
            continue;
        }
        if (!strcmp(argv[i], "--draw")) {
            char *end = NULL;
            draw = strtoull(argv[i + 1], &end, 10);
            if (end == argv[i + 1] || *end || draw < 1 || argv[i + 1][0] == '-')
                RS_USAGE("parity_step CASE_DIR [options]", "--draw %s: need a seed >= 1", argv[i + 1]);
            continue;
        }
        if (!strcmp(argv[i], "--gdn-cp")) {
            gdn_cp = config_enum_index(cp_gdn_method_names, argv[i + 1]);
            if (gdn_cp <= CP_GDN_LOCAL) RS_USAGE("parity_step CASE_DIR [options]", "--gdn-cp %s: chain, hybrid or scan",
                                                 argv[i + 1]);
            continue;
        }
        if (!strcmp(argv[i], "--policy")) snprintf(set, sizeof set, "checkpoint.activations=%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--set")) snprintf(set, sizeof set, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--out") || !strcmp(argv[i], "--hf")) {
            *(!strcmp(argv[i], "--out") ? &out_path : &hf_dir) = argv[i + 1];
            continue;
        } else RS_USAGE("parity_step [--policy P] [--set k=v]... [--out FILE]", "unknown argument %s", argv[i]);
        config_apply_set(&cfg, set, nset++, &ce);
    }
    if (ce.count == 0) config_validate(&cfg, &ce);
    if (ce.count == 0) config_validate_world(&cfg, comm ? comm->world_size : 1, "mpirun", &ce);
    if (ce.count) RS_USAGE(NULL, "%s", ce.text);
    const int cuda = cfg.device.kind == DEVICE_KIND_CUDA;
    if (cuda && emulate) RS_USAGE(NULL, "device.kind = cuda runs without --emulate-bf16");
    if (draw && !emulate) RS_USAGE(NULL, "--draw rounds the bf16 emulation stochastically: add --emulate-bf16");
    if (model_shard_stage(&cfg) != SHARD_NONE) /* it reads Model.grads and .weights whole (ringscan train shards) */
        RS_USAGE(NULL, "parallel.shard = %s: parity_step compares whole gradients; run it with parallel.shard=none",
                 shard_names[cfg.parallel.shard]);
    cfg.device.threads = threads;
    char why[4096];
    const Backend *be = runtime_open(&cfg, comm, why, sizeof why); /* groups, GPU + NCCL, backend, threads */
    if (!be) RS_USAGE(NULL, "%s", why);
    if (emulate) be = &backend_cpu_bf16;
    bf16emu_set_draw(draw);
    if (steps > 1 && comm && comm->world_size > 1) RS_USAGE(NULL, "--steps runs one process");

    SafetensorsFile wf, bf;
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    if (!hf_dir && safetensors_open(&wf, path, err, sizeof err)) RS_FATAL("%s", err);
    snprintf(path, sizeof path, "%s/batch.safetensors", dir);
    if (safetensors_open(&bf, path, err, sizeof err)) RS_FATAL("%s", err);
    ParityBatch pb = {.T = cfg.data.seq_len};
    int i_tok = -1;
    for (int i = 0; i < bf.n; i++)
        if (!strcmp(bf.tensors[i].name, "tokens")) i_tok = i;
    RS_CHECK(i_tok >= 0 && bf.tensors[i_tok].ndim == 2, "%s has no [B, T] tensor 'tokens'", path);
    pb.B = bf.tensors[i_tok].shape[0];
    const int64_t mb = cfg.data.micro_batch, all = pb.B * pb.T;
    RS_CHECK(pb.B == cfg.parallel.dp * mb, "the batch holds %lld samples; dp %lld x data.micro_batch %lld = %lld",
             (long long)pb.B, (long long)cfg.parallel.dp, (long long)mb, (long long)(cfg.parallel.dp * mb));
    pb.tokens = RS_MALLOC((size_t)all * 4);
    pb.targets = RS_MALLOC((size_t)all * 4);
    pb.pos = RS_MALLOC((size_t)all * 4);
    pb.doc_pos = RS_MALLOC((size_t)all * 4);
    parity_read_i32(&bf, "tokens", pb.B, pb.T, pb.tokens);
    parity_read_i32(&bf, "targets", pb.B, pb.T, pb.targets);
    parity_read_i32(&bf, "pos", pb.B, pb.T, pb.pos);
    parity_read_i32(&bf, "doc_pos", pb.B, pb.T, pb.doc_pos);
    int64_t n = 0; /* the whole batch's predicted tokens: every rank counts the same */
    for (int64_t i = 0; i < all; i++) n += pb.targets[i] >= 0;
    RS_CHECK(n > 0, "no token with a target in %s", dir);

    Model m;
    const int64_t Tl = pb.T / cfg.parallel.cp, rows = mb * Tl;
    model_init(&m, &cfg, be, comm, rows);
    if (gdn_cp >= 0) {
        if (cfg.parallel.cp == 1) RS_USAGE(NULL, "--gdn-cp needs parallel.cp > 1");
        cp_gdn_set_method(&m.cp, (CpGdnMethod)gdn_cp);
    }
    const size_t pbytes = (size_t)m.ptab.buffer_numel * sizeof(float);
    float *host = RS_CALLOC(1, pbytes); /* the weights, then the gradients (the backend's memory may be a GPU's) */
    HfKind hf_kind = {0};
    if (hf_dir) { /* the folder's format names the gradients written back */
        Config fc;
        config_init_defaults(&fc);
        if (hf_read_config(&fc, &hf_kind, hf_dir, err, sizeof err)) RS_USAGE(NULL, "%s", err);
        config_free(&fc);
    }
    if (hf_dir && hf_import(host, &m.ptab, &cfg, hf_dir, "--hf", NULL, 0, err, sizeof err)) RS_USAGE(NULL, "%s", err);
    for (int i = 0; !hf_dir && i < m.ptab.n; i++) {
        const ParamTensor *p = &m.ptab.t[i];
        int64_t shape[2] = {p->shape[0], p->shape[1]};
        if (safetensors_read(&wf, p->name, ST_DTYPE_F32, p->ndim, shape, host + p->offset, err, sizeof err))
            RS_FATAL("%s", err);
    }
    be->to_device(m.params, host, pbytes);
    if (m.weights != (void *)m.params) be->act_from_f32(m.weights, m.params, m.ptab.buffer_numel);
    if (emulate) { /* the compute copy in bf16 as on cuda; A_log and dt_bias stay fp32 (kernels read the master) */
        float *wb = be->alloc(pbytes);
        for (int64_t i = 0; i < m.ptab.buffer_numel; i++) wb[i] = bf16emu_round(m.params[i]);
        m.weights = wb;
        m.w_cur = wb; /* where the layers read their weights (model.h); without it they would read the fp32 master */
    }
    int32_t *meta = RS_MALLOC((size_t)rows * 16), *meta_dev = NULL; /* tokens | targets | pos | doc_pos */
    Batch b = {rows, (int32_t)mb, Tl, meta, meta + rows, meta + 2 * rows, meta + 3 * rows, meta + 2 * rows,
               meta + 3 * rows, 0};
    for (int64_t j = 0; j < mb; j++) {
        int64_t o = j * Tl;
        cp_read_sample(&m.cp.L, parity_read_span, &pb, (comm ? comm->dp_rank : 0) * mb + j, b.tokens + o,
                       b.targets + o, b.pos + o, b.doc_pos + o);
    }
    if (cuda) { /* the kernels read the metadata in device memory (backend.h) */
        meta_dev = be->alloc((size_t)rows * 16);
        be->to_device(meta_dev, meta, (size_t)rows * 16);
        b = (Batch){rows, (int32_t)mb, Tl, meta_dev, meta_dev + rows, meta_dev + 2 * rows, meta_dev + 3 * rows,
                    meta + 2 * rows, meta + 3 * rows, 0};
    }

    be->memset_zero(m.grads, pbytes);
    model_forward_backward(&m, &b, (float)(1.0 / (double)n), 1);
    double loss_local = model_loss_sum(&m, 1);
    double loss = (comm ? comm_allreduce_sum_scalar(comm, comm->world, loss_local) : loss_local) / (double)n;
    be->to_host(host, m.grads, pbytes);
    int64_t attn_calls = 0;
    for (int l = 0; l < m.cp.layers; l++) attn_calls += m.cp.count.attn_kernel_calls[l];
    if (!comm || comm->rank == 0) {
        printf("parity_step %s: %s, policy %s, dp %lld, cp %lld, loss %.9f over %lld tokens; attention forward calls "
               "%lld, block recomputes %lld\ngdn cp %s\n",
               dir, be->name, act_policy_names[cfg.checkpoint.activations], (long long)cfg.parallel.dp,
               (long long)cfg.parallel.cp, loss, (long long)n, (long long)attn_calls,
               (long long)m.count.block_recomputes, cp_gdn_method_names[m.cp.gdn_method]);
        parity_print_counters(&m);
        HfLayout lay = {0};
        if (hf_dir) hf_layout_build(&lay, &cfg, &m.ptab, hf_kind.format);
        const int n_out = hf_dir ? lay.n : m.ptab.n;
        StTensor *out = RS_CALLOC((size_t)n_out + 1, sizeof *out);
        float *hf_grads = hf_dir ? RS_MALLOC((size_t)m.ptab.count * sizeof(float)) : NULL, *at = hf_grads;
        out[0] = (StTensor){.name = "loss", .dtype = ST_DTYPE_F64, .ndim = 0, .data = &loss};
        for (int i = 0; i < n_out; i++) {
            if (hf_dir) { /* the gradient of an HF tensor is the HF-layout image of the internal gradient */
                const HfMap *hm = &lay.t[i];
                hf_layout_gather(at, &lay, hm, host, &m.ptab);
                out[i + 1] = (StTensor){.name = hm->hf.name, .dtype = ST_DTYPE_F32, .ndim = hm->hf.ndim, .data = at};
                for (int d = 0; d < hm->hf.ndim; d++) out[i + 1].shape[d] = hm->hf.shape[d];
                at += hm->hf.numel;
                continue;
            }
            const ParamTensor *p = &m.ptab.t[i];
            out[i + 1] =
                (StTensor){.name = p->name, .dtype = ST_DTYPE_F32, .ndim = p->ndim, .data = host + p->offset};
            out[i + 1].shape[0] = p->shape[0];
            out[i + 1].shape[1] = p->shape[1];
        }
        if (!out_path) snprintf(path, sizeof path, "%s/grads.safetensors", dir);
        else snprintf(path, sizeof path, "%s", out_path);
        if (safetensors_write_file(path, out, n_out + 1, NULL, NULL, err, sizeof err)) RS_FATAL("%s", err);
        free(out);
        free(hf_grads);
        if (hf_dir) hf_layout_free(&lay);
        if (steps > 1) {
            char curve[4096 + 16];
            snprintf(curve, sizeof curve, "%s.curve.jsonl", path);
            parity_train(&m, &b, n, loss, steps, curve);
        }
    }
    free(host);
    free(meta);
    if (meta_dev) be->free(meta_dev);
    free(pb.tokens);
    free(pb.targets);
    free(pb.pos);
    free(pb.doc_pos);
    if (!hf_dir) safetensors_close(&wf);
    safetensors_close(&bf);
    model_free(&m);
    config_free(&cfg);
    if (comm) comm_finalize(comm);
    return 0;
}
