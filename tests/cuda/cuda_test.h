/*
 * cuda_test.h — what the GPU parity cases of build/test_cuda share (C++;
 * tests/cuda/README.md says how the harness runs). Implemented in
 * cuda_test_util.cu.
 *
 * The pattern of a case: draw fresh random inputs on the host (never zeros:
 * test_fill_normal), round them to bf16 where the cuda entry reads bf16
 * (ct_round_bf16 / ct_mat_round), hand the SAME rounded values to the cpu
 * kernel as fp32 (so the comparison measures the kernel, not the rounding of
 * its inputs), poison every output on both sides first (NaN: 0xFF bytes on
 * the device, NAN on the host; `+=` outputs get the same random prefill on
 * both sides instead), run both, and compare with test_check_rel_f against a
 * bound stated in the case.
 *
 *   ct_begin()             first line of every case: the backend on device 0,
 *                          and the previous case's device buffers freed
 *   ct_dev(bytes)          device buffer filled with 0xFF (NaN in bf16 and fp32)
 *   ct_up_bf16 / _f32 / _i32, ct_down_bf16 / _f32
 *                          host <-> device copies (bf16 converted on the host,
 *                          round to nearest even, NaN kept)
 *   CtMat                  a (T, cols) block inside rows of ld floats, with
 *                          `pad` poisoned floats before it and a poisoned row
 *                          after it (pad % 8 != 0 makes every row start
 *                          mid-vector: the kernels' scalar path); ct_mat_up
 *                          puts the whole thing on the device, ct_mat_down
 *                          brings it back, ct_mat_intact checks that nothing
 *                          outside the block was written, ct_mat_dense
 *                          gathers the block
 *   ct_bitwise_equal       determinism checks (two runs, same bits)
 */
#ifndef RS_CUDA_TEST_H
#define RS_CUDA_TEST_H

#include <math.h>
#include <stdint.h>

#include "cuda_common.h"
#include "test_util.h"

/* ---- bounds (relative L2 error against the cpu kernel on the same, bf16-rounded, inputs) ----
 * CT_BOUND_BF16_OUT   a bf16 output of fp32 math: bf16 keeps 8 significant bits, so round to
 *                     nearest even changes a value by at most 2^-8 = 3.9e-3 of itself; the relative
 *                     L2 error of the rounding alone is below that (~1.5e-3 over many elements, up
 *                     to 3.9e-3 for a single unlucky element), and fp32 summation order adds ~1e-6.
 *                     A wrong index, a missed term or a misplaced eps costs far more.
 * CT_BOUND_F32        an fp32 output of fp32 math on identical inputs (statistics, gates, parameter
 *                     gradients from bf16 operands): only the order of the sums differs, ~1e-7..1e-6.
 * CT_BOUND_BF16_TWICE an output computed from a bf16-rounded intermediate (the lm_head's dlogits
 *                     feed tensor-core GEMMs in bf16): two roundings, each <= 3.9e-3.
 * Each case names its bound and measures the error; README.md has the table. */
#define CT_BOUND_BF16_OUT   4e-3
#define CT_BOUND_F32        1e-5
#define CT_BOUND_BF16_TWICE 1e-2

void     ct_begin(void);
void    *ct_dev(size_t bytes);
float   *ct_host(int64_t n);                  /* host floats, freed at the end of the case */
float   *ct_host_nan(int64_t n);
float   *ct_host_normal(int64_t n, double scale);
void     ct_round_bf16(float *h, int64_t n);   /* in place: the values a bf16 holds */
bf16    *ct_up_bf16(const float *h, int64_t n);
float   *ct_up_f32(const float *h, int64_t n);
int32_t *ct_up_i32(const int32_t *h, int64_t n);
void     ct_down_bf16(float *h, const void *d, int64_t n);
void     ct_down_f32(float *h, const float *d, int64_t n);
float   *ct_clone(const float *h, int64_t n);
int      ct_bitwise_equal(const char *what, const float *a, const float *b, int64_t n);

typedef struct {
    float  *base; /* host copy of the whole allocation */
    float  *p;    /* base + pad */
    int64_t T, total;
    int     cols, ld, pad;
} CtMat;

CtMat ct_mat(int64_t T, int cols, int ld, int pad);  /* all NaN */
void  ct_mat_fill(CtMat *m, double scale);           /* the block: normal(0, scale), rounded to bf16 */
CtMat ct_mat_clone(const CtMat *m);
bf16 *ct_mat_up(const CtMat *m);                     /* device copy; returns the block's start */
void  ct_mat_down(CtMat *m, const bf16 *dp);         /* from the block's start as ct_mat_up returned it */
float *ct_mat_dense(const CtMat *m);                 /* (T, cols) */
int   ct_mat_intact(const char *what, const CtMat *m);

#endif
