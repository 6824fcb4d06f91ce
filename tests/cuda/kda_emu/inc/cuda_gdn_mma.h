/*
 * cuda_gdn_mma.h (kda_emu) — the host emulation's stand-in for kernels/cuda/cuda_gdn_mma.h: the warp-level
 * tensor-core pieces (gdn_warp_mma, gdn_frag_row / gdn_frag_col, gdn_zero, gdn_zero_row) with the same
 * signatures and fragment layout, so kernels written against the real header build here unchanged. Each lane
 * computes its own accumulator elements (the C fragment of mma.m16n8k16: row g / g + 8, cols 2t, 2t + 1) straight
 * from the shared-memory tiles: per k step of 16, the 16 products of the bf16 values (exact in fp32) summed in
 * fp32 and added to the accumulator, the products the mma forms. No lane reads another's registers, so no
 * cross-lane traffic; what the hardware needs and the host does not (16-byte row addresses for ldmatrix, a row
 * stride that is a multiple of 8, NT even, KD a multiple of 16) is checked and aborts. The order of the
 * additions inside one k step is the host's, not the tensor core's (whose fp32 accumulation rounds differently in
 * the last bits): the emulation proves layouts and algebra, the GPU run the device's rounding. The unit check
 * mma_check.cpp compares it with a plain GEMM for the four transpose combinations. cp.async is emulated below
 * (deferred copies).
 */
#ifndef RS_CUDA_GDN_MMA_H
#define RS_CUDA_GDN_MMA_H
#include "cuda_common.h"

#define GDN_DEV static inline

static inline void emu_mma_fault(const char *what) {
    fprintf(stderr, "emu gdn_warp_mma: %s\n", what);
    abort();
}

/* cp.async (cuda_ptx.h's ptx_cp_async16 / _commit / _wait) with the hardware's freedom made visible: a copy is
 * queued in the thread's open group and lands only when a ptx_cp_async_wait<N> retires its group (all but the N
 * most recent committed groups), so a tile read before its wait holds the previous chunk's bytes (or the
 * launch's garbage) and fails the comparison; an invalid copy writes 16 zero bytes. Addresses must be 16-byte
 * aligned, as on the device. */
struct EmuCopy { unsigned char *dst; const unsigned char *src; bool ok; };
struct EmuCpState { std::vector<std::vector<EmuCopy>> groups; std::vector<EmuCopy> open; };
/* each CUDA thread's copies, fresh for every block (emu_fiber_epoch changes with every block run) */
static inline EmuCpState &emu_cp(void) {
    static EmuCpState s[1024];
    static uint64_t epoch[1024];
    if (epoch[threadIdx.x] != emu_fiber_epoch()) {
        s[threadIdx.x] = EmuCpState();
        epoch[threadIdx.x] = emu_fiber_epoch();
    }
    return s[threadIdx.x];
}
static inline void ptx_cp_async16(void *smem, const void *gmem, bool valid) {
    if (((uintptr_t)smem & 15) != 0 || (valid && ((uintptr_t)gmem & 15) != 0)) emu_mma_fault("cp.async16 address not 16-byte aligned");
    emu_cp().open.push_back(EmuCopy{(unsigned char *)smem, (const unsigned char *)gmem, valid});
}
static inline void ptx_cp_async_commit(void) {
    EmuCpState &s = emu_cp();
    s.groups.push_back(std::move(s.open));
    s.open.clear();
}
template <int N> static inline void ptx_cp_async_wait(void) {
    EmuCpState &s = emu_cp();
    while (s.groups.size() > (size_t)N) {
        for (const EmuCopy &c : s.groups.front()) {
            if (c.ok) memcpy(c.dst, c.src, 16);
            else memset(c.dst, 0, 16);
        }
        s.groups.erase(s.groups.begin());
    }
}

template <int N> GDN_DEV void gdn_zero_row(__nv_bfloat16 *p) {
    static_assert(N % 8 == 0, "gdn_zero_row: N % 8");
    if (((uintptr_t)p & 15) != 0) emu_mma_fault("gdn_zero_row: row not 16-byte aligned");
    for (int i = 0; i < N; i++) p[i].x = 0;
}

GDN_DEV int gdn_frag_row(int e) { return (int)((threadIdx.x & 31) >> 2) + ((e >> 1) << 3); }
GDN_DEV int gdn_frag_col(int e) { return (int)((threadIdx.x & 3) << 1) + (e & 1); }

/* acc[mi][ni] += A B over k in [0, KD) (see the real header for AT / BT and the tile conventions) */
template <int MT, int NT, bool AT, bool BT, int KD>
GDN_DEV void gdn_warp_mma(float (&acc)[MT][NT][4], const __nv_bfloat16 *sA, int lda, const __nv_bfloat16 *sB,
                          int ldb, int m0, int n0) {
    static_assert(NT % 2 == 0 && KD % 16 == 0, "gdn_warp_mma: NT even, KD multiple of 16");
    if (((uintptr_t)sA & 15) != 0 || ((uintptr_t)sB & 15) != 0) emu_mma_fault("tile base not 16-byte aligned");
    if (lda % 8 != 0 || ldb % 8 != 0) emu_mma_fault("row stride not a multiple of 8 elements");
    if (m0 % 8 != 0 || n0 % 8 != 0) emu_mma_fault("tile corner not on an 8-element boundary");
    for (int mi = 0; mi < MT; mi++)
        for (int ni = 0; ni < NT; ni++)
            for (int e = 0; e < 4; e++) {
                const int r = m0 + mi * 16 + gdn_frag_row(e), c = n0 + ni * 8 + gdn_frag_col(e);
                float x = acc[mi][ni][e];
                for (int k0 = 0; k0 < KD; k0 += 16) {
                    float s = 0.0f;
                    for (int kk = k0; kk < k0 + 16; kk++) {
                        const float a = __bfloat162float(AT ? sA[(size_t)kk * lda + r] : sA[(size_t)r * lda + kk]);
                        const float b = __bfloat162float(BT ? sB[(size_t)c * ldb + kk] : sB[(size_t)kk * ldb + c]);
                        s += a * b;
                    }
                    x += s;
                }
                acc[mi][ni][e] = x;
            }
}

template <int MT, int NT> GDN_DEV void gdn_zero(float (&acc)[MT][NT][4]) {
    for (int mi = 0; mi < MT; mi++)
        for (int ni = 0; ni < NT; ni++)
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;
}

#endif
