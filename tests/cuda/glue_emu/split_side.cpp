/*
 * split_side.cpp (glue_emu) — one side of split_cmp: the fused GDN conv + split kernels of the conv.inc on the
 * include path (a base revision's or the working tree's, split_build.sh), launched as that revision's
 * cuda_gdn_conv_split_forward/backward launch them, exported as SPLIT_SIDE(bufs). The kernels sit in an unnamed
 * namespace so that the two sides' instances stay apart at link time.
 */
#include "split_side.h"

namespace {
#include "conv.inc"

template <int HL> void split_side_run(SplitBufs *b) {
    const int Kc = 4, Kd2 = 2 * b->nk * b->dk, C = Kd2 + b->Vd, pad = b->pad;
    const int64_t T = b->T;
    /* forward: cuda_gdn_conv_split_forward's launch */
    const unsigned nbc = (unsigned)emu_cdiv(emu_cdiv(C, CONV_CV), CONV_RUN_LANES);
    const unsigned nbz = (unsigned)emu_cdiv(emu_cdiv(b->Vd, CONV_CV), CONV_RUN_LANES);
    emu_launch(emu_dim(nbc + nbz, (unsigned)emu_cdiv(T, (int64_t)CONV_RUN_ROWS * CONV_RUN_FWD)),
               emu_dim(CONV_RUN_LANES, CONV_RUN_ROWS), [&] {
                   conv_split_forward_kernel<4, HL>(b->qk.data() + pad, b->rstd.data(), b->v.data() + pad,
                                                    b->z.data() + pad, b->proj, b->halo, b->w, b->doc_pos, (int)T,
                                                    CONV_RUN_FWD, Kd2, b->Vd, b->ldp, nbc, &b->err, b->v4);
               });
    /* backward: cuda_gdn_conv_split_backward's launch */
    int64_t run = 0;
    const int64_t gy = emu_conv_bwd_grid(T, C, Kc, CONV_PART_BYTES, CUDA_MAX_PARTIALS, CONV_RUN_ROWS, CONV_RUN_BWD_MIN, &run);
    b->part.assign(gy * C * Kc, NAN);
    bf16 *dhp = b->dhalo_want ? b->dhalo.data() + pad : nullptr;
    emu_launch(emu_dim(nbc + nbz, (unsigned)gy), emu_dim(CONV_RUN_LANES, CONV_RUN_ROWS), [&] {
        conv_split_backward_kernel<4, HL>(b->dproj.data() + pad, dhp, b->part.data(), b->dqk,
                                          b->qk_in ? b->qk_in : b->qk.data() + pad,
                                          b->rstd_in ? b->rstd_in : b->rstd.data(), b->dv, b->dz, b->proj, b->halo, b->w, b->doc_pos, (int)T,
                                          (int)run, Kd2, b->Vd, b->ldp, nbc, &b->err, b->v4b);
    });
    emu_launch(emu_dim((unsigned)emu_cdiv(C * Kc, CUDA_WARP)), emu_dim(CUDA_WARP * CUDA_PARTIALS_WARPS),
               [&] { cuda_partials_add_kernel(b->dw.data(), b->part.data(), (int)gy, (int64_t)C * Kc); });
}
} // namespace

extern "C" void SPLIT_SIDE(SplitBufs *b) {
    if (b->dk == 128) split_side_run<32>(b);
    else split_side_run<16>(b);
}
