/* emu_ew.cpp (glue_emu) — cuda_elementwise.cu's sigmoid gate and SwiGLU (one block row per token, 256 column
 * vectors a block) under the host emulation against the cpu oracle (kernels/cpu/cpu_elementwise.c): the step's
 * widths, rows of 257 and 513 vectors (a second / third block column with few live threads), rows that are not
 * 16-byte rows, saturated gates. Prints ok / FAIL lines; exit status 1 on any FAIL. */
#include <random>

#include "emu.h"
EMU_GLOBALS
#include "ew.inc"

extern "C" {
void cpu_sigmoid_gate_forward(void *out, const void *x, const void *gate, int64_t T, int D, int ldg);
void cpu_sigmoid_gate_backward(void *dx, void *dgate, const void *dout, const void *x, const void *gate, int64_t T,
                               int D, int ldg);
void cpu_swiglu_forward(void *out, const void *gate_up, int64_t T, int inter);
void cpu_swiglu_backward(void *dgate_up, void *out, const void *dout, const void *gate_up, int64_t T, int inter);
}

static std::mt19937 rng(3);
static std::normal_distribution<float> nd(0, 1);
static void fill(std::vector<bf16> &b, std::vector<float> &f, size_t n, float s) {
    b.resize(n), f.resize(n);
    for (size_t i = 0; i < n; i++) f[i] = bf2f(f2bf(nd(rng) * s)), b[i] = f2bf(f[i]);
}
static std::vector<float> tof(const std::vector<bf16> &b) {
    std::vector<float> o(b.size());
    for (size_t i = 0; i < b.size(); i++) o[i] = bf2f(b[i]);
    return o;
}
static dim3 rows_grid(int64_t T, int width) { /* ew_row_grid */
    return emu_dim((unsigned)T, (unsigned)emu_cdiv(emu_cdiv(width, CUDA_VEC), EW_THREADS));
}

int main() {
    char what[128];
    static const struct { int64_t T; int D, ldg; float s; } sg[] = {
        {37, 2048, 2048, 3}, {5, 2056, 2100, 3}, {64, 256, 256, 40}, {7, 37, 50, 3}};
    for (auto c : sg) {
        std::vector<bf16> xb, gb, db;
        std::vector<float> xf, gf, df;
        fill(xb, xf, c.T * c.D, 1), fill(gb, gf, c.T * c.ldg, c.s), fill(db, df, c.T * c.D, 1);
        const bool vec = c.D % 8 == 0 && c.ldg % 8 == 0;
        std::vector<bf16> y(c.T * c.D), dx(c.T * c.D), dg(c.T * c.ldg, bf16{0});
        std::vector<float> yc(c.T * c.D), dxc(c.T * c.D), dgc(c.T * c.ldg, 0.0f);
        emu_launch(rows_grid(c.T, c.D), emu_dim(EW_THREADS),
                   [&] { ew_sigmoid_gate_forward_kernel(y.data(), xb.data(), gb.data(), c.D, c.ldg, vec); });
        emu_launch(rows_grid(c.T, c.D), emu_dim(EW_THREADS), [&] {
            ew_sigmoid_gate_backward_kernel(dx.data(), dg.data(), db.data(), xb.data(), gb.data(), c.D, c.ldg, vec);
        });
        cpu_sigmoid_gate_forward(yc.data(), xf.data(), gf.data(), c.T, c.D, c.ldg);
        cpu_sigmoid_gate_backward(dxc.data(), dgc.data(), df.data(), xf.data(), gf.data(), c.T, c.D, c.ldg);
        snprintf(what, sizeof what, "sigmoid_gate T %lld D %d ldg %d gate scale %g: fwd", (long long)c.T, c.D, c.ldg,
                 (double)c.s);
        emu_check(what, emu_rel(tof(y), yc), EMU_BF16);
        emu_check("  bwd dx", emu_rel(tof(dx), dxc), EMU_BF16);
        emu_check("  bwd dgate (0 outside the block on both sides)", emu_rel(tof(dg), dgc), EMU_BF16);
    }
    static const struct { int64_t T; int I; float s; } sw[] = {{33, 4096, 2}, {3, 4100, 2}, {9, 2056, 30}, {7, 37, 2}};
    for (auto c : sw) {
        std::vector<bf16> gu, d;
        std::vector<float> guf, df;
        fill(gu, guf, c.T * 2 * c.I, c.s), fill(d, df, c.T * c.I, 1);
        const bool vec = c.I % 8 == 0;
        std::vector<bf16> y(c.T * c.I), y2(c.T * c.I), dgu(c.T * 2 * c.I), dgu2(c.T * 2 * c.I);
        std::vector<float> yc(c.T * c.I), dguc(c.T * 2 * c.I);
        emu_launch(rows_grid(c.T, c.I), emu_dim(EW_THREADS),
                   [&] { ew_swiglu_forward_kernel(y.data(), gu.data(), c.I, vec); });
        emu_launch(rows_grid(c.T, c.I), emu_dim(EW_THREADS),
                   [&] { ew_swiglu_backward_kernel<false>(dgu.data(), nullptr, d.data(), gu.data(), c.I, vec); });
        emu_launch(rows_grid(c.T, c.I), emu_dim(EW_THREADS), /* with out: the forward's bits again */
                   [&] { ew_swiglu_backward_kernel<true>(dgu2.data(), y2.data(), d.data(), gu.data(), c.I, vec); });
        cpu_swiglu_forward(yc.data(), guf.data(), c.T, c.I);
        cpu_swiglu_backward(dguc.data(), nullptr, df.data(), guf.data(), c.T, c.I);
        snprintf(what, sizeof what, "swiglu T %lld I %d scale %g: fwd", (long long)c.T, c.I, (double)c.s);
        emu_check(what, emu_rel(tof(y), yc), EMU_BF16);
        emu_check("  bwd", emu_rel(tof(dgu), dguc), EMU_BF16);
        emu_check("  bwd with out: out bitwise the forward's, dgate_up bitwise as without",
                  emu_bits_differ(y2, y) + emu_bits_differ(dgu2, dgu), 0);
    }
    printf("%s\n", emu_failures ? "glue_emu ew: FAIL" : "glue_emu ew: ok");
    return emu_failures != 0;
}
