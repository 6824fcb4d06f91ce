/* mma_check.cpp (kda_emu) — the emulated gdn_warp_mma (inc/cuda_gdn_mma.h) against a plain GEMM: for each of the
 * four transpose combinations (AT, BT), two warps multiply a 32 x 48 A by a 48 x 32 B held in shared memory as the
 * kernels hold them (row-major bf16, rows padded by 8; AT / BT: the transpose stored), write their accumulators at
 * gdn_frag_row / gdn_frag_col, and the result must equal the double GEMM of the same bf16 values within fp32
 * rounding (1e-5 of the row's magnitude), starting from a nonzero accumulator (acc += A B). A fragment mapped to the
 * wrong element or a transpose read the wrong way round fails. Prints "mma AT=x BT=y: ok" per case; exit 1 on a
 * failure. `mma_check deadlock` instead launches a block whose second warp skips a __syncthreads the first waits at:
 * the emulation must stop it with a deadlock message (exit by abort), not hang or pass. Built and run by build.sh /
 * tests/test_cuda_kda_emu.py. */
#include "cuda_common.h"
#include "cuda_gdn_mma.h"
#include "emu_gemm_ref.h"

enum { M = 32, N = 32, K = 48, PAD = 8 };

template <bool AT, bool BT>
static void mma_kernel(float *C /* (M, N) */, const bf16 *A /* stored, see below */, const bf16 *B) {
    /* A stored (M, K) or, AT, (K, M); B stored (K, N) or, BT, (N, K); copied into padded shared tiles */
    bf16 *sA, *sB;
    int lda, ldb;
    emu_gemm_tiles<AT, BT>(A, B, M, N, K, PAD, &sA, &lda, &sB, &ldb);
    const int w = threadIdx.x / 32;
    float acc[1][N / 8][4];
    for (int ni = 0; ni < N / 8; ni++)
        for (int e = 0; e < 4; e++) acc[0][ni][e] = 1.0f; /* acc += A B */
    gdn_warp_mma<1, N / 8, AT, BT, K>(acc, sA, lda, sB, ldb, 16 * w, 0);
    for (int ni = 0; ni < N / 8; ni++)
        for (int e = 0; e < 4; e++) C[(16 * w + gdn_frag_row(e)) * N + ni * 8 + gdn_frag_col(e)] = acc[0][ni][e];
}

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffff) / 32768.0f - 1.0f;
}

template <bool AT, bool BT> static int mma_case(void) {
    static bf16 A[M * K], B[K * N];
    static float a[M][K], b[K][N], C[M * N];
    uint64_t s = 1234 + 2 * AT + BT;
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            const bf16 x = __float2bfloat16(frand(&s));
            a[i][k] = __bfloat162float(x);
            A[AT ? k * M + i : i * K + k] = x;
        }
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) {
            const bf16 x = __float2bfloat16(frand(&s));
            b[k][j] = __bfloat162float(x);
            B[BT ? j * K + k : k * N + j] = x;
        }
    for (int i = 0; i < M * N; i++) C[i] = NAN;
    emu_launch(mma_kernel<AT, BT>, emu_cfg(dim3(1), dim3(64), 0), C, (const bf16 *)A, (const bf16 *)B);
    const double worst = emu_gemm_worst(C, M, N, K, 1.0, [](int i, int k) { return a[i][k]; },
                                        [](int k, int j) { return b[k][j]; });
    const int ok = worst < 1e-5;
    printf("mma AT=%d BT=%d: worst error %.3e of the row magnitude: %s\n", (int)AT, (int)BT, worst, ok ? "ok" : "FAIL");
    return ok;
}

/* warp 0 waits at a block barrier that warp 1 never reaches (undefined on the device) */
static void deadlock_kernel(float *out /* (64) */) {
    out[threadIdx.x] = 1.0f;
    if (threadIdx.x < 32) __syncthreads();
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "deadlock") == 0) {
        static float out[64];
        emu_launch(deadlock_kernel, emu_cfg(dim3(1), dim3(64), 0), out);
        printf("deadlock: the launch returned\n");
        return 0;
    }
    int ok = mma_case<false, false>();
    ok &= mma_case<false, true>();
    ok &= mma_case<true, false>();
    ok &= mma_case<true, true>();
    return ok ? 0 : 1;
}
