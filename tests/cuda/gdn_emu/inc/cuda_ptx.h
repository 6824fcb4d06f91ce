/*
 * cuda_ptx.h (gdn_emu) — the host emulation's stand-in for kernels/cuda/cuda_ptx.h, for the GDN kernels
 * (kernels/cuda/gdn/, built by oracle_build.sh) and the unit check mma_check.cpp beside it. The pieces the mma.sync
 * kernels use run faithfully, lane by lane, in the PTX fragment layout:
 *   ptx_ldmatrix_x4 / _x4_trans  every lane gives one row address (lanes 8i..8i+7: rows 0..7 of matrix i), every lane
 *                                receives its 2 bf16 of each of the 4 8x8 matrices: r[i] = (row g, cols 2t, 2t + 1)
 *                                of matrix i, or with .trans (rows 2t, 2t + 1, col g); g = lane / 4, t = lane % 4
 *   ptx_mma_bf16_16816           m16n8k16 row.col: each lane's a[4], b0, b1 as the PTX ISA places them (A a0a1 row
 *                                g cols 2t.., a2a3 row g + 8, a4a5 row g cols 2t + 8.., a6a7 row g + 8 cols 2t + 8..;
 *                                B b0b1 rows 2t.. col g, b2b3 rows 2t + 8.. col g); the warp's 16 x 8 product is
 *                                formed once from the gathered registers (each element the 16 products, exact in
 *                                fp32, summed in fp32 in k order), and each lane adds its own C elements (row g /
 *                                g + 8, cols 2t, 2t + 1) to its accumulator (the sums of the kda_emu gdn_warp_mma)
 *   ptx_cp_async*                deferred copies (tests/cuda/kda_emu/inc/emu_cp_async.h)
 * The registers cross lanes through per-warp slots between warp barriers (double-buffered by the barrier's
 * generation, so one barrier per exchange: a slot is written again two exchanges later, after every lane has passed
 * the barrier in between), so a fragment taken from the wrong lane or register gives a wrong product. An ldmatrix
 * row address must be 16-byte aligned and inside the dynamic shared memory (kda_smem), or the program stops.
 * Everything else of the real header (wgmma, TMA, mbarriers, bulk groups, stmatrix, named barriers, ...) serves
 * only the Hopper passes (gdn/state_forward_wgmma.cuh, state_forward_regs.cuh, state_backward_regs.cuh), which the
 * emulation never runs (gdn_emu_rt.cpp turns their switches off): those are stubs that stop the program with a
 * message if ever reached.
 */
#pragma once
#include "cuda_common.h"
#include "emu_cp_async.h"
/* the warp GEMM the kernels call (gdn_warp_mma, gdn_frag_row, ...): tests/cuda/kda_emu/inc's direct one, each lane
 * its accumulator from the tiles (mma_check.cpp checks it bitwise against the real one over the PTX below); the GDN
 * kernels' GDN_DEV functions include members, so GDN_DEV is the real header's plain inline from here on */
#include "cuda_gdn_mma.h"
#undef GDN_DEV
#define GDN_DEV inline

/* ---- lane exchange ---- */

struct EmuPtxLane {
    float a[8], b[4]; /* mma: a0..a7, b0..b3 of the PTX ISA (each register's low half first), as floats */
    const bf16 *row;  /* ldmatrix: this lane's row address */
};
/* [phase parity][warp][lane]; blocks run one at a time, so one set serves every block */
static inline EmuPtxLane (&emu_ptx_slots(void))[2][32][32] {
    static EmuPtxLane s[2][32][32];
    return s;
}
/* this lane's slot of the exchange about to happen (w, l: warp, lane; par: the phase's slots) */
static inline EmuPtxLane *emu_ptx_begin(int *w, int *l, int *par) {
    const int tid = emu_tid();
    *w = tid / 32;
    *l = tid % 32;
    *par = (int)(emu_blk->wbar[*w].gen & 1);
    return &emu_ptx_slots()[*par][*w][*l];
}
/* the warp's slots of the same phase, once every lane has written its own */
static inline EmuPtxLane *emu_ptx_end(int w, int par) {
    emu_barrier_wait(&emu_blk->wbar[w]);
    return emu_ptx_slots()[par][w];
}

static inline void emu_ptx_fault(const char *what) {
    fprintf(stderr, "emu cuda_ptx: %s\n", what);
    abort();
}
static inline uint32_t emu_pack2(bf16 lo, bf16 hi) { return (uint32_t)lo.x | (uint32_t)hi.x << 16; }
/* the low (hi = 0) or high bf16 of a register, as a float */
static inline float emu_half(uint32_t r, int hi) { return __bfloat162float(bf16{(uint16_t)(hi ? r >> 16 : r)}); }

/* ---- ldmatrix ---- */

template <bool TRANS> static inline void emu_ldmatrix_x4(uint32_t (&r)[4], const void *p) {
    extern unsigned char kda_smem[];
    const unsigned char *b = (const unsigned char *)p;
    if (((uintptr_t)p & 15) != 0) emu_ptx_fault("ldmatrix: row address not 16-byte aligned");
    if (b < kda_smem || b + 16 > kda_smem + EMU_SMEM_MAX) emu_ptx_fault("ldmatrix: row outside shared memory");
    int w, l, par;
    emu_ptx_begin(&w, &l, &par)->row = (const bf16 *)p;
    const EmuPtxLane *s = emu_ptx_end(w, par);
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) {
        if (!TRANS) r[i] = emu_pack2(s[8 * i + g].row[2 * t], s[8 * i + g].row[2 * t + 1]);
        else r[i] = emu_pack2(s[8 * i + 2 * t].row[g], s[8 * i + 2 * t + 1].row[g]);
    }
}
/* four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i */
static inline void ptx_ldmatrix_x4(uint32_t (&r)[4], const void *p) { emu_ldmatrix_x4<false>(r, p); }
/* the same, each 8x8 matrix transposed on the way */
static inline void ptx_ldmatrix_x4_trans(uint32_t (&r)[4], const void *p) { emu_ldmatrix_x4<true>(r, p); }

/* ---- mma.sync m16n8k16 bf16 -> fp32 ---- */

/* the warp's product D = A B (16 x 8) of one exchange, formed by the first lane to read it: D[r][n] is the 16
 * products of row r and column n summed in fp32 in k order; (epoch, gen): the block run and the exchange's barrier
 * generation, which name the exchange */
struct EmuPtxProduct { uint64_t epoch, gen; float d[16][8]; };

/* c += a b */
static inline void ptx_mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    static EmuPtxProduct prod[32];
    int w, l, par;
    EmuPtxLane *me = emu_ptx_begin(&w, &l, &par);
    for (int i = 0; i < 8; i++) me->a[i] = emu_half(a[i / 2], i % 2);
    for (int i = 0; i < 4; i++) me->b[i] = emu_half(i < 2 ? b0 : b1, i % 2);
    const EmuPtxLane *s = emu_ptx_end(w, par);
    EmuPtxProduct &p = prod[w];
    const uint64_t gen = emu_blk->wbar[w].gen; /* this exchange's: the barrier's next release is the next one's */
    if (p.gen != gen || p.epoch != emu_fiber_epoch()) {
        /* A (r, k): lane 4 (r % 8) + (k % 8) / 2, element 2 (r / 8 + 2 (k / 8)) + k % 2 of its a0..a7;
         * B (k, n): lane 4 n + (k % 8) / 2, element 2 (k / 8) + k % 2 of its b0..b3 */
        float A[16][16], B[16][8]; /* [k][r], [k][n] */
        for (int k = 0; k < 16; k++) {
            const int kl = (k % 8) / 2, kh = k % 2;
            for (int r = 0; r < 16; r++) A[k][r] = s[4 * (r % 8) + kl].a[2 * (r / 8 + 2 * (k / 8)) + kh];
            for (int n = 0; n < 8; n++) B[k][n] = s[4 * n + kl].b[2 * (k / 8) + kh];
        }
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) p.d[r][n] = 0.0f;
        for (int k = 0; k < 16; k++) /* each element's sum in k order (the elements interleaved) */
            for (int r = 0; r < 16; r++)
                for (int n = 0; n < 8; n++) p.d[r][n] += A[k][r] * B[k][n];
        p.gen = gen;
        p.epoch = emu_fiber_epoch();
    }
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 4; e++) c[e] += p.d[g + 8 * (e >> 1)][2 * t + (e & 1)];
}

/* two floats -> one bf16x2 register, `lo` in the low half */
static inline uint32_t ptx_pack_bf16x2(float lo, float hi) {
    return emu_pack2(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi));
}

/* ---- the Hopper-only pieces: never run here ---- */

static inline void emu_ptx_hopper(const char *what) {
    fprintf(stderr, "emu cuda_ptx: %s reached: a wgmma / TMA pass ran in the host emulation, which runs only the "
                    "mma.sync passes (tests/cuda/gdn_emu/gdn_emu_rt.cpp turns the wgmma switches off)\n", what);
    abort();
}
static inline uint32_t ptx_smem_addr(const void *) { emu_ptx_hopper("ptx_smem_addr"); return 0; }
static inline void ptx_stmatrix_x4_trans(uint32_t, const uint32_t (&)[4]) { emu_ptx_hopper("stmatrix"); }
static inline uint64_t ptx_gdesc(uint32_t, uint32_t, uint32_t) { emu_ptx_hopper("ptx_gdesc"); return 0; }
static inline void ptx_wg_fence(void) { emu_ptx_hopper("wgmma.fence"); }
static inline void ptx_wg_commit(void) { emu_ptx_hopper("wgmma.commit_group"); }
template <int N> static inline void ptx_wg_wait(void) { emu_ptx_hopper("wgmma.wait_group"); }
static inline void ptx_reg_fence(float &) { emu_ptx_hopper("ptx_reg_fence"); }
static inline void ptx_reg_fence(uint32_t &) { emu_ptx_hopper("ptx_reg_fence"); }
template <int TA = 0, int TB = 0> static inline void ptx_wgmma_ss_n64(float (&)[32], uint64_t, uint64_t, int) {
    emu_ptx_hopper("wgmma m64n64k16");
}
template <int TA = 0, int TB = 0> static inline void ptx_wgmma_ss_n128(float (&)[64], uint64_t, uint64_t, int) {
    emu_ptx_hopper("wgmma m64n128k16");
}
template <int TA = 0, int TB = 0> static inline void ptx_wgmma_ss_n32(float (&)[16], uint64_t, uint64_t, int) {
    emu_ptx_hopper("wgmma m64n32k16");
}
template <int TB = 1>
static inline void ptx_wgmma_rs_n64(float (&)[32], const uint32_t (&)[4], uint64_t, int = 1) {
    emu_ptx_hopper("wgmma m64n64k16 (A in registers)");
}
template <int TB = 1>
static inline void ptx_wgmma_rs_n128(float (&)[64], const uint32_t (&)[4], uint64_t, int = 1) {
    emu_ptx_hopper("wgmma m64n128k16 (A in registers)");
}
template <int TB = 1>
static inline void ptx_wgmma_rs_n256(float (&)[128], const uint32_t (&)[4], uint64_t, int = 1) {
    emu_ptx_hopper("wgmma m64n256k16 (A in registers)");
}
static inline void ptx_mbar_init_fence(void) { emu_ptx_hopper("fence.mbarrier_init"); }
static inline void ptx_mbar_init(uint32_t, uint32_t) { emu_ptx_hopper("mbarrier.init"); }
static inline void ptx_mbar_arrive(uint32_t) { emu_ptx_hopper("mbarrier.arrive"); }
static inline void ptx_mbar_arrive_tx(uint32_t, uint32_t) { emu_ptx_hopper("mbarrier.arrive.expect_tx"); }
static inline void ptx_mbar_wait(uint32_t, uint32_t) { emu_ptx_hopper("mbarrier.try_wait"); }
static inline void ptx_tma_load_2d(uint32_t, const void *, int, int, uint32_t) { emu_ptx_hopper("TMA load"); }
static inline void ptx_bar_sync(int, int) { emu_ptx_hopper("bar.sync (named)"); }
static inline void ptx_fence_proxy_async(void) { emu_ptx_hopper("fence.proxy.async"); }
static inline void ptx_tma_reduce_add_2d(const void *, int, int, uint32_t) { emu_ptx_hopper("TMA reduce-add"); }
static inline void ptx_tma_store_2d(const void *, int, int, uint32_t) { emu_ptx_hopper("TMA store"); }
static inline void ptx_bulk_commit(void) { emu_ptx_hopper("cp.async.bulk.commit_group"); }
template <int N> static inline void ptx_bulk_wait_read(void) { emu_ptx_hopper("cp.async.bulk.wait_group.read"); }
template <int N> static inline void ptx_bulk_wait(void) { emu_ptx_hopper("cp.async.bulk.wait_group"); }
static inline void ptx_fence_proxy_async_global(void) { emu_ptx_hopper("fence.proxy.async.global"); }
static inline uint32_t ptx_ld_acquire(const uint32_t *) { emu_ptx_hopper("ld.acquire"); return 0; }
static inline void ptx_st_release(uint32_t *, uint32_t) { emu_ptx_hopper("st.release"); }
static inline void ptx_red_add2(float *, float, float) { emu_ptx_hopper("red.global.add"); }
static inline float ptx_ex2_ftz(float) { emu_ptx_hopper("ex2.approx.ftz"); return 0.0f; }
template <int R> static inline void ptx_setmaxnreg_inc(void) { emu_ptx_hopper("setmaxnreg.inc"); }
template <int R> static inline void ptx_setmaxnreg_dec(void) { emu_ptx_hopper("setmaxnreg.dec"); }
