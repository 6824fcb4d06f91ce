/* emu_conv.cpp (glue_emu) — cuda_conv.cu's run kernels (Kc = 4) under the host emulation against the cpu oracle
 * (kernels/cpu/cpu_conv.c): odd channel counts (the scalar path), 8-byte rows that are not 16-byte rows, blocks
 * that start 8 bytes into a row, the step's 6144 channels in rows of 8224, halo read or not, its gradient wanted
 * or not, documents (a start every ~20 tokens, the first document begun before the call). The launch shapes are
 * cuda_conv1d_silu_forward's / _backward's (copied: the host code is not emulated). Prints ok / FAIL lines; exit
 * status 1 on any FAIL. */
#include <random>

#include "emu.h"
EMU_GLOBALS
#include "conv.inc"

extern "C" {
void cpu_conv1d_silu_forward(void *out, const void *inp, const void *halo, const void *w, const int32_t *doc_pos,
                             int64_t T, int C, int Kc, int ldi, int ldo);
void cpu_conv1d_silu_backward(void *dinp, void *dhalo, float *dw, const void *dout, const void *inp, const void *halo,
                              const void *w, const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo);
}

static const bf16 POISON = {0x7fc0};

static void conv_case(int64_t T, int C, int ldi_extra, int ldo_extra, int pad, int use_halo, int want_dhalo, int dp0) {
    const int Kc = 4, ldi = C + ldi_extra, ldo = C + ldo_extra;
    char what[160];
    std::mt19937 rng(42 + (unsigned)T);
    std::normal_distribution<float> nd(0, 1);
    std::uniform_real_distribution<float> ud(0, 1);
    auto rb = [&](float s) { return bf2f(f2bf(nd(rng) * s)); };
    std::vector<bf16> x(T * ldi + pad + 8), g(T * ldo + pad + 8), y(T * ldo + pad + 8, POISON), di(T * ldi + pad + 8, POISON);
    std::vector<float> xf(T * ldi), gf(T * ldo), w((size_t)C * Kc), halo((Kc - 1) * C), dw0((size_t)C * Kc);
    for (int64_t i = 0; i < T * ldi; i++) xf[i] = rb(1), x[pad + i] = f2bf(xf[i]);
    for (int64_t i = 0; i < T * ldo; i++) gf[i] = rb(1), g[pad + i] = f2bf(gf[i]);
    std::vector<bf16> wb(C * Kc), hb((Kc - 1) * C), dhb((Kc - 1) * C + 1, POISON);
    for (int i = 0; i < C * Kc; i++) w[i] = rb(0.5), wb[i] = f2bf(w[i]), dw0[i] = nd(rng) * 0.1f;
    for (int i = 0; i < (Kc - 1) * C; i++) halo[i] = rb(1), hb[i] = f2bf(halo[i]);
    std::vector<int32_t> dp(T);
    for (int64_t t = 0; t < T; t++) dp[t] = t == 0 ? dp0 : (ud(rng) < 0.05 ? 0 : dp[t - 1] + 1);
    const bf16 *hp = use_halo ? hb.data() : nullptr;
    bf16 *dhp = want_dhalo ? dhb.data() : nullptr;
    auto ok8 = [](const void *p) { return ((uintptr_t)p % 8) == 0; };
    const bool v4 = ok8(y.data() + pad) && ok8(x.data() + pad) && ok8(di.data() + pad) && ok8(g.data() + pad) &&
                    C % 4 == 0 && ldi % 4 == 0 && ldo % 4 == 0;
    int err = 0;
    printf("-- T %lld C %d ldi %d ldo %d pad %d halo %d dhalo %d doc_pos[0] %d (8-byte path %d)\n", (long long)T, C, ldi,
           ldo, pad, use_halo, want_dhalo, dp0, (int)v4);

    /* forward: cuda_conv1d_silu_forward's run-kernel launch */
    const dim3 grid = emu_dim((unsigned)emu_cdiv(emu_cdiv(C, CONV_CV), CONV_RUN_LANES),
                              (unsigned)emu_cdiv(T, (int64_t)CONV_RUN_ROWS * CONV_RUN_FWD));
    emu_launch(grid, emu_dim(CONV_RUN_LANES, CONV_RUN_ROWS), [&] {
        conv_run_forward_kernel<4>(y.data() + pad, x.data() + pad, hp, wb.data(), dp.data(), T, CONV_RUN_FWD, C, ldi,
                                   ldo, &err, v4);
    });
    std::vector<float> yc(T * ldo, NAN), a, b;
    cpu_conv1d_silu_forward(yc.data(), xf.data(), use_halo ? halo.data() : nullptr, w.data(), dp.data(), T, C, Kc, ldi,
                            ldo);
    int outside = 0;
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < ldo; c++)
            if (c < C) a.push_back(bf2f(y[pad + t * ldo + c])), b.push_back(yc[t * ldo + c]);
            else outside += y[pad + t * ldo + c].x != POISON.x;
    snprintf(what, sizeof what, "conv fwd T %lld C %d", (long long)T, C);
    emu_check(what, emu_rel(a, b), EMU_BF16);
    emu_check("conv fwd: writes outside the block", outside, 0);

    /* backward: cuda_conv1d_silu_backward's run-kernel launch, partials added by the stage-2 kernel */
    int64_t gy = ((int64_t)CONV_PART_BYTES) / ((int64_t)C * Kc * 4);
    gy = gy < 1 ? 1 : gy > CUDA_MAX_PARTIALS ? CUDA_MAX_PARTIALS : gy;
    const int64_t gmr = emu_cdiv(T, (int64_t)CONV_RUN_ROWS * CONV_RUN_BWD_MIN);
    if (gy > gmr) gy = gmr;
    const int64_t run = emu_cdiv(T, gy * CONV_RUN_ROWS);
    gy = emu_cdiv(T, run * CONV_RUN_ROWS);
    std::vector<float> part(gy * C * Kc, NAN), dw = dw0;
    emu_launch(emu_dim(grid.x, (unsigned)gy), emu_dim(CONV_RUN_LANES, CONV_RUN_ROWS), [&] {
        conv_run_backward_kernel<4>(di.data() + pad, dhp, part.data(), g.data() + pad, x.data() + pad, hp, wb.data(),
                                    dp.data(), (int)T, (int)run, C, ldi, ldo, &err, v4);
    });
    emu_launch(emu_dim((unsigned)emu_cdiv(C * Kc, CUDA_WARP)), emu_dim(CUDA_WARP * CUDA_PARTIALS_WARPS),
               [&] { cuda_partials_add_kernel(dw.data(), part.data(), (int)gy, (int64_t)C * Kc); });
    std::vector<float> dic(T * ldi, NAN), dhc((Kc - 1) * C + 1, NAN), dwc = dw0;
    cpu_conv1d_silu_backward(dic.data(), want_dhalo ? dhc.data() : nullptr, dwc.data(), gf.data(), xf.data(),
                             use_halo ? halo.data() : nullptr, w.data(), dp.data(), T, C, Kc, ldi, ldo);
    a.clear(), b.clear(), outside = 0;
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < ldi; c++)
            if (c < C) a.push_back(bf2f(di[pad + t * ldi + c])), b.push_back(dic[t * ldi + c]);
            else outside += di[pad + t * ldi + c].x != POISON.x;
    snprintf(what, sizeof what, "conv bwd dinp T %lld C %d (%lld blocks of runs of %lld)", (long long)T, C,
             (long long)gy, (long long)run);
    emu_check(what, emu_rel(a, b), EMU_BF16);
    emu_check("conv bwd: writes outside the block", outside, 0);
    if (want_dhalo) {
        a.clear(), b.clear();
        for (int i = 0; i < (Kc - 1) * C; i++) a.push_back(bf2f(dhb[i])), b.push_back(dhc[i]);
        emu_check("conv bwd dhalo", emu_rel(a, b), EMU_BF16);
        emu_check("conv bwd: a write past the halo rows", dhb[(Kc - 1) * C].x != POISON.x, 0);
    }
    emu_check("conv bwd dw +=", emu_rel(dw, dwc), EMU_F32);
    emu_check("conv: input errors raised", err, 0);
}

int main() {
    conv_case(7, 37, 3, 5, 3, 1, 1, 9);          /* odd sizes, mid-vector: the scalar path; halo and its gradient */
    conv_case(130, 512, 288, 0, 0, 1, 1, 2);     /* [q|k|v] inside a projection row; a document starts in row 2 */
    conv_case(300, 6, 2, 0, 0, 1, 1, 0);         /* a 2-channel group */
    conv_case(97, 1028, 4, 12, 0, 0, 1, 1);      /* 8-byte rows that are not 16-byte rows; one live lane */
    conv_case(40, 64, 0, 0, 4, 1, 0, 2);         /* 8 bytes into a row */
    conv_case(333, 64, 0, 8, 8, 0, 1, 40);       /* halo NULL, dhalo wanted */
    conv_case(1, 8, 0, 0, 0, 0, 0, 0);           /* one token */
    conv_case(300, 6144, 2080, 0, 0, 1, 1, 5000); /* the step's channels in its rows; two blocks of runs */
    printf("%s\n", emu_failures ? "glue_emu conv: FAIL" : "glue_emu conv: ok");
    return emu_failures != 0;
}
