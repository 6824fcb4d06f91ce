/*
 * split_side.h (glue_emu) — the buffers of one side-by-side run of the fused GDN conv + split (split_cmp.cpp,
 * split_side.cpp): inputs shared by both sides, outputs owned by each side, compared bitwise after.
 */
#pragma once
#include "emu.h"

struct SplitBufs {
    /* the shape */
    int64_t T;
    int nk, dk, Vd, ldp, pad;
    bool v4, v4b; /* the 8-byte paths, forward and backward (the host's conv_vec4_ok) */
    /* inputs */
    const bf16 *proj, *halo, *w, *dqk, *dv, *dz;
    const int32_t *doc_pos;
    const bf16 *qk_in;      /* the backward's qk and rstd (NULL: the side's own forward outputs; split_cmp
                             * gives the tree side the base side's) */
    const float *rstd_in;
    bf16 *dhalo_want;        /* non-NULL: dhalo is wanted (the side writes its own copy) */
    /* outputs (sized by the caller, poisoned) */
    std::vector<bf16> qk, v, z, dproj, dhalo;
    std::vector<float> rstd, part, dw;
    int err;
};
