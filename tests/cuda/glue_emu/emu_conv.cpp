/* emu_conv.cpp (glue_emu) — cuda_conv.cu's run kernels (Kc = 4) and cuda_gdn_conv_split.cu's fused GDN conv + split
 * (split_case below) under the host emulation against the cpu oracle
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
void cpu_gdn_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *conv, const void *zin, int64_t T,
                           int nk, int dk, int Vd, int ldc, int ldz);
void cpu_gdn_split_backward(void *dconv, void *dzout, const void *dqk, const void *qk, const float *qk_rstd,
                            const void *dv, const void *dz, int64_t T, int nk, int dk, int Vd, int ldc, int ldz);
void cpu_gdn_conv_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *proj, const void *halo,
                                const void *w, const int32_t *doc_pos, int64_t T, int nk, int dk, int Vd, int Kc,
                                int ldp);
void cpu_gdn_conv_split_backward(void *dproj, void *dhalo, float *dw, const void *dqk, const void *qk,
                                 const float *qk_rstd, const void *dv, const void *dz, const void *proj,
                                 const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk, int dk,
                                 int Vd, int Kc, int ldp);
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
    int64_t run = 0;
    const int64_t gy = emu_conv_bwd_grid(T, C, Kc, CONV_PART_BYTES, CUDA_MAX_PARTIALS, CONV_RUN_ROWS, CONV_RUN_BWD_MIN, &run);
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


/* the fused GDN conv + split (conv_split_forward/backward_kernel, cuda_gdn_conv_split_*'s launch shapes,
 * copied) against two oracles: cpu_gdn_conv_split_* (fp32 throughout: the kernel's bf16 conv output and
 * dconv add a rounding, so its bf16 outputs get CT_BOUND_BF16_TWICE, rstd and dw CT_BOUND_BF16_OUT), and the
 * cpu conv and split with their intermediate rounded to bf16 as the unfused cuda pair stores it (the same
 * values up to the order of a head's sum and the form of the sigmoid: rstd at CT_BOUND_F32, v and dw within
 * 1e-4 and 2e-4, a bf16 ulp of the conv output or dconv flipping now and then). proj rows are [q|k|v|z|gates] (ldp > Cc + Vd: the gates' columns must stay
 * untouched), documents start with probability `rate` per token, the first one doc_pos[0] = dp0 tokens
 * before the call; `pad` elements of offset take the scalar path when odd. Where the rows are 8-byte vectors
 * (the FULL groups run there) both kernels run again on the general path (vec false) and must give the same
 * bits: a change to a FULL group that the oracles' bounds would let pass fails here. */
static void split_case(int64_t T, int nk, int dk, int Vd, int gates, int pad, int use_halo, int want_dhalo, int dp0,
                       float rate) {
    const int Kc = 4, Kd2 = 2 * nk * dk, C = Kd2 + Vd, ldp = C + Vd + gates, nqk = 2 * nk;
    char what[200];
    std::mt19937 rng(7 + (unsigned)T + (unsigned)C);
    std::normal_distribution<float> nd(0, 1);
    std::uniform_real_distribution<float> ud(0, 1);
    auto rb = [&](float s) { return bf2f(f2bf(nd(rng) * s)); };
    auto round_all = [](std::vector<float> &x) { for (float &f : x) f = bf2f(f2bf(f)); };
    const size_t extra = pad + 8;
    std::vector<float> pf(T * ldp), w((size_t)C * Kc), halo((Kc - 1) * C), dw0((size_t)C * Kc);
    std::vector<bf16> pb(T * ldp + extra), wb((size_t)C * Kc), hb((Kc - 1) * C + extra);
    for (int64_t i = 0; i < T * ldp; i++) pf[i] = rb(1), pb[pad + i] = f2bf(pf[i]);
    for (int i = 0; i < C * Kc; i++) w[i] = rb(0.5), wb[i] = f2bf(w[i]), dw0[i] = nd(rng) * 0.1f;
    for (int i = 0; i < (Kc - 1) * C; i++) halo[i] = rb(1), hb[pad + i] = f2bf(halo[i]);
    std::vector<int32_t> dp(T);
    for (int64_t t = 0; t < T; t++) dp[t] = t == 0 ? dp0 : (ud(rng) < rate ? 0 : dp[t - 1] + 1);
    const bf16 *hp = use_halo ? hb.data() + pad : nullptr;
    const float *hf = use_halo ? halo.data() : nullptr;
    std::vector<bf16> qk(T * Kd2 + extra, POISON), v(T * Vd + extra, POISON), z(T * Vd + extra, POISON);
    std::vector<float> rstd(T * nqk + 1, NAN);
    auto ok8 = [](const void *p) { return ((uintptr_t)p % 8) == 0; };
    const bool v4 = ok8(pb.data() + pad) && ok8(qk.data() + pad) && ok8(v.data() + pad) && ok8(z.data() + pad) &&
                    ok8(hb.data() + pad) && Vd % 4 == 0 && ldp % 4 == 0;
    int err = 0;
    printf("-- split: T %lld nk %d dk %d Vd %d ldp %d pad %d halo %d dhalo %d doc_pos[0] %d rate %.2f (8-byte path %d)\n",
           (long long)T, nk, dk, Vd, ldp, pad, use_halo, want_dhalo, dp0, rate, (int)v4);

    /* forward: cuda_gdn_conv_split_forward's launch */
    const unsigned nbc = (unsigned)emu_cdiv(emu_cdiv(C, CONV_CV), CONV_RUN_LANES);
    const unsigned nbz = (unsigned)emu_cdiv(emu_cdiv(Vd, CONV_CV), CONV_RUN_LANES);
    const dim3 grid = emu_dim(nbc + nbz, (unsigned)emu_cdiv(T, (int64_t)CONV_RUN_ROWS * CONV_RUN_FWD));
    auto forward = [&](std::vector<bf16> &qk_, std::vector<float> &rstd_, std::vector<bf16> &v_, std::vector<bf16> &z_,
                       bool vec) {
        emu_launch(grid, emu_dim(CONV_RUN_LANES, CONV_RUN_ROWS), [&] {
            if (dk == 128)
                conv_split_forward_kernel<4, 32>(qk_.data() + pad, rstd_.data(), v_.data() + pad, z_.data() + pad,
                                                 pb.data() + pad, hp, wb.data(), dp.data(), (int)T, CONV_RUN_FWD, Kd2,
                                                 Vd, ldp, nbc, &err, vec);
            else
                conv_split_forward_kernel<4, 16>(qk_.data() + pad, rstd_.data(), v_.data() + pad, z_.data() + pad,
                                                 pb.data() + pad, hp, wb.data(), dp.data(), (int)T, CONV_RUN_FWD, Kd2,
                                                 Vd, ldp, nbc, &err, vec);
        });
    };
    forward(qk, rstd, v, z, v4);
    if (v4) { /* the FULL groups (8-byte rows only) against the general path on the same rows: the same bits */
        std::vector<bf16> qk2(qk.size(), POISON), v2(v.size(), POISON), z2(z.size(), POISON);
        std::vector<float> rstd2(rstd.size(), NAN);
        forward(qk2, rstd2, v2, z2, false);
        emu_check("split fwd: 8-byte rows (FULL groups) bitwise the general path's",
                  emu_bits_differ(qk, qk2) + emu_bits_differ(v, v2) + emu_bits_differ(z, z2) +
                      emu_bits_differ(rstd, rstd2),
                  0);
    }
    std::vector<float> qkc(T * Kd2), rc(T * nqk), vc(T * Vd), zc(T * Vd);
    cpu_gdn_conv_split_forward(qkc.data(), rc.data(), vc.data(), zc.data(), pf.data(), hf, w.data(), dp.data(), T, nk,
                               dk, Vd, Kc, ldp);
    /* the rounded oracle: conv, its output rounded to bf16, split */
    std::vector<float> conv(T * C), qkr(T * Kd2), rr(T * nqk), vr(T * Vd), zr(T * Vd);
    cpu_conv1d_silu_forward(conv.data(), pf.data(), hf, w.data(), dp.data(), T, C, Kc, ldp, C);
    round_all(conv);
    cpu_gdn_split_forward(qkr.data(), rr.data(), vr.data(), zr.data(), conv.data(), pf.data() + C, T, nk, dk, Vd, C,
                          ldp);
    auto gather = [&](const std::vector<bf16> &b, int64_t n) {
        std::vector<float> a(n);
        for (int64_t i = 0; i < n; i++) a[i] = bf2f(b[pad + i]);
        return a;
    };
    auto tail_intact = [&](const std::vector<bf16> &b, int64_t n) {
        int bad = 0;
        for (size_t i = pad + n; i < b.size(); i++) bad += b[i].x != POISON.x;
        for (int i = 0; i < pad; i++) bad += b[i].x != POISON.x;
        return bad;
    };
    const std::vector<float> qkg = gather(qk, T * Kd2), vg = gather(v, T * Vd), zg = gather(z, T * Vd);
    const std::vector<float> rg(rstd.begin(), rstd.begin() + T * nqk);
    snprintf(what, sizeof what, "split fwd qk (fp32 oracle) T %lld C %d", (long long)T, C);
    emu_check(what, emu_rel(qkg, qkc), 1e-2);
    emu_check("split fwd rstd (fp32 oracle)", emu_rel(rg, rc), EMU_BF16);
    emu_check("split fwd v (fp32 oracle)", emu_rel(vg, vc), EMU_BF16);
    emu_check("split fwd z (a copy)", emu_rel(zg, zc), 0);
    emu_check("split fwd qk (rounded oracle)", emu_rel(qkg, qkr), EMU_BF16);
    emu_check("split fwd rstd (rounded oracle)", emu_rel(rg, rr), EMU_F32);
    /* the kernel's silu is u * (1 / (1 + e)), the cpu's u / (1 + e): an fp32 ulp apart now and then, which
     * flips a bf16 rounding once in ~10^5 elements */
    emu_check("split fwd v (rounded oracle)", emu_rel(vg, vr), 1e-4);
    emu_check("split fwd: writes outside qk, v, z, rstd",
              tail_intact(qk, T * Kd2) + tail_intact(v, T * Vd) + tail_intact(z, T * Vd) + (rstd[T * nqk] == rstd[T * nqk] ? 1 : 0), 0);

    /* backward: cuda_gdn_conv_split_backward's launch, from the kernel's own qk, rstd */
    std::vector<float> dqkf(T * Kd2), dvf(T * Vd), dzf(T * Vd);
    std::vector<bf16> dqkb(T * Kd2 + extra), dvb(T * Vd + extra), dzb(T * Vd + extra);
    for (int64_t i = 0; i < T * Kd2; i++) dqkf[i] = rb(1), dqkb[pad + i] = f2bf(dqkf[i]);
    for (int64_t i = 0; i < T * Vd; i++) dvf[i] = rb(1), dvb[pad + i] = f2bf(dvf[i]);
    for (int64_t i = 0; i < T * Vd; i++) dzf[i] = rb(1), dzb[pad + i] = f2bf(dzf[i]);
    std::vector<bf16> dproj(T * ldp + extra, POISON), dhb((Kc - 1) * C + extra, POISON);
    bf16 *dhp = want_dhalo ? dhb.data() + pad : nullptr;
    int64_t run = 0;
    const int64_t gy = emu_conv_bwd_grid(T, C, Kc, CONV_PART_BYTES, CUDA_MAX_PARTIALS, CONV_RUN_ROWS, CONV_RUN_BWD_MIN, &run);
    std::vector<float> part(gy * C * Kc, NAN), dw = dw0;
    const bool v4b = v4 && ok8(dqkb.data() + pad) && ok8(dvb.data() + pad) && ok8(dzb.data() + pad) &&
                     ok8(dproj.data() + pad) && ok8(dhb.data() + pad);
    auto backward = [&](std::vector<bf16> &dproj_, bf16 *dhp_, std::vector<float> &part_, bool vec) {
        emu_launch(emu_dim(nbc + nbz, (unsigned)gy), emu_dim(CONV_RUN_LANES, CONV_RUN_ROWS), [&] {
            if (dk == 128)
                conv_split_backward_kernel<4, 32>(dproj_.data() + pad, dhp_, part_.data(), dqkb.data() + pad,
                                                  qk.data() + pad, rstd.data(), dvb.data() + pad, dzb.data() + pad,
                                                  pb.data() + pad, hp, wb.data(), dp.data(), (int)T, (int)run, Kd2, Vd,
                                                  ldp, nbc, &err, vec);
            else
                conv_split_backward_kernel<4, 16>(dproj_.data() + pad, dhp_, part_.data(), dqkb.data() + pad,
                                                  qk.data() + pad, rstd.data(), dvb.data() + pad, dzb.data() + pad,
                                                  pb.data() + pad, hp, wb.data(), dp.data(), (int)T, (int)run, Kd2, Vd,
                                                  ldp, nbc, &err, vec);
        });
    };
    backward(dproj, dhp, part, v4b);
    if (v4b) { /* the FULL groups against the general path, as in the forward */
        std::vector<bf16> dproj2(dproj.size(), POISON), dhb2(dhb.size(), POISON);
        std::vector<float> part2(part.size(), NAN);
        backward(dproj2, want_dhalo ? dhb2.data() + pad : nullptr, part2, false);
        emu_check("split bwd: 8-byte rows (FULL groups) bitwise the general path's",
                  emu_bits_differ(dproj, dproj2) + emu_bits_differ(dhb, dhb2) + emu_bits_differ(part, part2), 0);
    }
    emu_launch(emu_dim((unsigned)emu_cdiv(C * Kc, CUDA_WARP)), emu_dim(CUDA_WARP * CUDA_PARTIALS_WARPS),
               [&] { cuda_partials_add_kernel(dw.data(), part.data(), (int)gy, (int64_t)C * Kc); });
    /* the oracles' inputs: the kernel's own qk (bf16) and rstd */
    std::vector<float> dpc(T * ldp, 0.0f), dhc((Kc - 1) * C, NAN), dwc = dw0;
    cpu_gdn_conv_split_backward(dpc.data(), want_dhalo ? dhc.data() : nullptr, dwc.data(), dqkf.data(), qkg.data(),
                                rg.data(), dvf.data(), dzf.data(), pf.data(), hf, w.data(), dp.data(), T, nk, dk, Vd, Kc,
                                ldp);
    std::vector<float> dconv(T * C), dpr(T * ldp, 0.0f), dhr((Kc - 1) * C, NAN), dwr = dw0;
    cpu_gdn_split_backward(dconv.data(), dpr.data() + C, dqkf.data(), qkg.data(), rg.data(), dvf.data(), dzf.data(), T,
                           nk, dk, Vd, C, ldp);
    round_all(dconv);
    cpu_conv1d_silu_backward(dpr.data(), want_dhalo ? dhr.data() : nullptr, dwr.data(), dconv.data(), pf.data(), hf,
                             w.data(), dp.data(), T, C, Kc, ldp, C);
    std::vector<float> a, bc, br, za, zb;
    int outside = 0;
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < ldp; c++) {
            const bf16 g = dproj[pad + t * ldp + c];
            if (c < C) a.push_back(bf2f(g)), bc.push_back(dpc[t * ldp + c]), br.push_back(dpr[t * ldp + c]);
            else if (c < C + Vd) za.push_back(bf2f(g)), zb.push_back(dzf[t * Vd + c - C]);
            else outside += g.x != POISON.x;
        }
    outside += tail_intact(dproj, T * ldp);
    snprintf(what, sizeof what, "split bwd dproj q|k|v (fp32 oracle; %lld blocks of runs of %lld)", (long long)gy,
             (long long)run);
    emu_check(what, emu_rel(a, bc), 1e-2);
    emu_check("split bwd dproj q|k|v (rounded oracle)", emu_rel(a, br), EMU_BF16);
    emu_check("split bwd dproj z (a copy of dz)", emu_rel(za, zb), 0);
    emu_check("split bwd: writes outside dproj's q|k|v|z columns", outside, 0);
    if (want_dhalo) {
        std::vector<float> dh;
        for (int i = 0; i < (Kc - 1) * C; i++) dh.push_back(bf2f(dhb[pad + i]));
        emu_check("split bwd dhalo (fp32 oracle)", emu_rel(dh, dhc), 1e-2);
        emu_check("split bwd dhalo (rounded oracle)", emu_rel(dh, dhr), EMU_BF16);
        emu_check("split bwd: a write past the halo rows", tail_intact(dhb, (Kc - 1) * C), 0);
    }
    emu_check("split bwd dw += (fp32 oracle)", emu_rel(dw, dwc), EMU_BF16);
    emu_check("split bwd dw += (rounded oracle)", emu_rel(dw, dwr), 2e-4);
    emu_check("split: input errors raised", err, 0);
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
    split_case(37, 1, 64, 36, 4, 0, 1, 1, 9, 0.05f);      /* a small shape: v and z end inside a warp; halo, dhalo */
    split_case(70, 2, 64, 37, 2, 1, 0, 1, 0, 0.1f);       /* odd Vd, one element into the rows: the scalar path */
    split_case(300, 2, 128, 256, 8, 0, 1, 1, 2, 0.02f);   /* dk 128; T not a multiple of the tile; a doc at row 2 */
    split_case(97, 2, 128, 128, 0, 0, 1, 1, 1000, 0.3f);  /* short documents; halo rows before a long document */
    split_case(1, 1, 64, 8, 0, 0, 1, 1, 0, 0.0f);         /* one token, its own document: the halo unread */
    split_case(300, 16, 128, 2048, 32, 0, 1, 1, 5000, 0.05f); /* the 1B layer: nk 16, dk 128, Vd 2048, rows of 8224 */
    printf("%s\n", emu_failures ? "glue_emu conv: FAIL" : "glue_emu conv: ok");
    return emu_failures != 0;
}
