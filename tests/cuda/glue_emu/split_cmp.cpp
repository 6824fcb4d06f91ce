/*
 * split_cmp.cpp (glue_emu) — the fused GDN conv + split kernels (conv_split_forward/backward_kernel) of a base
 * revision and of the working tree, both run by the host emulation (emu.h) on the same inputs (emu_conv.cpp's
 * split cases: the scalar path, odd Vd, dk 64 and 128, documents, halo and dhalo, the 1B layer's rows), every
 * output compared bitwise: qk, rstd, v, z, dproj (all ldp columns), dhalo, the dw partials and dw. For speed
 * rounds that must keep the bits; the emulation's arithmetic is the host's, the same on both sides: it proves
 * that the two revisions compute the same thing. The tree's backward reads the base's qk and rstd. Built by
 * split_build.sh; exit status 1 on a difference.
 */
#include <random>

#include "split_side.h"
EMU_GLOBALS

extern "C" void split_side_base(SplitBufs *b);
extern "C" void split_side_tree(SplitBufs *b);

static const bf16 POISON = {0x7fc0};

static void split_cmp_case(int64_t T, int nk, int dk, int Vd, int gates, int pad, int use_halo, int want_dhalo,
                           int dp0, float rate) {
    const int Kc = 4, Kd2 = 2 * nk * dk, C = Kd2 + Vd, ldp = C + Vd + gates, nqk = 2 * nk;
    std::mt19937 rng(11 + (unsigned)T + (unsigned)C);
    std::normal_distribution<float> nd(0, 1);
    std::uniform_real_distribution<float> ud(0, 1);
    const size_t extra = pad + 8;
    std::vector<bf16> pb(T * ldp + extra), wb((size_t)C * Kc), hb((Kc - 1) * C + extra);
    std::vector<bf16> dqk(T * Kd2 + extra), dv(T * Vd + extra), dz(T * Vd + extra);
    for (auto &x : pb) x = f2bf(nd(rng));
    for (auto &x : wb) x = f2bf(nd(rng) * 0.5f);
    for (auto &x : hb) x = f2bf(nd(rng));
    for (auto &x : dqk) x = f2bf(nd(rng));
    for (auto &x : dv) x = f2bf(nd(rng));
    for (auto &x : dz) x = f2bf(nd(rng));
    std::vector<int32_t> dp(T);
    for (int64_t t = 0; t < T; t++) dp[t] = t == 0 ? dp0 : (ud(rng) < rate ? 0 : dp[t - 1] + 1);
    std::vector<float> dw0((size_t)C * Kc);
    for (auto &x : dw0) x = nd(rng) * 0.1f;
    auto ok8 = [](const void *p) { return ((uintptr_t)p % 8) == 0; };
    SplitBufs s[2];
    for (SplitBufs &b : s) {
        b.T = T, b.nk = nk, b.dk = dk, b.Vd = Vd, b.ldp = ldp, b.pad = pad;
        b.proj = pb.data() + pad, b.halo = use_halo ? hb.data() + pad : nullptr, b.w = wb.data();
        b.dqk = dqk.data() + pad, b.dv = dv.data() + pad, b.dz = dz.data() + pad, b.doc_pos = dp.data();
        b.qk_in = nullptr, b.rstd_in = nullptr, b.err = 0;
        b.qk.assign(T * Kd2 + extra, POISON), b.v.assign(T * Vd + extra, POISON), b.z.assign(T * Vd + extra, POISON);
        b.dproj.assign(T * ldp + extra, POISON), b.dhalo.assign((Kc - 1) * C + extra, POISON);
        b.dhalo_want = want_dhalo ? b.dhalo.data() : nullptr;
        b.rstd.assign(T * nqk + 1, NAN), b.dw = dw0;
        b.v4 = ok8(b.proj) && ok8(b.qk.data() + pad) && ok8(b.v.data() + pad) && ok8(b.z.data() + pad) &&
               ok8(hb.data() + pad) && Vd % 4 == 0 && ldp % 4 == 0;
        b.v4b = b.v4 && ok8(b.dqk) && ok8(b.dv) && ok8(b.dz) && ok8(b.dproj.data() + pad) &&
                ok8(b.dhalo.data() + pad);
    }
    split_side_base(&s[0]);
    s[1].qk_in = s[0].qk.data() + pad, s[1].rstd_in = s[0].rstd.data();
    split_side_tree(&s[1]);
    printf("-- split_cmp: T %lld nk %d dk %d Vd %d ldp %d pad %d halo %d dhalo %d doc_pos[0] %d rate %.2f (8-byte %d)\n",
           (long long)T, nk, dk, Vd, ldp, pad, use_halo, want_dhalo, dp0, rate, (int)s[0].v4);
    const struct { const char *what; int64_t n; } r[] = {
        {"qk", emu_bits_differ(s[0].qk, s[1].qk)},
        {"rstd", emu_bits_differ(s[0].rstd, s[1].rstd)},
        {"v", emu_bits_differ(s[0].v, s[1].v)},
        {"z", emu_bits_differ(s[0].z, s[1].z)},
        {"dproj", emu_bits_differ(s[0].dproj, s[1].dproj)},
        {"dhalo", emu_bits_differ(s[0].dhalo, s[1].dhalo)},
        {"dw partials", emu_bits_differ(s[0].part, s[1].part)},
        {"dw", emu_bits_differ(s[0].dw, s[1].dw)},
        {"errors raised", (int64_t)(s[0].err != s[1].err)}};
    for (const auto &e : r) {
        if (e.n) emu_failures++;
        printf("%s %s: %lld elements differ\n", e.n ? "FAIL" : "ok  ", e.what, (long long)e.n);
    }
}

int main() {
    split_cmp_case(37, 1, 64, 36, 4, 0, 1, 1, 9, 0.05f);
    split_cmp_case(70, 2, 64, 37, 2, 1, 0, 1, 0, 0.1f);
    split_cmp_case(300, 2, 128, 256, 8, 0, 1, 1, 2, 0.02f);
    split_cmp_case(97, 2, 128, 128, 0, 0, 1, 1, 1000, 0.3f);
    split_cmp_case(1, 1, 64, 8, 0, 0, 1, 1, 0, 0.0f);
    split_cmp_case(333, 2, 64, 128, 4, 0, 1, 0, 3, 0.05f);
    split_cmp_case(300, 16, 128, 2048, 32, 0, 1, 1, 5000, 0.05f);
    printf("%s\n", emu_failures ? "split_cmp: FAIL" : "split_cmp: ok");
    return emu_failures != 0;
}
