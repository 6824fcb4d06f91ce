/*
 * gdn_buffers.cu — the device memory of the GDN entries (gdn_host.h). The workspace: backend.h gives these
 * entries none, so one device buffer, grown through cuda_internal_alloc (memory_stats counts it) when a
 * call needs more and reused as is otherwise: no allocation in steady state. A call's buffers (GdnBufs:
 * the index, W, U, G2, the states h and vn, the backward's dh, dv2 and fp32 partials, the segments'
 * slots) are carved from it on 256-byte boundaries. The caller's kept buffer (the forward's W, U, G2 and,
 * asked, Tinv, h and vn) and the staged backward's dkept have their layouts here, and a call longer than a
 * piece (GDN_PIECE_ROWS) is cut into pieces whose kept parts follow each other. Host code only; not
 * thread-safe (one compute stream). The byte counts and the design: docs/design/gdn-kernels.md.
 *
 * Callers: gdn.cu.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h" /* GDN_PIECE_ROWS */
#include "cuda_ptx.h"
#include "cuda_common.h"
#include "cuda_gdn_mma.h"
#include "cuda_gdn_tune.h"
#include "cuda_kernels.h"

/* the kernels' constants only (GDN_C, GDN_META_N, GDN_TP_N, GdnCarve): no kernel is instantiated here */
#include "common.cuh"
#include "state_pass.cuh"

#include "gdn_host.h"

static void *gdn_ws;        /* the device workspace (see the header) */
static size_t gdn_ws_bytes; /* its size */

/* Grows (never shrinks) through cuda_internal_alloc, so memory_stats counts it: the old buffer is freed
 * after the device is idle (a host synchronisation, on growth only: the first step's first call of each
 * size; a stream-ordered free would leave the old block reserved in the pool, uncounted) */
static size_t gdn_workspace_grown(size_t bytes) {
    const size_t want = bytes + bytes / 8;
    return (want + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
}

static unsigned char *gdn_workspace(size_t bytes) {
    if (bytes > gdn_ws_bytes) {
        const size_t want = gdn_workspace_grown(bytes);
        if (gdn_ws) {
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
            cuda_internal_free(gdn_ws, gdn_ws_bytes);
        }
        gdn_ws = cuda_internal_alloc(want);
        gdn_ws_bytes = want;
    }
    return (unsigned char *)gdn_ws;
}

/* nseg: slots of the segmented state passes (0: none); a backward gets two sets. kept_states: h and vn
 * live in the caller's kept buffer (gdn_kept_carve), so the workspace has none */
static size_t gdn_carve(GdnBufs *b, unsigned char *base, int what, int64_t T, int nv, int dk, int dv,
                        int nseg = 0, int kept_states = 0) {
    const int64_t nb = (T + 1023) / 1024, ns = (T + GDN_C - 1) / GDN_C + 1;
    const size_t tv = (size_t)T * nv;
    GdnCarve c(base, 256); /* global buffers on 256-byte boundaries: whole sectors for every tile row
                              (16-byte alignment alone made the h / vn stores of the state passes 2-3x slower) */
    *b = GdnBufs{};
    b->blk = c.take<int32_t>((size_t)3 * (nb > 0 ? nb : 1));
    b->meta = c.take<int32_t>(GDN_META_N);
    b->starts = c.take<int32_t>((size_t)T + 1);
    b->info = c.take<int4>((size_t)T + 1);
    b->cuts = c.take<int32_t>(GDN_CUTS_PICK + 1);
    b->G2 = c.take<float>(tv);
    b->W = c.take<bf16>(tv * dk);
    b->U = c.take<bf16>(tv * dv);
    if ((what == GDN_WS_FORWARD || what == GDN_WS_BACKWARD) && !kept_states) {
        b->vn = c.take<bf16>(tv * dv);
        b->hs = c.take<bf16>((size_t)ns * nv * dk * dv);
    }
    if (what == GDN_WS_BACKWARD) {
        b->dhs = c.take<bf16>((size_t)ns * nv * dk * dv);
        b->dv2 = c.take<bf16>(tv * dv);
        b->dqv = c.take<float>(tv * dk);
        b->dkv = c.take<float>(tv * dk);
        b->dgp = c.take<float>(2 * tv); /* two partials for the split dqkwg */
    }
    if (nseg > 1) {
        const size_t nsz = (size_t)nseg * nv * dk * dv, nmz = (size_t)nseg * nv * dk * dk;
        b->segE = c.take<float>(nsz);
        b->segH = c.take<float>(nsz);
        b->segM = c.take<float>(nmz);
        if (what == GDN_WS_BACKWARD) {
            b->segE2 = c.take<float>(nsz);
            b->segH2 = c.take<float>(nsz);
            b->segM2 = c.take<float>(nmz);
        }
    }
    return c.off;
}

size_t gdn_kept_carve(GdnBufs *b, void *kept, int64_t T, int nv, int dk, int dv, int kind) {
    const size_t tv = (size_t)T * nv, ns = (size_t)(T + GDN_C - 1) / GDN_C + 1;
    GdnCarve c(kept, 256);
    bf16 *W = c.take<bf16>(tv * dk), *U = c.take<bf16>(tv * dv);
    float *G2 = c.take<float>(tv);
    const int states = (kind & GDN_KEPT_STATES) != 0;
    bf16 *Tb = kind & GDN_KEPT_TINV ? c.take<bf16>(tv * GDN_C) : NULL;
    bf16 *hs = states ? c.take<bf16>(ns * nv * dk * dv) : NULL, *vn = states ? c.take<bf16>(tv * dv) : NULL;
    if (b) {
        b->W = W;
        b->U = U;
        b->G2 = G2;
        b->Tb = Tb;
        if (states) {
            b->hs = hs;
            b->vn = vn;
        }
    }
    return (c.off + 255) / 256 * 256;
}

GdnBufs gdn_buffers(int what, int64_t T, int nv, int dk, int dv, int nseg, int kept_states) {
    GdnBufs b;
    const size_t bytes = gdn_carve(&b, NULL, what, T, nv, dk, dv, nseg, kept_states);
    gdn_carve(&b, gdn_workspace(bytes), what, T, nv, dk, dv, nseg, kept_states);
    b.T = T;
    return b;
}

/* The workspace the entries grow to for fragments of frag tokens at CP size cp (BackendSizes, for plan and
 * model_acts): a backward of one piece (the smaller of frag and the piece rows; the segmented state passes'
 * allowance of 64 segments where the value heads give fewer than 132 / 4 blocks of 32 columns) or, at cp > 1,
 * a whole fragment's transition or state gradient (the scan's), grown as gdn_workspace grows it. */
extern "C" size_t cuda_gdn_workspace_bytes(int64_t frag, int cp, int nv, int dk, int dv, int kept_kind) {
    GdnBufs b;
    const int64_t R = gdn_piece_rows(), n = frag < R ? frag : R;
    const int nseg = 4 * nv * dv / 32 <= 132 ? 64 : 0;
    size_t most = gdn_carve(&b, NULL, GDN_WS_BACKWARD, n, nv, dk, dv, nseg, kept_kind & GDN_KEPT_STATES);
    if (cp > 1) {
        const size_t t = gdn_carve(&b, NULL, GDN_WS_TRANSITION, frag, nv, dk, dv);
        if (t > most) most = t;
    }
    return gdn_workspace_grown(most);
}

/* What the staged backward carries between its stages (backend.h gdn_chunk_backward_stage; one piece's part of
 * dkept): dv_loc (T,nv,dv), the chunk state gradients dh (ns,nv,dk,dv) and dv2 (T,nv,dv), bf16, each on 256
 * bytes. b NULL: the size only. Returns the bytes, a multiple of 256. */
size_t gdn_dkept_carve(GdnBufs *b, bf16 **dvl, void *dkept, int64_t T, int nv, int dk, int dv) {
    const size_t tv = (size_t)T * nv, ns = (size_t)(T + GDN_C - 1) / GDN_C + 1;
    GdnCarve c(dkept, 256);
    bf16 *l = c.take<bf16>(tv * dv), *dhs = c.take<bf16>(ns * nv * dk * dv), *dv2 = c.take<bf16>(tv * dv);
    if (b) {
        *dvl = l;
        b->dhs = dhs;
        b->dv2 = dv2;
    }
    return (c.off + 255) / 256 * 256;
}

int64_t gdn_piece_rows(void) {
    const int piece = gdn_tune().piece;
    RS_CHECK(piece >= 0 && piece % GDN_C == 0, "cuda_gdn tune: piece = %d (a multiple of %d, or 0)", piece, GDN_C);
    return piece ? piece : GDN_PIECE_ROWS;
}

/* the kept bytes of a call of T tokens in pieces of R; at[p] (when not NULL, np + 1 entries) the offset of
 * piece p's part, at[np] that of the entry states */
size_t gdn_kept_pieces(int64_t T, int64_t R, int nv, int dk, int dv, int kind, size_t *at) {
    size_t off = 0;
    int64_t p = 0;
    for (int64_t r0 = 0; r0 < T; r0 += R, p++) {
        if (at) at[p] = off;
        off += gdn_kept_carve(NULL, NULL, T - r0 < R ? T - r0 : R, nv, dk, dv, kind);
    }
    if (at) at[p] = off;
    return off + (size_t)(p - 1) * nv * dk * dv * sizeof(float);
}

/* the pieces of a call of T tokens in pieces of R, at most GDN_PIECE_MAX (`who` names the entry), with the kept
 * offsets at[] of gdn_kept_pieces */
int64_t gdn_pieces(const char *who, int64_t T, int64_t R, int nv, int dk, int dv, int kind, size_t *at) {
    const int64_t np = (T + R - 1) / R;
    RS_CHECK(np <= GDN_PIECE_MAX, "%s: T = %lld is %lld pieces of %lld (at most %d)", who, (long long)T,
             (long long)np, (long long)R, GDN_PIECE_MAX);
    gdn_kept_pieces(T, R, nv, dk, dv, kind, at);
    return np;
}

/* the pieces' own device scratch (fp32): grown through cuda_internal_alloc like the workspace */
float *gdn_piece_scratch(size_t floats) {
    static float *buf;
    static size_t have;
    if (floats > have) {
        if (buf) {
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
            cuda_internal_free(buf, have * sizeof(float));
        }
        buf = (float *)cuda_internal_alloc(floats * sizeof(float));
        have = floats;
    }
    return buf;
}
