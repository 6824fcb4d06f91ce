/*
 * test_cuda_copyq.cu — the copy queue of the cuda backend (kernels/cuda/cuda_copyq.cu, backend.h
 * copyq_*), which checkpoint.offload uses: a device -> host copy sees the compute queued before it
 * (an add_f32 still running when the copy is queued), copyq_wait holds back the compute queued after
 * it (a memset of the source, queued right after, must not reach the copy), and a host -> device copy
 * lands before the compute that waited for it reads it. 256 MiB, so a copy takes ~10 ms and an
 * ordering mistake shows. Bound 0: copies and the same fp32 add as the host's.
 */
#include <stdio.h>
#include <string.h>

#include "cuda_setup.h"
#include "cuda_copyq.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

TEST(cuda_copyq_order) {
    ct_begin();
    const int64_t n = 64LL << 20; /* 256 MiB of fp32 */
    float *x = ct_host_normal(n, 1.0), *y = ct_host_normal(n, 1.0), *want = ct_host(n), *back = ct_host(n);
    for (int64_t i = 0; i < n; i++) want[i] = x[i] + y[i];
    float *d = (float *)cuda_alloc(n * 4), *dy = (float *)cuda_alloc(n * 4);
    float *pinned = (float *)cuda_host_alloc(n * 4), *pinned2 = (float *)cuda_host_alloc(n * 4);
    void *q = cuda_copyq_create(2);
    cuda_to_device(d, x, n * 4);
    cuda_to_device(dy, y, n * 4);
    cuda_add_f32(d, dy, n);                      /* queued on the compute stream */
    cuda_copyq_to_host(q, 0, pinned, d, n * 4);  /* must see d + dy */
    cuda_copyq_wait(q, 0);
    cuda_memset_zero(d, n * 4);                  /* must wait for the copy */
    cuda_to_host(back, d, n * 4);                /* the compute stream (after the wait) is done */
    test_check_rel_f("device -> host after the queued add, before the memset", pinned, want, n, 0.0);
    memcpy(pinned2, x, n * 4);
    cuda_copyq_to_device(q, 1, d, pinned2, n * 4);
    cuda_copyq_wait(q, 1);
    cuda_to_host(back, d, n * 4);
    test_check_rel_f("host -> device before the compute that waited", back, x, n, 0.0);
    cuda_copyq_destroy(q);
    cuda_host_free(pinned);
    cuda_host_free(pinned2);
    cuda_free(d);
    cuda_free(dy);
}
