/*
 * cp_gdn_fragment.c — one local fragment's delta rule (cp_gdn_fragment.h):
 * the Backend gdn_chunk_* entries called on a fragment's rows of the core
 * (q, k, v, g, beta, o and the gradients at row r0 = cp_frag_row), its
 * doc_pos on the device, its entry state slot and its part of the kept
 * buffer; a forward that writes o is counted in cp->count. A KDA core
 * (c->kda) takes the kda_chunk_* entries, its g rows nv x dk wide.
 *
 * Callers: cp_gdn.c, cp_gdn_scan.c, cp_gdn_chain.c, cp_gdn_hybrid.c.
 */
#include "cp_gdn_fragment.h"

#include "cp.h"
#include "core/error.h"

#define CP_AT(p, off) ((void *)((char *)(p) + (int64_t)(off) * es))

void cp_gdn_mark(Cp *cp, int pass, int t) {
    if (cp->step_mark) cp->step_mark(cp->step_mark_ctx, pass, t, CP_MARK_BEGIN);
}

/* The first local row of local fragment i (= s x nlocal + f), and its doc_pos rows (backend memory) */
static int64_t cp_gdn_row(const Cp *cp, int64_t i) {
    return cp_frag_row(cp, (int)(i / cp->L.nlocal), (int)(i % cp->L.nlocal));
}
static const int32_t *cp_gdn_doc_pos(const Cp *cp, int64_t r0) {
    return cp->batch.doc_pos_dev + (int64_t)cp->L.rank * cp->batch.rows + r0;
}

/* g's (and dg's) row width: a log-decay per value head, or per key channel of each (KDA) */
static int64_t cp_gdn_gw(const CpGdnCore *c, const CpGdnDims *d) {
    return c->kda ? (int64_t)d->nv * d->dk : d->nv;
}

/* Local fragment i's kept buffer, or NULL */
static void *cp_gdn_kept(const CpGdnCore *c, int64_t i) {
    return c->kept ? (char *)c->kept + i * (int64_t)c->kept_bytes : NULL;
}

/* Local fragment i (= s x nlocal + f) of the core: o's rows =, from S0 (NULL: 0); S_final = its exit
 * state when not NULL. Keeps what c->kept says; `in` (backend.h kept_flags): GDN_KEPT_PREP_IN, its kept
 * buffer holds its prep already (cp_gdn_fragment_prep); GDN_KEPT_STATES_IN, its state pass too (the staged
 * chain: o NULL runs that pass alone). A call that writes o counts as one forward. */
void cp_gdn_fragment_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, int64_t i, const float *S0,
                             float *S_final, int in, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    (c->kda ? be->kda_chunk_forward : be->gdn_chunk_forward)(
                          o ? CP_AT(o, r0 * c->ldo) : NULL, S_final, CP_AT(c->q, r0 * c->ldq),
                          CP_AT(c->k, r0 * c->ldq), CP_AT(c->v, r0 * c->ldv), c->g + r0 * cp_gdn_gw(c, d),
                          c->beta + r0 * d->nv, S0, cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv, c->ldq, c->ldv, c->ldo,
                          cp_gdn_kept(c, i), c->kept_kind | in);
    if (o) cp->count.gdn_forwards[layer]++;
}

/* Its prep (the WY factors and gate cumsums) into its kept buffer, for the transition and the forward
 * after it (c->kept only) */
void cp_gdn_fragment_prep(Cp *cp, const CpGdnCore *c, int64_t i, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    (c->kda ? be->kda_chunk_prep : be->gdn_chunk_prep)(cp_gdn_kept(c, i), CP_AT(c->k, r0 * c->ldq),
                       CP_AT(c->v, r0 * c->ldv), c->g + r0 * cp_gdn_gw(c, d),
                       c->beta + r0 * d->nv, cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv, c->ldq,
                       c->ldv, c->kept_kind);
}

/* Its backward: the gradients' rows =, with dS_final (NULL: 0) arriving at its exit; dS0 = the gradient of
 * its entry state when not NULL. */
void cp_gdn_fragment_backward(Cp *cp, const CpGdnGrads *gr, const CpGdnCore *c, int64_t i,
                              const float *dS_final, float *dS0, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i), hh = (int64_t)d->nv * d->dk * d->dv;
    (c->kda ? be->kda_chunk_backward : be->gdn_chunk_backward)(
                           CP_AT(gr->dq, r0 * c->ldq), CP_AT(gr->dk, r0 * c->ldq), CP_AT(gr->dv, r0 * c->ldv),
                           gr->dg + r0 * cp_gdn_gw(c, d), gr->dbeta + r0 * d->nv, dS0, CP_AT(gr->dout, r0 * c->ldo),
                           dS_final, CP_AT(c->q, r0 * c->ldq), CP_AT(c->k, r0 * c->ldq), CP_AT(c->v, r0 * c->ldv),
                           c->g + r0 * cp_gdn_gw(c, d), c->beta + r0 * d->nv, c->states ? c->states + i * hh : NULL,
                           cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv, c->ldq, c->ldv, c->ldo,
                           cp_gdn_kept(c, i), c->kept_kind);
}

/* One stage (backend.h GDN_BWD_*) of its backward, carried in its part of cp->gdn_dkept (which holds every local
 * fragment, or each sample's first: Cp.gdn_dkept_frags): DOUT; STATE with
 * dS_final (NULL: 0) arriving at its exit, dS0 = the gradient of its entry state when not NULL; GRADS */
void cp_gdn_fragment_stage(Cp *cp, int stage, const CpGdnGrads *gr, const CpGdnCore *c, int64_t i,
                           const float *dS_final, float *dS0, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    RS_CHECK(cp->gdn_dkept_frags == 2 || i % 2 == 0, "gdn_dkept holds each sample's first local fragment only");
    const int64_t slot = cp->gdn_dkept_frags == 2 ? i : i / 2;
    (c->kda ? be->kda_chunk_backward_stage : be->gdn_chunk_backward_stage)(
                                 stage, (char *)cp->gdn_dkept + slot * (int64_t)cp->gdn_dkept_one,
                                 CP_AT(gr->dq, r0 * c->ldq), CP_AT(gr->dk, r0 * c->ldq), CP_AT(gr->dv, r0 * c->ldv),
                                 gr->dg + r0 * cp_gdn_gw(c, d), gr->dbeta + r0 * d->nv, dS0,
                                 CP_AT(gr->dout, r0 * c->ldo), dS_final, CP_AT(c->q, r0 * c->ldq),
                                 CP_AT(c->k, r0 * c->ldq), CP_AT(c->v, r0 * c->ldv), c->g + r0 * cp_gdn_gw(c, d),
                                 c->beta + r0 * d->nv,
                                 c->states ? c->states + i * (int64_t)d->nv * d->dk * d->dv : NULL,
                                 cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv, c->ldq, c->ldv,
                                 c->ldo, cp_gdn_kept(c, i), c->kept_kind);
}

/* Its transition: exit = M entry + H; with c->kept its prep first (unless prep_in: cp_gdn_fragment_prep
 * filled it already), into its kept buffer, which the transition reads (and the fragment's forward after it) */
void cp_gdn_fragment_transition(Cp *cp, float *M, float *H, const CpGdnCore *c, int64_t i, int prep_in,
                                const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    if (c->kept && !prep_in) cp_gdn_fragment_prep(cp, c, i, d);
    (c->kda ? be->kda_chunk_transition : be->gdn_chunk_transition)(
                             M, H, CP_AT(c->k, r0 * c->ldq), CP_AT(c->v, r0 * c->ldv), c->g + r0 * cp_gdn_gw(c, d),
                             c->beta + r0 * d->nv, cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv,
                             c->ldq, c->ldv, cp_gdn_kept(c, i), c->kept_kind);
}

/* Its own state gradient dL (gdn_chunk_dstate: through its outputs alone, from dout; the prep from its
 * kept buffer, which its forward filled) */
void cp_gdn_fragment_dstate(Cp *cp, float *dL, const CpGdnGrads *gr, const CpGdnCore *c, int64_t i,
                            const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    (c->kda ? be->kda_chunk_dstate : be->gdn_chunk_dstate)(
                         dL, CP_AT(gr->dout, r0 * c->ldo), CP_AT(c->q, r0 * c->ldq), CP_AT(c->k, r0 * c->ldq),
                         c->g + r0 * cp_gdn_gw(c, d), c->beta + r0 * d->nv, cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk,
                         d->nv, d->dk, d->dv, c->ldq, c->ldo, cp_gdn_kept(c, i), c->kept_kind);
}
