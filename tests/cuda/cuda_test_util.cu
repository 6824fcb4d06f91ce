/*
 * cuda_test_util.cu — the helpers of cuda_test.h for the GPU parity cases.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_setup.h"
#include "cuda_test.h"

#define CT_MAX_BUFFERS 1024
static void *ct_buffers[CT_MAX_BUFFERS];
static int   ct_nbuffers;

void ct_begin(void) {
    cuda_backend_init(0);
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    while (ct_nbuffers) CUDA_CHECK(cudaFree(ct_buffers[--ct_nbuffers]));
    long long index;
    int value, code = cuda_error_take(&index, &value);
    EXPECT(code == CUDA_ERR_NONE, "a previous case left device error %d (index %lld, value %d)", code, index, value);
}

void *ct_dev(size_t bytes) {
    if (ct_nbuffers == CT_MAX_BUFFERS) {
        fprintf(stderr, "ct_dev: raise CT_MAX_BUFFERS\n");
        exit(2);
    }
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes ? bytes : 1, cuda_stream()));
    return ct_buffers[ct_nbuffers++] = p;
}

float *ct_host(int64_t n) { return (float *)test_alloc(n * (int64_t)sizeof(float)); }

float *ct_host_nan(int64_t n) {
    float *h = ct_host(n);
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    return h;
}

float *ct_host_normal(int64_t n, double scale) {
    float *h = ct_host(n);
    test_fill_normal(h, n, scale);
    return h;
}

float *ct_clone(const float *h, int64_t n) {
    float *c = ct_host(n);
    memcpy(c, h, (size_t)n * sizeof(float));
    return c;
}

void ct_round_bf16(float *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = __bfloat162float(__float2bfloat16_rn(h[i]));
}

bf16 *ct_up_bf16(const float *h, int64_t n) {
    bf16 *tmp = (bf16 *)test_alloc(n * (int64_t)sizeof(bf16));
    for (int64_t i = 0; i < n; i++) tmp[i] = __float2bfloat16_rn(h[i]);
    bf16 *d = (bf16 *)ct_dev((size_t)n * sizeof(bf16));
    CUDA_CHECK(cudaMemcpyAsync(d, tmp, (size_t)n * sizeof(bf16), cudaMemcpyHostToDevice, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    return d;
}

float *ct_up_f32(const float *h, int64_t n) {
    float *d = (float *)ct_dev((size_t)n * sizeof(float));
    CUDA_CHECK(cudaMemcpyAsync(d, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    return d;
}

int32_t *ct_up_i32(const int32_t *h, int64_t n) {
    int32_t *d = (int32_t *)ct_dev((size_t)n * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(d, h, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    return d;
}

void ct_down_bf16(float *h, const void *d, int64_t n) {
    bf16 *tmp = (bf16 *)test_alloc(n * (int64_t)sizeof(bf16));
    CUDA_CHECK(cudaMemcpyAsync(tmp, d, (size_t)n * sizeof(bf16), cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    for (int64_t i = 0; i < n; i++) h[i] = __bfloat162float(tmp[i]);
}

void ct_down_f32(float *h, const float *d, int64_t n) {
    CUDA_CHECK(cudaMemcpyAsync(h, d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

int ct_bitwise_equal(const char *what, const float *a, const float *b, int64_t n) {
    if (memcmp(a, b, (size_t)n * sizeof(float)) != 0) {
        test_fail(__FILE__, __LINE__, "%s: two runs on the same inputs differ (not deterministic)", what);
        return 0;
    }
    printf("%s: two runs bitwise equal ok\n", what);
    return 1;
}

CtMat ct_mat(int64_t T, int cols, int ld, int pad) {
    CtMat m;
    m.T = T;
    m.cols = cols;
    m.ld = ld;
    m.pad = pad;
    m.total = pad + (T + 1) * (int64_t)ld;
    m.base = ct_host_nan(m.total);
    m.p = m.base + pad;
    return m;
}

void ct_mat_fill(CtMat *m, double scale) {
    for (int64_t t = 0; t < m->T; t++) {
        test_fill_normal(m->p + t * m->ld, m->cols, scale);
        ct_round_bf16(m->p + t * m->ld, m->cols);
    }
}

CtMat ct_mat_clone(const CtMat *m) {
    CtMat c = *m;
    c.base = ct_clone(m->base, m->total);
    c.p = c.base + m->pad;
    return c;
}

bf16 *ct_mat_up(const CtMat *m) { return ct_up_bf16(m->base, m->total) + m->pad; }

void ct_mat_down(CtMat *m, const bf16 *dp) { ct_down_bf16(m->base, dp - m->pad, m->total); }

float *ct_mat_dense(const CtMat *m) {
    float *d = ct_host(m->T * m->cols);
    for (int64_t t = 0; t < m->T; t++)
        for (int c = 0; c < m->cols; c++) d[t * m->cols + c] = m->p[t * m->ld + c];
    return d;
}

int ct_mat_intact(const char *what, const CtMat *m) {
    for (int64_t i = 0; i < m->total; i++) {
        int64_t rel = i - m->pad;
        int inside = rel >= 0 && rel / m->ld < m->T && rel % m->ld < m->cols;
        if (!inside && !isnan(m->base[i])) {
            test_fail(__FILE__, __LINE__, "%s: wrote outside its block (row %lld col %lld)", what,
                      (long long)(rel >= 0 ? rel / m->ld : -1), (long long)(rel >= 0 ? rel % m->ld : rel));
            return 0;
        }
    }
    return 1;
}
