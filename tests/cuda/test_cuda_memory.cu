/*
 * test_cuda_memory.cu — the memory entries of the cuda backend (kernels/cuda/cuda_memory.cu) and
 * the harness itself on the GPU: a host -> device -> host round trip, alloc zero-filled,
 * memset_zero, copy, copy_2d of a column block (nothing outside it written), add_2d and add_f32, bf16 <-> fp32
 * conversions (act_from_f32 must round exactly as the host's round-to-nearest-even; act_to_f32 is
 * exact), and the allocation accounting of cuda_memory_stats. Bounds are 0 (copies and the same
 * fp32 add) except add_2d's bf16 rounding (CT_BOUND_BF16_OUT).
 *
 * build/test_cuda uses the driver of tests/unit (test_util.h: TEST, EXPECT, test_check_rel):
 * `build/test_cuda --list`, `build/test_cuda NAME...` (tests/cuda/README.md).
 */
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cuda_setup.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

TEST(cuda_memory_round_trip) {
    ct_begin();
    const int64_t n = 1 << 20;
    float *h = ct_host_normal(n, 1.0), *back = ct_host(n);
    float *d = (float *)ct_dev(n * 4); /* poisoned: NaN everywhere */
    cuda_to_device(d, h, n * 4);
    cuda_to_host(back, d, n * 4);
    test_check_rel_f("round trip", back, h, n, 0.0);
}

TEST(cuda_memory_entries) {
    ct_begin();
    BackendMemStats s0, s1, s2;
    cuda_memory_stats(&s0);
    const int64_t n = 3 * 1000 + 7;
    float *d = (float *)cuda_alloc(n * 4), *h = ct_host(n);
    cuda_memory_stats(&s1);
    EXPECT(s1.allocated - s0.allocated == n * 4, "alloc accounting: %lld bytes more, want %lld",
           (long long)(s1.allocated - s0.allocated), (long long)(n * 4));
    EXPECT(s1.peak_allocated >= s1.allocated, "peak %lld < live %lld", (long long)s1.peak_allocated,
           (long long)s1.allocated);
    cuda_to_host(h, d, n * 4);
    int zero = 1;
    for (int64_t i = 0; i < n; i++) zero &= h[i] == 0.0f;
    EXPECT(zero, "cuda_alloc: memory is not zero-filled");
    float *x = ct_host_normal(n, 1.0);
    cuda_to_device(d, x, n * 4);
    cuda_memset_zero(d + 10, 20 * 4);
    float *e = (float *)cuda_alloc(n * 4);
    cuda_copy(e, d, n * 4);
    cuda_to_host(h, e, n * 4);
    for (int i = 10; i < 30; i++) x[i] = 0.0f;
    test_check_rel_f("memset_zero + copy", h, x, n, 0.0);
    cuda_free(d);
    cuda_free(e);
    cuda_memory_stats(&s2);
    EXPECT(s2.allocated == s0.allocated, "after free: %lld bytes live, want %lld", (long long)s2.allocated,
           (long long)s0.allocated);
    printf("accounting: live %lld, peak %lld, backend buffers %lld, device %lld of %lld bytes ok\n",
           (long long)s2.allocated, (long long)s2.peak_allocated, (long long)s2.internal, (long long)s2.device_used,
           (long long)s2.device_total);

    /* copy_2d: a (rows, cols) block between two strided bf16 buffers, mid-vector */
    CtMat src = ct_mat(33, 13, 40, 3), dst = ct_mat(33, 13, 21, 5);
    ct_mat_fill(&src, 1.0);
    bf16 *d_src = ct_mat_up(&src), *d_dst = ct_mat_up(&dst);
    cuda_copy_2d(d_dst, d_src, 33, 13, 21, 40);
    ct_mat_down(&dst, d_dst);
    test_check_rel_f("copy_2d", ct_mat_dense(&dst), ct_mat_dense(&src), 33 * 13, 0.0);
    ct_mat_intact("copy_2d", &dst);

    /* the step's copies on the 16-byte path: the gate's gradient (2048 columns) into the 4608-wide projection
     * row, v (256 columns) out of it beside k; and a 3-row halo block of 6144 columns out of rows of 8224 */
    static const struct { int64_t rows; int cols, ld_dst, ld_src, pad_dst, pad_src; } cs[] = {
        {1029, 2048, 4608, 2048, 2048, 0}, {77, 256, 512, 4608, 256, 4352}, {3, 6144, 6144, 8224, 0, 0}};
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        char what[64];
        snprintf(what, sizeof what, "copy_2d 16-byte [case %zu]", k);
        CtMat a = ct_mat(cs[k].rows, cs[k].cols, cs[k].ld_src, cs[k].pad_src);
        CtMat b = ct_mat(cs[k].rows, cs[k].cols, cs[k].ld_dst, cs[k].pad_dst);
        ct_mat_fill(&a, 1.0);
        bf16 *d_a = ct_mat_up(&a), *d_b = ct_mat_up(&b);
        cuda_copy_2d(d_b, d_a, cs[k].rows, cs[k].cols, cs[k].ld_dst, cs[k].ld_src);
        ct_mat_down(&b, d_b);
        test_check_rel_f(what, ct_mat_dense(&b), ct_mat_dense(&a), cs[k].rows * cs[k].cols, 0.0);
        ct_mat_intact(what, &b);
    }
}

TEST(cuda_act_conversions) {
    ct_begin();
    static const int64_t sizes[] = {1, 7, 4096 + 5};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        for (int off = 0; off < 2; off++) { /* off 1: unaligned, the scalar path */
            const int64_t n = sizes[k];
            float *x = ct_host_normal(n, 3.0), *want = ct_clone(x, n), *got = ct_host(n), *back = ct_host(n);
            ct_round_bf16(want, n);
            float *d_x = (float *)ct_dev((size_t)(n + off) * 4) + off;
            cuda_to_device(d_x, x, n * 4);
            bf16 *d_b = (bf16 *)ct_dev((size_t)(n + off) * 2) + off;
            float *d_f = (float *)ct_dev((size_t)(n + off) * 4) + off;
            cuda_act_from_f32(d_b, d_x, n);
            cuda_act_to_f32(d_f, d_b, n);
            ct_down_bf16(got, d_b, n);
            ct_down_f32(back, d_f, n);
            char what[96];
            snprintf(what, sizeof what, "act_from_f32 n %lld offset %d (round to nearest even)", (long long)n, off);
            test_check_rel_f(what, got, want, n, 0.0);
            snprintf(what, sizeof what, "act_to_f32 n %lld offset %d (exact)", (long long)n, off);
            test_check_rel_f(what, back, want, n, 0.0);
        }
    }
}

/* the CP layer's adds: add_2d (bf16 += bf16: one fp32 add, one rounding: CT_BOUND_BF16_OUT) and
 * add_f32 (the same fp32 add as the cpu: bound 0) */
TEST(cuda_adds) {
    ct_begin();
    static const struct { int64_t rows; int cols, ld_dst, ld_src, pad; } shapes[] = {{3, 512, 800, 512, 0},
                                                                                      {33, 13, 21, 40, 3}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        CtMat dst = ct_mat(shapes[k].rows, shapes[k].cols, shapes[k].ld_dst, shapes[k].pad);
        CtMat src = ct_mat(shapes[k].rows, shapes[k].cols, shapes[k].ld_src, shapes[k].pad);
        ct_mat_fill(&dst, 1.0);
        ct_mat_fill(&src, 1.0);
        CtMat want = ct_mat_clone(&dst);
        bf16 *d_dst = ct_mat_up(&dst);
        cuda_add_2d(d_dst, ct_mat_up(&src), dst.T, dst.cols, dst.ld, src.ld);
        ct_mat_down(&dst, d_dst);
        cpu_add_2d(want.p, src.p, dst.T, dst.cols, dst.ld, src.ld);
        char what[64];
        snprintf(what, sizeof what, "add_2d [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&dst), ct_mat_dense(&want), dst.T * dst.cols, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &dst);
    }
    for (int off = 0; off < 2; off++) {
        const int64_t n = 4096 + 3;
        float *a = ct_host_normal(n, 1.0), *b = ct_host_normal(n, 1.0), *got = ct_host(n);
        float *d_a = (float *)ct_dev((size_t)(n + off) * 4) + off, *d_b = (float *)ct_dev((size_t)(n + off) * 4) + off;
        cuda_to_device(d_a, a, n * 4);
        cuda_to_device(d_b, b, n * 4);
        cuda_add_f32(d_a, d_b, n);
        ct_down_f32(got, d_a, n);
        cpu_add_f32(a, b, n);
        test_check_rel_f(off ? "add_f32 unaligned" : "add_f32", got, a, n, 0.0);
    }
}
