/*
 * bench_step.c — one training step of a config on one GPU, timed, for
 * `ringscan bench step` (bench.h).
 *
 * The step is the trainer's (lib/run/train.c train_loop) without data loading and
 * logging: zero the gradients, model_forward_backward on one sample, the
 * global gradient norm, the clipping factor, AdamW on every tensor. The
 * sample is random token ids, uploaded once: one document of the whole length,
 * or the case's documents (cu_seqlens, `bench step --doc-len`): doc_pos restarts
 * at each document and no token predicts across a document end (target -1),
 * as data_read_sample gives packed data. Warm-up steps, then timed steps; each timed step starts and ends with
 * the compute stream drained, measured by the host clock (a step reads the
 * loss and the norm on the host, so it is host-synchronous anyway); the
 * median is reported.
 *
 * With --profile 1 the step runs through the profiled backend table
 * (kernels/cuda/cuda_profile.h) and, after the timed steps, prints to stderr
 * the GPU and host milliseconds per step of every Backend entry, the attention
 * on the cuDNN route included, their sum, and the rest of the measured mean
 * step as "unaccounted (launch gaps, host)", so the rows add up to the step
 * (the timer's events and periodic drains make that run's step time a little
 * longer: time the step without it).
 *
 * The row also carries the last step's work counters (block_recomputes, chunk_recomputes:
 * what the checkpoint policy reran; both 0 under none).
 *
 * Memory: the cuda backend's peak of live allocations plus its own buffers
 * (cuBLASLt workspace, kernel scratch), as `ringscan train` reports it, and
 * the device's used memory (cudaMemGetInfo: the CUDA context and the kernels'
 * stream-ordered workspaces included), read after the timed steps.
 *
 * Callers: bench/bench.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "bench_common.h"
#include "core/error.h"
#include "model/model.h"
#include "core/rng.h"
#ifdef RS_WITH_CUDA
#include "cuda_setup.h"
#include "cuda_bench.h"
#include "cuda_profile.h"
#endif

#ifdef RS_WITH_CUDA

static double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench_step_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One optimizer step; returns the mean loss. */
static double bench_step_once(Model *m, const Batch *b, int64_t predicted, int step) {
    const Backend *be = m->be;
    const Config *cfg = m->cfg;
    int64_t nparam = m->ptab.buffer_numel;
    memset(&m->count, 0, sizeof m->count); /* the row reports the last step's */
    be->memset_zero(m->grads, (size_t)nparam * sizeof(float));
    model_forward_backward(m, b, (float)(1.0 / (double)predicted), 0);
    double loss = model_loss_sum(m, 1) / (double)predicted;
    double gnorm = sqrt(be->sum_squares(m->grads, nparam));
    float clip = cfg->train.grad_clip > 0 && gnorm > cfg->train.grad_clip ? (float)(cfg->train.grad_clip / gnorm)
                                                                           : 1.0f;
    for (int i = 0; i < m->ptab.n; i++) {
        const ParamTensor *p = &m->ptab.t[i];
        float wd = model_param_decays(cfg, (ParamGroup)p->group) ? (float)cfg->train.weight_decay : 0.0f;
        void *compute = m->weights == (void *)m->params ? NULL : (char *)m->weights + p->offset * be->act_size;
        be->adamw_update(m->params + p->offset, m->adam_m + p->offset, m->adam_v + p->offset, compute,
                         m->grads + p->offset, p->numel, (float)cfg->train.lr, (float)cfg->train.beta1,
                         (float)cfg->train.beta2, (float)cfg->train.eps, wd, clip, step);
    }
    cuda_bench_sync();
    return loss;
}

json_t *bench_step_case(const json_t *c, const Config *cfg, const BenchOptions *o) {
    /* backend_cuda unless --profile 1; with device.attention_kernel cudnn* (or auto where cuDNN loads) the cuDNN
     * route in its attention entries, as training has it */
    char why[4096];
    const int impl = backend_attention_resolve(cfg->device.attention_kernel, cfg->device.cudnn_library, why, sizeof why);
    if (why[0]) printf("%s\n", why);
    const Backend *be = bench_attn_backend(cuda_backend_table(), impl, cfg->device.cudnn_library);
    int64_t T = cfg->data.seq_len;
    Model m;
    model_init(&m, cfg, be, NULL, T);

    /* one sample of random token ids: one document, or the case's (cu_seqlens) */
    int32_t *host = RS_MALLOC((size_t)(4 * T) * sizeof(int32_t));
    Rng rng;
    rng_init(&rng, o->seed, 0xbe9c);
    int64_t V = cfg->model.vocab_size;
    for (int64_t t = 0; t < T; t++) host[t] = (int32_t)rng_below(&rng, (uint64_t)V);
    bench_case_doc_pos(host + 3 * T, c, T); /* doc_pos */
    int64_t predicted = 0;
    for (int64_t t = 0; t < T; t++) {
        const int same_doc = t + 1 < T && host[3 * T + t + 1] != 0;
        host[T + t] = same_doc ? host[t + 1] : -1; /* targets: none across a document end */
        host[2 * T + t] = (int32_t)t;               /* pos */
        predicted += same_doc;
    }
    int32_t *dev = be->alloc((size_t)(4 * T) * sizeof(int32_t));
    be->to_device(dev, host, (size_t)(4 * T) * sizeof(int32_t));
    Batch b = {T, 1, T, dev, dev + T, dev + 2 * T, dev + 3 * T, host + 2 * T, host + 3 * T, 0};

    double *ms = RS_MALLOC((size_t)o->reps * sizeof(double));
    int n = 0, step = 0;
    double spent = 0, loss = 0;
    for (int i = 0; i < o->warmup + o->reps; i++) {
        cuda_bench_sync();
        double t0 = bench_now();
        loss = bench_step_once(&m, &b, predicted, ++step);
        double dt = bench_now() - t0;
        if (!isfinite(loss)) RS_FATAL("bench step: non-finite loss %g at step %d", loss, step);
        if (i < o->warmup) {
            if (i == o->warmup - 1 && cuda_profile_on()) cuda_profile_reset();
            continue;
        }
        ms[n++] = dt * 1e3;
        spent += dt;
        if (n >= 3 && spent > o->max_s) break;
    }
    if (cuda_profile_on()) {
        fprintf(stderr, "bench step %s, %lld tokens: ", json_string_value(json_object_get(c, "name")), (long long)T);
        cuda_profile_print(stderr, n, 1e3 * spent / n); /* the rows against the measured mean step */
    }
    qsort(ms, (size_t)n, sizeof *ms, bench_step_cmp);
    double med = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    BackendMemStats st;
    be->memory_stats(&st);
    json_t *r = json_pack("{ss ss sf sf sI sI si sf}", "case", json_string_value(json_object_get(c, "name")), "impl",
                          "ringscan", "ms_step", med, "tokens_per_s", (double)T / (med / 1e3), "peak_alloc_bytes",
                          (json_int_t)(st.peak_allocated + st.internal), "device_used_bytes",
                          (json_int_t)st.device_used, "reps", n, "loss", loss);
    /* what the checkpoint policy reran in a step (model.h ModelCounters; none: 0 and 0) */
    json_object_set_new(r, "block_recomputes", json_integer(m.count.block_recomputes));
    json_object_set_new(r, "chunk_recomputes", json_integer(m.count.chunk_recomputes));
    json_object_set_new(r, "attn_impl", json_string(attn_kernel_names[impl]));
    free(ms);
    free(host);
    be->free(dev);
    model_free(&m);
    return r;
}

#else

json_t *bench_step_case(const json_t *c, const Config *cfg, const BenchOptions *o) {
    (void)c, (void)cfg, (void)o;
    RS_FATAL("bench_step_case: this ringscan was built without the cuda backend");
}

#endif
