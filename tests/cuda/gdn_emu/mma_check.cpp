/* mma_check.cpp (gdn_emu) — the emulated tensor-core PTX of inc/cuda_ptx.h against plain arithmetic, for every
 * variant the GDN mma.sync kernels use. One block of two warps per case, tiles in the emulation's shared memory:
 *   ldmatrix x4 / x4.trans   four 8x8 matrices of distinct bf16 bit patterns, row addresses by lane as the PTX ISA
 *                            gives them: every lane's four registers must hold exactly its elements (bitwise)
 *   mma m16n8k16             fragments packed by hand in the PTX ISA layout (not through ldmatrix), C += A B from
 *                            a nonzero C, against the double GEMM
 *   gdn_warp_mma             the real kernels/cuda/cuda_gdn_mma.h (copied by oracle_build.sh as ptx_gdn_mma.h)
 *                            over the emulated ldmatrix and mma, the four transpose combinations, two m tiles per
 *                            warp, from a nonzero accumulator, against the double GEMM; and bitwise equal to the
 *                            direct gdn_warp_mma the emulated kernels use (tests/cuda/kda_emu/inc/cuda_gdn_mma.h)
 *   gdn_warp_mma_hilo        kernels/cuda/gdn/state_pass.cuh (the mma.sync state passes' product A (Bhi + Blo))
 *                            at the widths the passes take (NT 2, 4, 8; KD 64, 128), against the double GEMM
 * A fragment mapped to the wrong element, lane or register, or a transposition the wrong way round, fails. GEMM
 * bound: 1e-5 of the row's magnitude (fp32 sums of exact products). Prints one "...: ok" line per check; exit 1 on a
 * failure. Built by oracle_build.sh, run by tests/test_cuda_gdn_emu.py. */
#include "cuda_common.h"
#include "cuda_ptx.h" /* the emulated PTX, and the direct warp GEMM of the kernels (global names) */
#include "emu_gemm_ref.h"
#include "common.cuh"
#include "state_pass.cuh"
/* the real header in namespace ptx: its includes are in already, its functions call the emulated ptx_* */
#undef RS_CUDA_GDN_MMA_H
#undef GDN_DEV
namespace ptx {
#include "ptx_gdn_mma.h"
}

/* the direct warp GEMM the emulated kernels use: C (rows 16 MT w.., N columns) from an accumulator of ones */
template <int MT, int NT, bool AT, bool BT, int KD>
static void direct_mma(float *C, int N, const bf16 *sA, int lda, const bf16 *sB, int ldb) {
    const int w = threadIdx.x / 32;
    float acc[MT][NT][4];
    for (int mi = 0; mi < MT; mi++)
        for (int ni = 0; ni < NT; ni++)
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 1.0f;
    gdn_warp_mma<MT, NT, AT, BT, KD>(acc, sA, lda, sB, ldb, 16 * MT * w, 0);
    for (int mi = 0; mi < MT; mi++)
        for (int ni = 0; ni < NT; ni++)
            for (int e = 0; e < 4; e++)
                C[(16 * MT * w + 16 * mi + gdn_frag_row(e)) * N + ni * 8 + gdn_frag_col(e)] = acc[mi][ni][e];
}

static int g_ok = 1;
static void report(const char *what, double worst, double bound) {
    const int ok = worst <= bound;
    printf("%s: worst error %.3e (bound %.0e): %s\n", what, worst, bound, ok ? "ok" : "FAIL");
    g_ok &= ok;
}
static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffff) / 32768.0f - 1.0f;
}
static bf16 brand(uint64_t *s) { return __float2bfloat16(frand(s)); }
static float f(bf16 b) { return __bfloat162float(b); }

/* ---- ldmatrix: matrix i at rows 8 (i % 2), cols 8 (i / 2) of a 16 x 16 tile (row stride 24) ---- */

template <bool TRANS> static void ldm_kernel(uint32_t *out /* (32 lanes, 4) */, const bf16 *tile) {
    bf16 *s = (bf16 *)kda_smem;
    if (threadIdx.x < 32)
        for (int i = threadIdx.x; i < 16 * 24; i += 32) s[i] = tile[i];
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int l = threadIdx.x, i = l / 8, j = l % 8;
    uint32_t r[4];
    const bf16 *row = s + (8 * (i % 2) + j) * 24 + 8 * (i / 2);
    if (TRANS) ptx_ldmatrix_x4_trans(r, row);
    else ptx_ldmatrix_x4(r, row);
    for (int k = 0; k < 4; k++) out[l * 4 + k] = r[k];
}

template <bool TRANS> static void ldm_case(void) {
    static bf16 tile[16 * 24];
    static uint32_t out[32 * 4];
    for (int i = 0; i < 16 * 24; i++) tile[i].x = (uint16_t)(0x3c00 + i); /* distinct, finite */
    emu_launch(ldm_kernel<TRANS>, emu_cfg(dim3(1), dim3(64), 0), out, (const bf16 *)tile);
    int bad = 0;
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
            const int g = l / 4, t = l % 4, r0 = 8 * (i % 2), c0 = 8 * (i / 2);
            /* lane l's pair of matrix i: (row g, cols 2t, 2t + 1), or transposed (rows 2t, 2t + 1, col g) */
            const int ra = TRANS ? 2 * t : g, ca = TRANS ? g : 2 * t, rb = TRANS ? 2 * t + 1 : g,
                      cb = TRANS ? g : 2 * t + 1;
            const uint32_t want = (uint32_t)tile[(r0 + ra) * 24 + c0 + ca].x |
                                  (uint32_t)tile[(r0 + rb) * 24 + c0 + cb].x << 16;
            bad += out[l * 4 + i] != want;
        }
    printf("ldmatrix x4%s: %d of 128 registers differ from the PTX layout: %s\n", TRANS ? ".trans" : "", bad,
           bad ? "FAIL" : "ok");
    g_ok &= bad == 0;
}

/* ---- mma.sync m16n8k16 from hand-packed fragments: warp w multiplies A_w (16 x 16) by B (16 x 8) ---- */

static uint32_t pk(bf16 lo, bf16 hi) { return (uint32_t)lo.x | (uint32_t)hi.x << 16; }

static void mma_kernel(float *C /* (32, 8) */, const bf16 *A /* (32, 16) */, const bf16 *B /* (16, 8) */) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    const bf16 *a0 = A + (16 * w) * 16;
    const uint32_t a[4] = {pk(a0[g * 16 + 2 * t], a0[g * 16 + 2 * t + 1]),
                           pk(a0[(g + 8) * 16 + 2 * t], a0[(g + 8) * 16 + 2 * t + 1]),
                           pk(a0[g * 16 + 2 * t + 8], a0[g * 16 + 2 * t + 9]),
                           pk(a0[(g + 8) * 16 + 2 * t + 8], a0[(g + 8) * 16 + 2 * t + 9])};
    const uint32_t b0 = pk(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
    const uint32_t b1 = pk(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
    float c[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    ptx_mma_bf16_16816(c, a, b0, b1);
    for (int e = 0; e < 4; e++) C[(16 * w + g + (e >> 1) * 8) * 8 + 2 * t + (e & 1)] = c[e];
}

static void mma_case(void) {
    static bf16 A[32 * 16], B[16 * 8];
    static float C[32 * 8];
    uint64_t s = 77;
    for (int i = 0; i < 32 * 16; i++) A[i] = brand(&s);
    for (int i = 0; i < 16 * 8; i++) B[i] = brand(&s);
    emu_launch(mma_kernel, emu_cfg(dim3(1), dim3(64), 0), C, (const bf16 *)A, (const bf16 *)B);
    const double worst = emu_gemm_worst(C, 32, 8, 16, 1.0, [](int i, int k) { return f(A[i * 16 + k]); },
                                        [](int k, int j) { return f(B[k * 8 + j]); });
    report("mma m16n8k16 (hand-packed PTX fragments)", worst, 1e-5);
}

/* ---- gdn_warp_mma (real header over the emulated PTX): M = 64 (2 warps x MT 2), N = 32, K = 48 ---- */

enum { WM = 64, WN = 32, WK = 48, PAD = 8 };

template <bool AT, bool BT>
static void wmma_kernel(float *C /* (WM, WN) */, float *Cd /* the direct one's */, const bf16 *A, const bf16 *B) {
    bf16 *sA, *sB;
    int lda, ldb;
    emu_gemm_tiles<AT, BT>(A, B, WM, WN, WK, PAD, &sA, &lda, &sB, &ldb);
    const int w = threadIdx.x / 32;
    float acc[2][WN / 8][4];
    for (int mi = 0; mi < 2; mi++)
        for (int ni = 0; ni < WN / 8; ni++)
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 1.0f;
    ptx::gdn_warp_mma<2, WN / 8, AT, BT, WK>(acc, sA, lda, sB, ldb, 32 * w, 0);
    for (int mi = 0; mi < 2; mi++)
        for (int ni = 0; ni < WN / 8; ni++)
            for (int e = 0; e < 4; e++)
                C[(32 * w + 16 * mi + gdn_frag_row(e)) * WN + ni * 8 + gdn_frag_col(e)] = acc[mi][ni][e];
    direct_mma<2, WN / 8, AT, BT, WK>(Cd, WN, sA, lda, sB, ldb);
}

template <bool AT, bool BT> static void wmma_case(void) {
    static bf16 A[WM * WK], B[WK * WN];
    static float a[WM][WK], b[WK][WN], C[WM * WN], Cd[WM * WN];
    uint64_t s = 1234 + 2 * AT + BT;
    for (int i = 0; i < WM; i++)
        for (int k = 0; k < WK; k++) {
            const bf16 x = brand(&s);
            a[i][k] = f(x);
            A[AT ? k * WM + i : i * WK + k] = x;
        }
    for (int k = 0; k < WK; k++)
        for (int j = 0; j < WN; j++) {
            const bf16 x = brand(&s);
            b[k][j] = f(x);
            B[BT ? j * WK + k : k * WN + j] = x;
        }
    for (int i = 0; i < WM * WN; i++) C[i] = Cd[i] = NAN;
    emu_launch(wmma_kernel<AT, BT>, emu_cfg(dim3(1), dim3(64), 0), C, Cd, (const bf16 *)A, (const bf16 *)B);
    const double worst = emu_gemm_worst(C, WM, WN, WK, 1.0, [](int i, int k) { return a[i][k]; },
                                        [](int k, int j) { return b[k][j]; });
    char what[96];
    snprintf(what, sizeof what, "gdn_warp_mma AT=%d BT=%d (ldmatrix + mma)", (int)AT, (int)BT);
    report(what, worst, 1e-5);
    const int same = memcmp(C, Cd, sizeof C) == 0;
    printf("gdn_warp_mma AT=%d BT=%d: the direct stand-in bitwise the PTX one: %s\n", (int)AT, (int)BT,
           same ? "ok" : "FAIL");
    g_ok &= same;
}

/* ---- gdn_warp_mma_hilo: M = 32 (2 warps), N = 8 NT, K = KD; A (M, K), Bhi / Blo (K, N) row-major ---- */

template <int NT, int KD>
static void hilo_kernel(float *C /* (32, 8 NT) */, const bf16 *A, const bf16 *Bh, const bf16 *Bl) {
    constexpr int N = 8 * NT, lda = KD + 8, ldb = N + 8;
    bf16 *sA = (bf16 *)kda_smem, *sBh = sA + 32 * lda, *sBl = sBh + KD * ldb;
    for (int i = threadIdx.x; i < 32 * KD; i += blockDim.x) sA[(i / KD) * lda + i % KD] = A[i];
    for (int i = threadIdx.x; i < KD * N; i += blockDim.x) {
        sBh[(i / N) * ldb + i % N] = Bh[i];
        sBl[(i / N) * ldb + i % N] = Bl[i];
    }
    __syncthreads();
    const int w = threadIdx.x / 32;
    float acc[1][NT][4];
    gdn_warp_mma_hilo<NT, KD>(acc, sA, lda, sBh, sBl, ldb, 16 * w);
    for (int ni = 0; ni < NT; ni++)
        for (int e = 0; e < 4; e++) C[(16 * w + gdn_frag_row(e)) * N + ni * 8 + gdn_frag_col(e)] = acc[0][ni][e];
}

template <int NT, int KD> static void hilo_case(void) {
    constexpr int N = 8 * NT;
    static bf16 A[32 * KD], Bh[KD * N], Bl[KD * N];
    static float C[32 * N];
    uint64_t s = 99 + NT + KD;
    for (int i = 0; i < 32 * KD; i++) A[i] = brand(&s);
    for (int i = 0; i < KD * N; i++) { /* a split fp32 value: hi its bf16, lo the bf16 of the rest */
        const float x = frand(&s);
        Bh[i] = __float2bfloat16(x);
        Bl[i] = __float2bfloat16(x - f(Bh[i]));
    }
    for (int i = 0; i < 32 * N; i++) C[i] = NAN;
    emu_launch(hilo_kernel<NT, KD>, emu_cfg(dim3(1), dim3(64), 0), C, (const bf16 *)A, (const bf16 *)Bh,
               (const bf16 *)Bl);
    const double worst = emu_gemm_worst(C, 32, N, KD, 0.0, [](int i, int k) { return f(A[i * KD + k]); },
                                        [](int k, int j) { return (double)f(Bh[k * N + j]) + f(Bl[k * N + j]); });
    char what[96];
    snprintf(what, sizeof what, "gdn_warp_mma_hilo NT=%d KD=%d (ldmatrix + ldmatrix.trans + mma)", NT, KD);
    report(what, worst, 1e-5);
}

int main() {
    ldm_case<false>();
    ldm_case<true>();
    mma_case();
    wmma_case<false, false>();
    wmma_case<false, true>();
    wmma_case<true, false>();
    wmma_case<true, true>();
    hilo_case<2, 64>();
    hilo_case<4, 128>();
    hilo_case<8, 64>();
    hilo_case<8, 128>();
    return g_ok ? 0 : 1;
}
