/* emu_norm.cpp (glue_emu) — cuda_rmsnorm.cu's kernels (the group forward at 1, 3, 6 vectors a lane and head dims
 * 64 / 128; the register backward at 1536 and at 256 with idle lanes; the group backward at 64 / 128) and
 * cuda_norm.cu's gated RMSNorm group kernels under the host emulation against the cpu oracle
 * (kernels/cpu/cpu_norm.c), the dw partials added by cuda_device.cuh's stage-2 kernel. The launch shapes are the
 * entries' (copied). Prints ok / FAIL lines; exit status 1 on any FAIL. */
#include <random>

#include "emu.h"
EMU_GLOBALS
#include "norm.inc"

extern "C" {
void cpu_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int64_t T, int nh, int D, int ldi,
                         int ldo, float eps, int zero_centred);
void cpu_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w, const float *rstd,
                          int64_t T, int nh, int D, int ldi, int ldo, int zero_centred);
void cpu_gated_rmsnorm_forward(void *out, float *rstd, const void *x, const void *z, const void *w, int64_t T, int nv,
                               int dv, int ldz, float eps);
void cpu_gated_rmsnorm_backward(void *dx, void *dz, float *dw, const void *dout, const void *x, const void *z,
                                const void *w, const float *rstd, int64_t T, int nv, int dv, int ldz);
/* cpu_norm.o's GDN split calls it; nothing here runs the split */
void cpu_copy_2d(void *, const void *, int64_t, int, int, int) {}
}

static std::mt19937 rng(7);
static std::normal_distribution<float> nd(0, 1);
struct Mat {
    std::vector<bf16> b;
    std::vector<float> f;
    int64_t T;
    int W, ld;
};
static Mat mat(int64_t T, int W, int ld, float s) {
    Mat m{std::vector<bf16>(T * ld, bf16{0x7fc0}), std::vector<float>(T * ld, NAN), T, W, ld};
    if (s > 0)
        for (int64_t i = 0; i < T * ld; i++) m.f[i] = bf2f(f2bf(nd(rng) * s)), m.b[i] = f2bf(m.f[i]);
    return m;
}
static std::vector<float> dense(const Mat &m, bool from_bf16) {
    std::vector<float> o;
    for (int64_t t = 0; t < m.T; t++)
        for (int c = 0; c < m.W; c++) o.push_back(from_bf16 ? bf2f(m.b[t * m.ld + c]) : m.f[t * m.ld + c]);
    return o;
}
static int outside(const Mat &got, const Mat &want) { /* columns past the block, compared raw */
    int n = 0;
    for (int64_t t = 0; t < got.T; t++)
        for (int c = got.W; c < got.ld; c++) n += got.b[t * got.ld + c].x != want.b[t * got.ld + c].x;
    return n;
}
static void weights(int D, float s, std::vector<float> &wf, std::vector<bf16> &wb) {
    wf.resize(D), wb.resize(D);
    for (int i = 0; i < D; i++) wf[i] = bf2f(f2bf(nd(rng) * s)), wb[i] = f2bf(wf[i]);
}
static void stage2(std::vector<float> &dw, const std::vector<float> &part, int blocks, int D) {
    emu_launch(emu_dim((unsigned)emu_cdiv(D, CUDA_WARP)), emu_dim(CUDA_WARP * CUDA_PARTIALS_WARPS),
               [&] { cuda_partials_add_kernel(dw.data(), part.data(), blocks, D); });
}

template <int LPR, int NV>
static void rms_fwd(int64_t T, int nh, int ldi, int ldo, int zc) {
    const int D = LPR * 8 * NV, W = nh * D;
    const int64_t rows = T * nh;
    char what[128];
    Mat x = mat(T, W, ldi, 1), y = mat(T, W, ldo, 0), yc = mat(T, W, ldo, 0);
    std::vector<float> wf, rs(rows, NAN), rsc(rows, NAN);
    std::vector<bf16> wb;
    weights(D, 0.5f, wf, wb);
    emu_launch(emu_dim((unsigned)emu_cdiv(rows, 256 / LPR)), emu_dim(256), [&] {
        norm_rms_group_forward_kernel<LPR, NV>(y.b.data(), rs.data(), x.b.data(), wb.data(), rows, nh, ldi, ldo, 1e-6f,
                                               zc);
    });
    cpu_rmsnorm_forward(yc.f.data(), rsc.data(), x.f.data(), wf.data(), T, nh, D, ldi, ldo, 1e-6f, zc);
    snprintf(what, sizeof what, "rmsnorm fwd group <%d,%d> T %lld nh %d", LPR, NV, (long long)T, nh);
    emu_check(what, emu_rel(dense(y, true), dense(yc, false)), EMU_BF16);
    emu_check("  rstd", emu_rel(rs, rsc), EMU_F32);
    emu_check("  writes outside the block", outside(y, mat(T, W, ldo, 0)), 0);
}

static void rms_bwd(int64_t T, int nh, int D, int ldi, int ldo, int zc) {
    const int W = nh * D;
    const int64_t rows = T * nh;
    const bool group = D == 64 || D == 128;
    char what[128];
    Mat x = mat(T, W, ldi, 1), g = mat(T, W, ldo, 1), di = mat(T, W, ldi, 0.5f), dic = di;
    std::vector<float> wf, rs(rows), dw0(D);
    std::vector<bf16> wb;
    weights(D, 0.5f, wf, wb);
    for (auto &r : rs) r = 0.5f + 0.1f * nd(rng);
    for (auto &v : dw0) v = nd(rng) * 0.1f;
    std::vector<float> dw = dw0, dwc = dw0, part;
    int blocks;
    if (group) { /* cuda_rmsnorm_backward's group launch */
        const int lpr = D / 8;
        blocks = (int)std::min<int64_t>(CUDA_MAX_PARTIALS, std::max<int64_t>(1, emu_cdiv(rows, 4 * (NORM_GROUP_THREADS / lpr))));
        const int64_t rpb = emu_cdiv(rows, blocks);
        part.assign((size_t)blocks * D, NAN);
        emu_launch(emu_dim(blocks), emu_dim(NORM_GROUP_THREADS), [&] {
            if (D == 64)
                norm_rms_group_backward_kernel<8>(di.b.data(), part.data(), g.b.data(), x.b.data(), wb.data(),
                                                  rs.data(), rows, rpb, nh, ldi, ldo, zc);
            else
                norm_rms_group_backward_kernel<16>(di.b.data(), part.data(), g.b.data(), x.b.data(), wb.data(),
                                                   rs.data(), rows, rpb, nh, ldi, ldo, zc);
        });
    } else { /* the register kernel: 8 warps (slices of D rounded up to 256 within 48 KiB) */
        blocks = (int)std::min<int64_t>(CUDA_MAX_PARTIALS, std::max<int64_t>(1, emu_cdiv(rows, 4 * 8)));
        const int64_t rpb = emu_cdiv(rows, blocks);
        part.assign((size_t)blocks * D, NAN);
        emu_launch(emu_dim(blocks), emu_dim(256), [&] {
            norm_rms_backward_reg_kernel(di.b.data(), part.data(), g.b.data(), x.b.data(), wb.data(), rs.data(), rows,
                                         rpb, nh, D, ldi, ldo, zc);
        });
    }
    stage2(dw, part, blocks, D);
    cpu_rmsnorm_backward(dic.f.data(), dwc.data(), g.f.data(), x.f.data(), wf.data(), rs.data(), T, nh, D, ldi, ldo,
                         zc);
    snprintf(what, sizeof what, "rmsnorm bwd %s T %lld nh %d D %d dinp +=", group ? "group" : "reg", (long long)T, nh,
             D);
    emu_check(what, emu_rel(dense(di, true), dense(dic, false)), EMU_BF16);
    emu_check("  dw +=", emu_rel(dw, dwc), EMU_F32);
    emu_check("  writes outside the block", outside(di, dic), 0);
}

template <int LPR>
static void gated(int64_t T, int nv, int ldz) {
    const int dv = LPR * 8, W = nv * dv;
    const int64_t rows = T * nv;
    char what[128];
    Mat x = mat(T, W, W, 1), z = mat(T, W, ldz, 2), g = mat(T, W, W, 1);
    Mat y = mat(T, W, W, 0), yc = y, dx = y, dxc = y, dz = mat(T, W, ldz, 0), dzc = dz;
    std::vector<float> wf, rs(rows, NAN), rsc(rows, NAN), dw0(dv);
    std::vector<bf16> wb;
    weights(dv, 1.0f, wf, wb);
    for (auto &v : dw0) v = nd(rng) * 0.1f;
    emu_launch(emu_dim((unsigned)emu_cdiv(rows * dv / 8, NORM_GROUP_THREADS)), emu_dim(NORM_GROUP_THREADS), [&] {
        norm_gated_group_forward_kernel<LPR>(y.b.data(), rs.data(), x.b.data(), z.b.data(), wb.data(), rows, nv, ldz,
                                             1e-6f);
    });
    cpu_gated_rmsnorm_forward(yc.f.data(), rsc.data(), x.f.data(), z.f.data(), wf.data(), T, nv, dv, ldz, 1e-6f);
    snprintf(what, sizeof what, "gated_rmsnorm fwd group <%d> T %lld nv %d ldz %d", LPR, (long long)T, nv, ldz);
    emu_check(what, emu_rel(dense(y, true), dense(yc, false)), EMU_BF16);
    emu_check("  rstd", emu_rel(rs, rsc), EMU_F32);
    const int blocks = (int)std::min<int64_t>(CUDA_MAX_PARTIALS,
                                              std::max<int64_t>(1, emu_cdiv(rows, 4 * (NORM_GROUP_THREADS * 8 / dv))));
    const int64_t rpb = emu_cdiv(rows, blocks);
    std::vector<float> part((size_t)blocks * dv, NAN), dw = dw0, dwc = dw0;
    emu_launch(emu_dim(blocks), emu_dim(NORM_GROUP_THREADS), [&] {
        norm_gated_group_backward_kernel<LPR>(dx.b.data(), dz.b.data(), part.data(), g.b.data(), x.b.data(),
                                              z.b.data(), wb.data(), rsc.data(), rows, rpb, nv, ldz);
    });
    stage2(dw, part, blocks, dv);
    cpu_gated_rmsnorm_backward(dxc.f.data(), dzc.f.data(), dwc.data(), g.f.data(), x.f.data(), z.f.data(), wf.data(),
                               rsc.data(), T, nv, dv, ldz);
    emu_check("gated_rmsnorm bwd dx", emu_rel(dense(dx, true), dense(dxc, false)), EMU_BF16);
    emu_check("  dz", emu_rel(dense(dz, true), dense(dzc, false)), EMU_BF16);
    emu_check("  dw +=", emu_rel(dw, dwc), EMU_F32);
    emu_check("  dz writes outside the block", outside(dz, mat(T, W, ldz, 0)), 0);
}

int main() {
    rms_fwd<32, 6>(77, 1, 1536, 1536, 1); /* the hidden size */
    rms_fwd<32, 6>(3, 1, 1536, 1536, 1);  /* the conv halo's 3 rows */
    rms_fwd<16, 1>(41, 16, 4608, 2048, 1); /* q_norm inside the attention projection row */
    rms_fwd<8, 1>(33, 5, 320, 328, 0);
    rms_fwd<32, 3>(19, 3, 2312, 2320, 0);
    rms_bwd(300, 1, 1536, 1536, 1536, 1);
    rms_bwd(3, 1, 1536, 1536, 1536, 1);
    rms_bwd(37, 2, 256, 520, 512, 0);
    rms_bwd(53, 16, 128, 4608, 2048, 1); /* q_norm */
    rms_bwd(29, 2, 128, 4608, 512, 1);   /* k_norm */
    rms_bwd(41, 5, 64, 320, 328, 0);
    rms_bwd(1300, 3, 64, 192, 192, 1); /* 16 blocks of partials */
    gated<16>(133, 16, 8224);          /* z inside the GDN projection row */
    gated<8>(70, 3, 200);
    gated<32>(9, 2, 512);
    printf("%s\n", emu_failures ? "glue_emu norm: FAIL" : "glue_emu norm: ok");
    return emu_failures != 0;
}
