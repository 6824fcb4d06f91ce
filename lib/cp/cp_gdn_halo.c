/*
 * cp_gdn_halo.c — the causal conv's halo across the CP group (cp.h): the
 * forward is one all-gather of every local fragment's last Kc-1 pre-conv
 * rows (halo_send -> halo_recv), and each fragment takes its predecessor's
 * (zeros for a sample's first fragment); the backward all-gathers the halo's
 * gradient the same way and adds each fragment's part into its owner's last
 * rows (cp_gdn_halo_grad locates it).
 *
 * Callers: lib/model/model_block.c (GDN layers), bench/bench_cp.c, tests/cp.
 */
#include "cp.h"
#include "core/error.h"

#define CP_AT(p, off) ((void *)((char *)(p) + (int64_t)(off) * es))

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
