/*
 * cuda_gdn_mma.h — the warp-level tensor-core pieces the Gated DeltaNet kernels
 * (cuda_gdn.cu) are built from: ldmatrix loads from shared memory, the
 * mma.sync m16n8k16 bf16 -> fp32 instruction, cp.async copies with zero fill,
 * bulk copies (cp.async.bulk) with their mbarriers,
 * and one warp GEMM that multiplies tiles held in shared memory in any of the
 * four transpose combinations the chunked delta rule needs (K K^T, T^T dW,
 * K^T v, dS^T Q, ...). Header-only so that tests/cuda/test_cuda_gdn.cu can
 * check the fragment layouts on their own.
 *
 * Fragment layout of mma.m16n8k16 (PTX ISA), g = lane / 4, t = lane % 4:
 *   A 16x16 row-major: a0a1 (row g, cols 2t..2t+1), a2a3 (row g+8), a4a5 (row g, cols 2t+8..),
 *                      a6a7 (row g+8, cols 2t+8..)
 *   B 16x8:            b0b1 (rows 2t..2t+1, col g), b2b3 (rows 2t+8..2t+9, col g)
 *   C 16x8 fp32:       c0c1 (row g, cols 2t..2t+1), c2c3 (row g+8, cols 2t..2t+1)
 * gdn_frag_row / gdn_frag_col give an accumulator element's coordinates.
 *
 * Shared-memory tiles are row-major bf16 with a row stride (ld, in elements)
 * that is a multiple of 8 (16-byte rows for ldmatrix) and, to avoid bank
 * conflicts, not a multiple of 64: the kernels pad every row by 8 elements.
 */
#ifndef RS_CUDA_GDN_MMA_H
#define RS_CUDA_GDN_MMA_H

#include <cuda_bf16.h>
#include <stdint.h>

#define GDN_DEV __device__ __forceinline__

GDN_DEV uint32_t gdn_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i */
GDN_DEV void gdn_ldsm_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(gdn_smem_addr(p)));
}

/* the same, each 8x8 matrix transposed on the way */
GDN_DEV void gdn_ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(gdn_smem_addr(p)));
}

/* c += a b: bf16 operands, fp32 accumulation */
GDN_DEV void gdn_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared, asynchronously; valid == false writes 16 zero bytes (src is not read) */
GDN_DEV void gdn_cp_async16(void *smem, const void *gmem, bool valid) {
    const unsigned n = valid ? 16u : 0u;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(gdn_smem_addr(smem)), "l"(gmem), "r"(n));
}

/* 4 bytes global -> shared, asynchronously; valid == false writes zero */
GDN_DEV void gdn_cp_async4(void *smem, const void *gmem, bool valid) {
    const unsigned n = valid ? 4u : 0u;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(gdn_smem_addr(smem)), "l"(gmem), "r"(n));
}

GDN_DEV void gdn_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }

/* wait until at most N of this thread's committed groups are still in flight */
template <int N> GDN_DEV void gdn_cp_async_wait(void) { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Bulk copies (sm_90: cp.async.bulk, the copy engine of TMA without a tensor map) and the mbarriers
 * that count their bytes. A load names an mbarrier whose phase completes when its one arrival (the
 * expect_tx of the issuing block) has happened and every byte promised has landed; the byte count may
 * run ahead of the expectation (it is signed), so the copies and the expectation can be issued in any
 * order. A store from shared memory joins this thread's bulk group; wait_read<0> returns when the
 * shared source of every committed group has been read (it may be written again), wait_all<0> when
 * the global writes are done. Generic-proxy writes to shared memory that a bulk copy then reads or
 * overwrites need gdn_fence_async_smem() first (by the writing thread, before the barrier). */
GDN_DEV void gdn_mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(gdn_smem_addr(bar)), "r"(count));
}

/* make the initialised mbarriers visible to the copy engine (one thread, after gdn_mbar_init) */
GDN_DEV void gdn_mbar_init_fence(void) { asm volatile("fence.mbarrier_init.release.cluster;\n" ::); }

GDN_DEV void gdn_mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(gdn_smem_addr(bar)), "r"(bytes)
                 : "memory");
}

/* spin until the phase with this parity has completed */
GDN_DEV void gdn_mbar_wait(uint64_t *bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(gdn_smem_addr(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

/* bytes (multiple of 16, both addresses 16-byte aligned) global -> shared, counted on bar */
GDN_DEV void gdn_bulk_load(void *smem, const void *gmem, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     gdn_smem_addr(smem)),
                 "l"(gmem), "r"(bytes), "r"(gdn_smem_addr(bar))
                 : "memory");
}

/* bytes (multiple of 16, 16-byte aligned) shared -> global in this thread's bulk group */
GDN_DEV void gdn_bulk_store(void *gmem, const void *smem, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem), "r"(gdn_smem_addr(smem)),
                 "r"(bytes)
                 : "memory");
}

GDN_DEV void gdn_bulk_commit(void) { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

template <int N> GDN_DEV void gdn_bulk_wait_read(void) {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

template <int N> GDN_DEV void gdn_bulk_wait_all(void) {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

GDN_DEV void gdn_fence_async_smem(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* N bf16 zeros (N % 8 == 0, 16-byte aligned) at p in shared memory, generic stores */
template <int N> GDN_DEV void gdn_zero_row(__nv_bfloat16 *p) {
#pragma unroll
    for (int i = 0; i < N / 8; i++) ((uint4 *)p)[i] = make_uint4(0u, 0u, 0u, 0u);
}

/* coordinates of accumulator element e (0..3) of a 16x8 tile whose corner is (0, 0) */
GDN_DEV int gdn_frag_row(int e) { return ((threadIdx.x & 31) >> 2) + ((e >> 1) << 3); }
GDN_DEV int gdn_frag_col(int e) { return ((threadIdx.x & 3) << 1) + (e & 1); }

/*
 * One warp: acc[mi][ni] (16x8 tiles, rows m0 + 16 mi, cols n0 + 8 ni) += A B over k in [0, KD).
 *   AT == false: A is stored row-major (rows m, cols k) at sA, row stride lda.
 *   AT == true:  A = X^T, X stored row-major (rows k, cols m) at sA.
 *   BT == false: B is stored row-major (rows k, cols n) at sB, row stride ldb.
 *   BT == true:  B = Z^T, Z stored row-major (rows n, cols k) at sB.
 * NT must be even (two n tiles per ldmatrix.x4), KD a multiple of 16.
 */
template <int MT, int NT, bool AT, bool BT, int KD>
GDN_DEV void gdn_warp_mma(float (&acc)[MT][NT][4], const __nv_bfloat16 *sA, int lda, const __nv_bfloat16 *sB, int ldb,
                          int m0, int n0) {
    static_assert(NT % 2 == 0 && KD % 16 == 0, "gdn_warp_mma: NT even, KD multiple of 16");
    const int lane = threadIdx.x & 31, r8 = lane & 7, i1 = (lane >> 3) & 1, i2 = lane >> 4;
#pragma unroll 4
    for (int k0 = 0; k0 < KD; k0 += 16) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
            if (!AT) gdn_ldsm_x4(a[mi], sA + (m0 + mi * 16 + r8 + i1 * 8) * lda + k0 + i2 * 8);
            else gdn_ldsm_x4_t(a[mi], sA + (k0 + r8 + i2 * 8) * lda + m0 + mi * 16 + i1 * 8);
        }
#pragma unroll
        for (int nj = 0; nj < NT; nj += 2) {
            uint32_t b[4];
            if (!BT) gdn_ldsm_x4_t(b, sB + (k0 + r8 + i1 * 8) * ldb + n0 + nj * 8 + i2 * 8);
            else gdn_ldsm_x4(b, sB + (n0 + nj * 8 + r8 + i2 * 8) * ldb + k0 + i1 * 8);
#pragma unroll
            for (int mi = 0; mi < MT; mi++) {
                gdn_mma(acc[mi][nj], a[mi], b[0], b[1]);
                gdn_mma(acc[mi][nj + 1], a[mi], b[2], b[3]);
            }
        }
    }
}

template <int MT, int NT> GDN_DEV void gdn_zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;
}

#endif
