/*
 * cmp.cpp (gdn_emu) — gdn_emu_cmp: the base revision's and the working tree's prep, dqkwg and wy_bwd (side.cpp) on the
 * same random inputs, for dk, dv in {64, 128}, one value head per key head (the final dq, dk in bf16) and two (the
 * fp32 per-value-head partials), over two document layouts (a document of exactly one chunk, one of 5 tokens, short
 * last chunks), the tree twice where its wy_bwd can read prep's kept Tinv (GDN_KEPT_TINV) or solve for it: every
 * output buffer (prep's kept Tinv too) must be bitwise equal to the base's, and is filled with a side-independent
 * pattern first so that a row one side leaves unwritten shows too. Prints each difference; exit 1 if any. Built by
 * build.sh.
 */
#include <cmath>
#include <random>
#include <type_traits>

#include "gdn_emu.h"

extern "C" void gdn_emu_run_base(GdnEmuBufs *b, int dk, int dv, int solve);
extern "C" void gdn_emu_run_tree(GdnEmuBufs *b, int dk, int dv, int solve);

static std::mt19937 gdn_emu_rng(1234);
static float emu_uni(float a, float b) { return std::uniform_real_distribution<float>(a, b)(gdn_emu_rng); }
static bf16 *emu_rand_bf16(size_t n, float s) {
    bf16 *p = new bf16[n];
    for (size_t i = 0; i < n; i++) p[i] = __float2bfloat16_rn(emu_uni(-s, s));
    return p;
}
static float *emu_rand_f32(size_t n, float a, float b) {
    float *p = new float[n];
    for (size_t i = 0; i < n; i++) p[i] = emu_uni(a, b);
    return p;
}
template <class X> static X *emu_filled(size_t n, unsigned char c) {
    X *p = (X *)aligned_alloc(64, (n * sizeof(X) + 63) / 64 * 64);
    memset(p, c, n * sizeof(X));
    return p;
}
template <class X> static int emu_compare(const char *name, const X *a, const X *b, size_t n) {
    if (!a && !b) return 0;
    if (!memcmp(a, b, n * sizeof(X))) return 0;
    size_t i = 0;
    while (((const unsigned char *)a)[i] == ((const unsigned char *)b)[i]) i++;
    printf("  %s differs (first at byte %zu of %zu)", name, i, n * sizeof(X));
    if constexpr (std::is_same_v<X, float>) { /* how far: the largest |a - b| over max |a| */
        float d = 0.0f, m = 0.0f;
        for (size_t j = 0; j < n; j++) {
            d = fmaxf(d, fabsf(a[j] - b[j]));
            m = fmaxf(m, fabsf(a[j]));
        }
        printf(", max |diff| %.3g of max |base| %.3g", d, m);
    }
    printf("\n");
    return 1;
}

int main(void) {
    const int shapes[][4] = {{64, 64, 2, 2}, {64, 64, 1, 2}, {128, 128, 2, 2}, {128, 128, 1, 2}, {128, 64, 2, 2},
                             {64, 128, 1, 2}}; /* dk, dv, nk, nv */
    const std::vector<std::vector<int>> layouts = {{100, 130}, {64, 5, 150, 40}}; /* document lengths */
    int fails = 0;
    for (const auto &docs : layouts)
        for (const auto &sh : shapes) {
            const int DK = sh[0], DV = sh[1], nk = sh[2], nv = sh[3];
            std::vector<int32_t> starts, doc_pos;
            for (int n : docs) {
                const int s = (int)doc_pos.size();
                for (int i = 0; i < n; i++) doc_pos.push_back(i);
                for (int i = 0; i < n; i += 64) starts.push_back(s + i);
            }
            const int64_t T = (int64_t)doc_pos.size(), ns = (T + 63) / 64 + 1;
            const int nc = (int)starts.size();
            starts.push_back((int32_t)T);
            int32_t meta[8] = {nc}; /* GDN_META_NC first (common.cuh), the rest unused here */
            GdnEmuBufs in{};
            in.T = T;
            in.nk = nk;
            in.nv = nv;
            in.ldq = nk * DK;
            in.ldv = in.ldo = nv * DV;
            in.scale = 1.0f / sqrtf((float)DK);
            in.starts = starts.data();
            in.meta = meta;
            in.doc_pos = doc_pos.data();
            in.k = emu_rand_bf16(T * nk * DK, 0.3f);
            in.q = emu_rand_bf16(T * nk * DK, 0.3f);
            in.v = emu_rand_bf16(T * nv * DV, 1.0f);
            in.dout = emu_rand_bf16(T * nv * DV, 1.0f);
            in.vn = emu_rand_bf16(T * nv * DV, 1.0f);
            in.dv2 = emu_rand_bf16(T * nv * DV, 1.0f);
            in.hs = emu_rand_bf16(ns * nv * DK * DV, 1.0f);
            in.dhs = emu_rand_bf16(ns * nv * DK * DV, 1.0f);
            in.g = emu_rand_f32(T * nv, -0.3f, 0.0f);
            in.beta = emu_rand_f32(T * nv, 0.1f, 0.9f);
            const float *dkv0 = emu_rand_f32(T * nv * DK, -1.0f, 1.0f);
            for (int solve = 0; solve < 2; solve++) {
                GdnEmuBufs o[2];
                for (int s = 0; s < 2; s++) {
                    o[s] = in;
                    o[s].W = emu_filled<bf16>(T * nv * DK, 0x11);
                    o[s].U = emu_filled<bf16>(T * nv * DV, 0x12);
                    o[s].G2 = emu_filled<float>(T * nv, 0x13);
                    o[s].dqv = emu_filled<float>(T * nv * DK, 0x14);
                    o[s].dq_out = nk == nv ? emu_filled<bf16>(T * nk * DK, 0x15) : NULL;
                    o[s].dkv = emu_filled<float>(T * nv * DK, 0x16);
                    memcpy(o[s].dkv, dkv0, T * nv * DK * sizeof(float));
                    o[s].dw = emu_filled<bf16>(T * nv * DK, 0x17);
                    o[s].dgp = emu_filled<float>(T * nv, 0x18);
                    o[s].dgp2 = emu_filled<float>(T * nv, 0x19);
                    o[s].dk_out = nk == nv ? emu_filled<bf16>(T * nk * DK, 0x1a) : NULL;
                    o[s].dv_out = emu_filled<bf16>(T * nv * DV, 0x1b);
                    o[s].dg_out = emu_filled<float>(T * nv, 0x1c);
                    o[s].dbeta_out = emu_filled<float>(T * nv, 0x1d);
                    o[s].Tb = emu_filled<bf16>(T * nv * 64, 0x1e);
                    (s ? gdn_emu_run_tree : gdn_emu_run_base)(&o[s], DK, DV, solve);
                }
                const size_t nq = nk == nv ? T * nk * DK : 0;
                printf("T %lld (%zu documents), dk %d dv %d nk %d nv %d, tree's wy_bwd %s\n", (long long)T,
                       docs.size(), DK, DV, nk, nv, solve ? "solving" : "reading the kept Tinv (where it can)");
                int f = emu_compare("W", o[0].W, o[1].W, T * nv * DK) +
                        emu_compare("U", o[0].U, o[1].U, T * nv * DV) +
                        emu_compare("G2", o[0].G2, o[1].G2, T * nv) +
                        emu_compare("Tinv", o[0].Tb, o[1].Tb, T * nv * 64) +
                        emu_compare("dqv", o[0].dqv, o[1].dqv, T * nv * DK) +
                        emu_compare("dq", o[0].dq_out, o[1].dq_out, nq) +
                        emu_compare("dkv", o[0].dkv, o[1].dkv, T * nv * DK) +
                        emu_compare("dw", o[0].dw, o[1].dw, T * nv * DK) +
                        emu_compare("dgp", o[0].dgp, o[1].dgp, T * nv) +
                        emu_compare("dgp2", o[0].dgp2, o[1].dgp2, T * nv) +
                        emu_compare("dk", o[0].dk_out, o[1].dk_out, nq) +
                        emu_compare("dv", o[0].dv_out, o[1].dv_out, T * nv * DV) +
                        emu_compare("dg", o[0].dg_out, o[1].dg_out, T * nv) +
                        emu_compare("dbeta", o[0].dbeta_out, o[1].dbeta_out, T * nv);
                uint32_t dbeta0;
                memcpy(&dbeta0, o[1].dbeta_out, 4);
                if (o[1].W[0].x == 0x1111 || o[1].U[0].x == 0x1212 || o[1].dv_out[0].x == 0x1b1b ||
                    dbeta0 == 0x1d1d1d1du) {
                    printf("  outputs not written\n");
                    f++;
                }
                fails += f;
            }
        }
    printf(fails ? "gdn_emu_cmp: FAIL (%d differences)\n" : "gdn_emu_cmp: bitwise equal\n", fails);
    return fails != 0;
}
