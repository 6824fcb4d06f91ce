/*
 * parity_step.c — the C side of the whole-model parity test (build/parity_step).
 *
 *   build/parity_step CASE_DIR [--policy none|full|remat] [--device cpu|cuda|cpu-bf16] [--steps N]
 *                     [--threads N]
 *
 * Reads CASE_DIR/config.yaml, weights.safetensors and batch.safetensors (the
 * files tests/parity/README.md defines, written by make_case.py), runs one
 * forward + backward of the whole batch through the real model code
 * (lib/model*.c on the cpu backend) with zeroed gradients, scale
 * 1 / (tokens with a target), no clipping and no optimizer step, and writes
 * CASE_DIR/grads.safetensors: "loss" (F64 scalar) and every parameter's
 * gradient (F32, internal names). compare.py checks it against the float64
 * PyTorch reference. --policy overrides checkpoint.activations, so the three
 * policies can be checked to give the same gradients.
 *
 * --device cuda runs the same step on the cuda backend (GPU 0; bf16
 * activations, fp32 master weights and gradients): weights, batch and
 * gradients travel through host buffers, and the result goes to
 * CASE_DIR/grads_cuda.safetensors, so `compare.py grads.safetensors
 * grads_cuda.safetensors --tol ...` checks cuda against cpu on one case
 * (tests/cuda/model_check.sh runs that, and a 50-step loss curve).
 * --device cpu-bf16 runs the cpu kernels with every activation stored in bf16
 * and the GEMM/norm weights rounded to bf16, as on cuda (backend_bf16emu.c):
 * grads_bf16emu.safetensors says what bf16 storage alone costs, on any machine.
 * --steps N (N > 1) then trains N AdamW steps on the same batch (lr 2e-4,
 * betas 0.9/0.95, the config's weight decay and groups, clipping at 1) and
 * writes CASE_DIR/curve_<device>.jsonl, {"step", "loss", "grad_norm"} per
 * step: a loss curve of the model and the optimizer that needs no MPI and no
 * data set, so cpu and cuda curves can be compared on any GPU machine.
 * --threads sets OpenBLAS's threads (default 1; results do not depend on it).
 *
 * It runs as one process over the whole sample (cp = dp = 1), whatever the
 * config's parallel section says.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_bf16emu.h"
#ifdef RS_WITH_CUDA
#include "cuda_backend.h"
#endif
#include "config.h"
#include "error.h"
#include "model.h"
#include "safetensors.h"

static void parity_read_i32(const SafetensorsFile *f, const char *name, int64_t B, int64_t T, int32_t *dst) {
    char err[2048];
    int64_t shape[2] = {B, T};
    if (safetensors_read(f, name, ST_DTYPE_I32, 2, shape, dst, err, sizeof err)) RS_FATAL("%s", err);
}

#define PARITY_TRAIN_LR 2e-4f /* slow enough that 50 steps on one batch do not memorise it */

/* --steps: N AdamW steps on the batch b (the gradients of step 1 are already in m->grads) */
static void parity_train(Model *m, const Batch *b, int64_t n, double loss1, int steps, const char *dir,
                         const char *device) {
    const Backend *be = m->be;
    const int64_t N = m->ptab.buffer_numel;
    char path[4096];
    snprintf(path, sizeof path, "%s/curve_%s.jsonl", dir, device);
    FILE *f = fopen(path, "w");
    if (!f) RS_FATAL("cannot write %s", path);
    for (int s = 1; s <= steps; s++) {
        double loss = loss1;
        if (s > 1) {
            be->memset_zero(m->grads, (size_t)N * sizeof(float));
            loss = model_forward_backward(m, b, (float)(1.0 / (double)n), 0) / (double)n;
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
    printf("parity_step %s: %s, %d AdamW steps on the batch, curve in %s\n", dir, device, steps, path);
}

int main(int argc, char **argv) {
    const char *dir = argc >= 2 ? argv[1] : NULL, *policy = NULL, *device = "cpu";
    int steps = 1, threads = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--policy")) policy = argv[i + 1];
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else dir = NULL;
    }
    if (steps < 1 || threads < 1) dir = NULL;
    if (!dir || (argc % 2) || (strcmp(device, "cpu") && strcmp(device, "cuda") && strcmp(device, "cpu-bf16"))) {
        fprintf(stderr, "usage: parity_step CASE_DIR [--policy none|full|remat] [--device cpu|cuda|cpu-bf16] "
                        "[--steps N] [--threads N]\n");
        return RS_EXIT_USAGE;
    }
    const int cuda = !strcmp(device, "cuda"), emu = !strcmp(device, "cpu-bf16");
    char path[4096], err[4096];
    openblas_set_num_threads(threads);

    Config cfg;
    ConfigErrors ce = {0};
    config_init_defaults(&cfg);
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    config_load_file(&cfg, path, &ce);
    cfg.parallel.cp = cfg.parallel.dp = 1;
    if (policy) {
        char set[64];
        snprintf(set, sizeof set, "checkpoint.activations=%s", policy);
        config_apply_set(&cfg, set, 0, &ce);
    }
    config_apply_set(&cfg, cuda ? "device.kind=cuda" : "device.kind=cpu", 0, &ce);
    if (ce.count == 0) config_validate(&cfg, &ce);
    if (ce.count) RS_FATAL("%s", ce.text);
    int64_t B = cfg.data.micro_batch, T = cfg.data.seq_len, rows = B * T;

    SafetensorsFile wf, bf;
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    if (safetensors_open(&wf, path, err, sizeof err)) RS_FATAL("%s", err);
    snprintf(path, sizeof path, "%s/batch.safetensors", dir);
    if (safetensors_open(&bf, path, err, sizeof err)) RS_FATAL("%s", err);

    const Backend *be = emu ? &backend_cpu_bf16 : &backend_cpu;
    if (cuda) {
#ifdef RS_WITH_CUDA
        cuda_backend_init(0);
        be = &backend_cuda;
#else
        RS_FATAL("--device cuda: this build has no cuda backend (nvcc was not found at build time)");
#endif
    }
    Model m;
    model_init(&m, &cfg, be, NULL, rows);
    size_t pbytes = (size_t)m.ptab.buffer_numel * sizeof(float);
    float *host = RS_CALLOC(1, pbytes); /* the weights, then the gradients */
    for (int i = 0; i < m.ptab.n; i++) {
        const ParamTensor *p = &m.ptab.t[i];
        int64_t shape[2] = {p->shape[0], p->shape[1]};
        if (safetensors_read(&wf, p->name, ST_DTYPE_F32, p->ndim, shape, host + p->offset, err, sizeof err))
            RS_FATAL("%s", err);
    }
    be->to_device(m.params, host, pbytes);
    if (m.weights != (void *)m.params) be->act_from_f32(m.weights, m.params, m.ptab.buffer_numel);
    if (emu) { /* the compute copy in bf16, as cuda's; A_log and dt_bias stay fp32 (kernels read the master) */
        float *wb = be->alloc(pbytes);
        for (int64_t i = 0; i < m.ptab.buffer_numel; i++) wb[i] = bf16emu_round(m.params[i]);
        m.weights = wb;
    }
    int32_t *meta = RS_MALLOC((size_t)rows * 16); /* tokens | targets | pos | doc_pos */
    Batch b = {rows, (int32_t)B, T, meta, meta + rows, meta + 2 * rows, meta + 3 * rows};
    parity_read_i32(&bf, "tokens", B, T, b.tokens);
    parity_read_i32(&bf, "targets", B, T, b.targets);
    parity_read_i32(&bf, "pos", B, T, b.pos);
    parity_read_i32(&bf, "doc_pos", B, T, b.doc_pos);
    int64_t n = 0;
    for (int64_t i = 0; i < rows; i++) n += b.targets[i] >= 0;
    RS_CHECK(n > 0, "no token with a target in %s", dir);
    int32_t *meta_dev = NULL;
    if (cuda) { /* the kernels read the metadata in device memory (backend.h) */
        meta_dev = be->alloc((size_t)rows * 16);
        be->to_device(meta_dev, meta, (size_t)rows * 16);
        b = (Batch){rows, (int32_t)B, T, meta_dev, meta_dev + rows, meta_dev + 2 * rows, meta_dev + 3 * rows};
    }

    be->memset_zero(m.grads, pbytes);
    double loss = model_forward_backward(&m, &b, (float)(1.0 / (double)n), 0) / (double)n;
    be->to_host(host, m.grads, pbytes);
    int64_t attn_calls = 0;
    for (int l = 0; l < m.cp.layers; l++) attn_calls += m.cp.count.attn_kernel_calls[l];
    printf("parity_step %s: %s, policy %s, loss %.9f over %lld tokens; attention forward calls %lld, block "
           "recomputes %lld\n",
           dir, be->name, act_policy_names[cfg.checkpoint.activations], loss, (long long)n,
           (long long)attn_calls, (long long)m.count.block_recomputes);

    StTensor *out = RS_CALLOC((size_t)m.ptab.n + 1, sizeof *out);
    out[0] = (StTensor){.name = "loss", .dtype = ST_DTYPE_F64, .ndim = 0, .data = &loss};
    for (int i = 0; i < m.ptab.n; i++) {
        const ParamTensor *p = &m.ptab.t[i];
        out[i + 1] = (StTensor){.name = p->name, .dtype = ST_DTYPE_F32, .ndim = p->ndim, .data = host + p->offset};
        out[i + 1].shape[0] = p->shape[0];
        out[i + 1].shape[1] = p->shape[1];
    }
    snprintf(path, sizeof path, "%s/%s", dir, cuda  ? "grads_cuda.safetensors"
                                       : emu ? "grads_bf16emu.safetensors"
                                             : "grads.safetensors");
    if (safetensors_write_file(path, out, m.ptab.n + 1, NULL, NULL, err, sizeof err)) RS_FATAL("%s", err);
    free(out);
    if (steps > 1) parity_train(&m, &b, n, loss, steps, dir, device);
    free(host);
    free(meta);
    if (meta_dev) be->free(meta_dev);
    safetensors_close(&wf);
    safetensors_close(&bf);
    model_free(&m);
    config_free(&cfg);
    return 0;
}
