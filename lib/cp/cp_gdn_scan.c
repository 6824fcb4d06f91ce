/*
 * cp_gdn_scan.c — the GDN core's prefix scan (cp_gdn_scan.h; P >= 5). Per
 * pass, each rank computes its fragments' transitions (M, H) (forward) or
 * (M, dL) (backward), fp32, into fixed-size slots; one all-gather gives
 * every rank every slot, and each rank folds, in global order with the same
 * code, the fragments it needs:
 *     E_g = F_{g-1}( ... F_{j+1}(H_j) ... ),  F_i(S) = M_i S + H_i,
 * from the last fragment j < g that resets (or fragment 0), and the mirror
 * with M^T from the first fragment after g that resets (or the last). Given
 * kept buffers, each fragment's prep is computed once, before its
 * transition, and its forward reads it. Derivation: docs/design/gdn-cp.md.
 *
 * Callers: cp_gdn.c (cp_gdn_forward, cp_gdn_backward).
 */
#include "cp_gdn_scan.h"

#include "core/error.h"
#include "cp_gdn_fragment.h"

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

/* c->states = each local fragment's entry state, c->M = its M: each fragment's transition, one
 * all-gather, the fold in global order. */
void cp_scan_forward(Cp *cp, int layer, const CpGdnCore *c, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const CpScanSizes z = cp_scan_sizes(cp, d);
    for (int64_t i = 0; i < (int64_t)B->samples * L->nlocal; i++) {
        float *M = cp->scan_send + i * z.slot;
        cp_gdn_fragment_transition(cp, M, M + z.mm, c, i, 0, d);
        be->copy(c->M + i * z.mm, M, (size_t)z.mm * sizeof(float));
    }
    cp_scan_allgather(cp, layer, &z, "GDN scan all-gather forward");
    cp->count.scan_allgathers_fwd[layer]++;

    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int gi = L->frag_global[f];
            float *E = c->states + ((int64_t)s * L->nlocal + f) * z.hh;
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

/* cp->dstate = the gradient arriving at each local fragment's exit: each fragment's own state
 * gradient, one all-gather of [M | dL], the reverse fold with M^T. */
void cp_scan_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const CpScanSizes z = cp_scan_sizes(cp, d);
    for (int64_t i = 0; i < (int64_t)B->samples * L->nlocal; i++) {
        float *M = cp->scan_send + i * z.slot;
        be->copy(M, c->M + i * z.mm, (size_t)z.mm * sizeof(float));
        cp_gdn_fragment_dstate(cp, M + z.mm, gr, c, i, d);
    }
    cp_scan_allgather(cp, layer, &z, "GDN scan all-gather backward");
    cp->count.scan_allgathers_bwd[layer]++;

    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int gi = L->frag_global[f];
            float *D = cp->dstate + ((int64_t)s * L->nlocal + f) * z.hh;
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
