/*
 * cp_gdn.c — Gated DeltaNet across the CP group: the prefix scan of the
 * fragments' state transitions and the conv halo (see cp.h; the math is
 * research/gdn_cp.md §3-4 and our derivation below).
 *
 * Per value head, a fragment g maps the state entering it to the state
 * leaving it affinely: X_g = M_g E_g + H_g, where (M_g, H_g) is the chunked
 * delta rule run over the fragment from the state [0 | I] (M_g = 0 when a
 * document starts inside: the state is reset, so nothing passes through).
 * The entry state of fragment g is the exit state of g-1 in the same sample,
 * so
 *     E_g = F_{g-1}( ... F_{j+1}(H_j) ... ),  F_i(S) = M_i S + H_i,
 * starting at the last fragment j < g that resets (or at fragment 0, whose
 * entry is 0: a sample has nothing before it). A fragment whose first token
 * starts a document needs no entry state at all.
 *
 * Backward. Let dE_g be the gradient of the loss with respect to E_g. The
 * fragment's outputs depend on E_g affinely, and so does its exit state:
 *     dE_g = dL_g + M_g^T dE_{g+1},
 * where dL_g is the gradient through the fragment's own outputs
 * (gdn_chunk_dstate: the backward's state pass alone, no S needed). The
 * gradient arriving at the exit of fragment g is dE_{g+1}, folded from the
 * next resetting fragment (whose dE is its own dL: M = 0) down to g+1. Then
 * the one full backward per fragment (gdn_chunk_backward) runs with that
 * dS_final, so nothing of the chunked backward is computed twice.
 *
 * Communication: one all-gather per scan of fixed-size slots [M | H] (forward)
 * or [M | dL] (backward) per local fragment, fp32; every rank folds, in
 * global order with the same code, the fragments it needs (IEEE fp32, no
 * reassociation). The conv halo is one all-gather of every fragment's last
 * Kc-1 pre-conv rows; its gradient goes back by a second one and is added
 * into the owner's rows.
 *
 * Callers: lib/model_block.c (GDN layers, cp > 1), tests/cp.
 */
#include <string.h>

#include "cp.h"
#include "error.h"

#define CP_AT(p, off) ((void *)((char *)(p) + (int64_t)(off) * es))

/* Sizes of the scan's slots: per local fragment [M (nv,dk,dk) | H or dL (nv,dk,dv)], fp32. */
typedef struct {
    int64_t mm, hh, slot, per_rank;
} CpScanSizes;

static CpScanSizes cp_scan_sizes(const Cp *cp, const CpGdnDims *d) {
    CpScanSizes z;
    z.mm = (int64_t)d->nv * d->dk * d->dk;
    z.hh = (int64_t)d->nv * d->dk * d->dv;
    z.slot = z.mm + z.hh;
    z.per_rank = (int64_t)cp->batch.samples * cp->L.nlocal * z.slot;
    return z;
}

/* The gathered slot of (sample s, global fragment g): its M, and its H or dL at + mm. */
static const float *cp_scan_slot(const Cp *cp, const CpScanSizes *z, int s, int g) {
    int f, r = cp_layout_owner(&cp->L, g, &f);
    return cp->scan_recv + r * z->per_rank + ((int64_t)s * cp->L.nlocal + f) * z->slot;
}

/* out = the fold from fragment `seed` towards `target` (exclusive) in sample s: S = the seed's
 * H (or dL); then for each fragment j strictly between them, in order, S = op(M_j) S + H_j
 * (op = M^T when transpose: the backward runs towards earlier fragments). */
static void cp_scan_fold(Cp *cp, const CpScanSizes *z, float *out, int s, int seed, int target, int transpose,
                         const CpGdnDims *d) {
    const int dir = target > seed ? 1 : -1;
    const float *S = cp_scan_slot(cp, z, s, seed) + z->mm;
    int ping = 0;
    for (int j = seed + dir; j != target; j += dir) {
        const float *Mj = cp_scan_slot(cp, z, s, j);
        float *dst = j + dir == target ? out : cp->fold[ping];
        cp->be->gdn_state_affine(dst, Mj, S, Mj + z->mm, transpose, d->nv, d->dk, d->dv);
        S = dst;
        ping ^= 1;
    }
    if (S != out) cp->be->copy(out, S, (size_t)z->hh * sizeof(float));
}

/* One all-gather of every rank's slots over the CP group (`what`: for the watchdog's report). */
static void cp_scan_allgather(Cp *cp, int layer, const CpScanSizes *z, const char *what) {
    CommHandle h = {0};
    comm_set_context(cp->comm, layer, what);
    comm_iallgather(cp->comm, COMM_CP, cp->scan_send, cp->scan_recv, z->per_rank * (int64_t)sizeof(float),
                    &h);
    comm_wait(cp->comm, &h);
}

void cp_gdn_scan_forward(Cp *cp, int layer, float *states, float *M_keep, const void *k, const void *v,
                         const float *g, const float *beta, int ldq, int ldv, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const int es = be->act_size;
    const CpScanSizes z = cp_scan_sizes(cp, d);
    const int32_t *doc_pos = B->doc_pos_dev + (int64_t)L->rank * B->rows;

    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t i = (int64_t)s * L->nlocal + f, r0 = cp_frag_row(cp, s, f);
            float *M = cp->scan_send + i * z.slot;
            be->gdn_chunk_transition(M, M + z.mm, CP_AT(k, r0 * ldq), CP_AT(v, r0 * ldv), g + r0 * d->nv,
                                     beta + r0 * d->nv, doc_pos + r0, L->frag_len, d->nk, d->nv, d->dk, d->dv, ldq,
                                     ldv);
            be->copy(M_keep + i * z.mm, M, (size_t)z.mm * sizeof(float));
        }
    cp_scan_allgather(cp, layer, &z, "GDN scan all-gather forward");
    cp->count.scan_allgathers_fwd[layer]++;

    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int gi = L->frag_global[f];
            float *E = states + ((int64_t)s * L->nlocal + f) * z.hh;
            const uint8_t *resets = B->frag_resets + (int64_t)s * L->nglobal;
            if (gi == 0 || B->frag_starts_doc[(int64_t)s * L->nglobal + gi]) {
                be->memset_zero(E, (size_t)z.hh * sizeof(float)); /* nothing before, or reset at once */
                continue;
            }
            int j0 = gi - 1; /* the last fragment before gi that resets (its exit is its H), else 0 */
            while (j0 > 0 && !resets[j0]) j0--;
            cp_scan_fold(cp, &z, E, s, j0, gi, 0, d);
        }
}

void cp_gdn_scan_backward(Cp *cp, int layer, float *dS_final, const float *M_keep, const void *dout, const void *q,
                          const void *k, const float *g, const float *beta, int ldq, int ldo, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const int es = be->act_size;
    const CpScanSizes z = cp_scan_sizes(cp, d);
    const int32_t *doc_pos = B->doc_pos_dev + (int64_t)L->rank * B->rows;

    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t i = (int64_t)s * L->nlocal + f, r0 = cp_frag_row(cp, s, f);
            float *M = cp->scan_send + i * z.slot;
            be->copy(M, M_keep + i * z.mm, (size_t)z.mm * sizeof(float));
            be->gdn_chunk_dstate(M + z.mm, CP_AT(dout, r0 * ldo), CP_AT(q, r0 * ldq), CP_AT(k, r0 * ldq),
                                 g + r0 * d->nv, beta + r0 * d->nv, doc_pos + r0, L->frag_len, d->nk, d->nv, d->dk,
                                 d->dv, ldq, ldo);
        }
    cp_scan_allgather(cp, layer, &z, "GDN scan all-gather backward");
    cp->count.scan_allgathers_bwd[layer]++;

    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int gi = L->frag_global[f];
            float *D = dS_final + ((int64_t)s * L->nlocal + f) * z.hh;
            const uint8_t *resets = B->frag_resets + (int64_t)s * L->nglobal;
            if (gi == L->nglobal - 1) { /* the sample's last fragment: nothing after it */
                be->memset_zero(D, (size_t)z.hh * sizeof(float));
                continue;
            }
            int j1 = gi + 1; /* the first fragment after gi that resets (its dE is its own dL), else the last */
            while (j1 < L->nglobal - 1 && !resets[j1]) j1++;
            cp_scan_fold(cp, &z, D, s, j1, gi, 1, d);
        }
}

/* ---- conv halo -------------------------------------------------------------------------- */

void cp_gdn_halo_forward(Cp *cp, int layer, void *halo, const void *proj, int ldp, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const int es = be->act_size, w = d->Kc - 1;
    const int64_t tail = (int64_t)w * d->Cc, per_rank = (int64_t)B->samples * L->nlocal * tail;
    RS_CHECK(L->frag_len >= w, "fragments of %lld tokens are shorter than the conv halo (%d)", (long long)L->frag_len,
             w);
    for (int s = 0; proj && s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t i = (int64_t)s * L->nlocal + f, last = cp_frag_row(cp, s, f) + L->frag_len - w;
            be->copy_2d(CP_AT(cp->halo_send, i * tail), CP_AT(proj, last * ldp), w, d->Cc, d->Cc, ldp);
        }
    CommHandle h = {0};
    comm_set_context(cp->comm, layer, "conv halo forward");
    comm_iallgather(cp->comm, COMM_CP, cp->halo_send, cp->halo_recv, per_rank * es, &h);
    comm_wait(cp->comm, &h);
    cp->count.halo_exchanges[layer]++;
    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int gi = L->frag_global[f];
            void *dst = CP_AT(halo, ((int64_t)s * L->nlocal + f) * tail);
            if (gi == 0) { /* the sample's first fragment: nothing before it */
                be->memset_zero(dst, (size_t)(tail * es));
                continue;
            }
            int fp, r = cp_layout_owner(L, gi - 1, &fp);
            be->copy(dst, CP_AT(cp->halo_recv, r * per_rank + ((int64_t)s * L->nlocal + fp) * tail),
                     (size_t)(tail * es));
        }
}

void cp_gdn_halo_backward(Cp *cp, int layer, void *dproj, int ldp, const void *dhalo, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const int es = be->act_size, w = d->Kc - 1;
    const int64_t tail = (int64_t)w * d->Cc, per_rank = (int64_t)B->samples * L->nlocal * tail;
    if (dhalo != cp->halo_send) be->copy(cp->halo_send, dhalo, (size_t)(per_rank * es));
    CommHandle h = {0};
    comm_set_context(cp->comm, layer, "conv halo backward");
    comm_iallgather(cp->comm, COMM_CP, cp->halo_send, cp->halo_recv, per_rank * es, &h);
    comm_wait(cp->comm, &h);
    cp->count.halo_exchanges[layer]++;
    for (int s = 0; dproj && s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            const void *g = cp_gdn_halo_grad(cp, s, f, d);
            if (!g) continue;
            int64_t last = cp_frag_row(cp, s, f) + L->frag_len - w;
            be->add_2d(CP_AT(dproj, last * ldp), g, w, d->Cc, ldp, d->Cc);
        }
}

const void *cp_gdn_halo_grad(const Cp *cp, int s, int f, const CpGdnDims *d) {
    const CpLayout *L = &cp->L;
    const int gi = L->frag_global[f];
    if (gi == L->nglobal - 1) return NULL; /* the sample's last fragment: no successor read its tail */
    const int64_t tail = (int64_t)(d->Kc - 1) * d->Cc, per_rank = (int64_t)cp->batch.samples * L->nlocal * tail;
    int fn, r = cp_layout_owner(L, gi + 1, &fn);
    return (const char *)cp->halo_recv + (r * per_rank + ((int64_t)s * L->nlocal + fn) * tail) * cp->be->act_size;
}
