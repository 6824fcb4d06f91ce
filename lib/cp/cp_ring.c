/*
 * cp_ring.c — load-balanced (zigzag) ring attention, forward and backward, over the backend's block
 * attention entries (attention_forward, attention_backward, attention_merge; cp.h has the interface).
 * Rows: each rank's two zigzag fragments of every sample, q (T_loc, nh hd), K|V (T_loc, 2 nkv hd).
 *
 * Step t of P: rank r holds the K|V block of owner (r - t) mod P. Each (query fragment a, key fragment b)
 * pair is the causal diagonal (a == b, step 0), one dense rectangle of the one document that can span
 * both (a > b; skipped when none does), or skipped (a < b): without documents exactly the zigzag rule,
 * the same work on every rank at every step. Every decision reads the gathered metadata (CpBatch), so
 * ranks agree without communication; the kernels apply the exact mask inside each call, so a step's calls
 * of one sample may also run as ONE call over their bounding box (Cp.ring_calls, parallel.ring_calls:
 * auto takes the box where the backend runs it fast, Backend attention_fast). Each call carries its
 * AttnHint (lib/backend/attn_hint.h), so a backend choosing its kernel by the mask never reads back.
 *
 * Forward: the next step's K|V exchange is posted before this step's calls and waited after them;
 * each call's block output and LSE fold into fp32 running (out, lse) (attention_merge, -inf = no key).
 * Backward (ring-flash-attention's order): K|V travels the ring again, dQ accumulates locally in fp32,
 * the held block's fp32 dK|dV partial is added to the one arriving from the previous rank and passed on,
 * one step behind K|V; the last hop delivers each block's complete partial to its owner. It uses the
 * final merged out and lse, so every block sees the global probabilities. At P = 2 with Cp.ring_keep_kv
 * the forward keeps the received block (kv_kept) and the backward exchanges no K|V: the other rank's
 * block first, its dK|dV sent home while the own block runs; a per-layer flag refuses a backward
 * without its forward.
 *
 * Design (the step rule's derivation, the merge, the kept block): docs/design/ring-attention.md.
 * Callers: lib/model/model_block.c (every softmax layer, every P), bench/bench_cp.c, tests/cp.
 */
#include <string.h>

#include "cp.h"
#include "core/error.h"

#define CP_AT_ES(p, off, es) ((void *)((char *)(p) + (int64_t)(off) * (es)))
#define CP_AT(p, off) CP_AT_ES(p, off, es)

enum { CP_TAG_KV = 11, CP_TAG_DKV = 12 };

static void cp_ring_mark(Cp *cp, int pass, int t, int phase) {
    if (cp->step_mark) cp->step_mark(cp->step_mark_ctx, pass, t, phase);
}

/* One (query rows, key rows) call of a ring step: rows are local rows of the micro-batch on
 * this rank (queries) and on the owner (keys); hint summarises their pos/doc_pos, from the batch's
 * host copies, for the backend's choice of kernel (lib/backend/attn_hint.h: no read-back from the device). */
typedef struct {
    int64_t  q0, nq, k0, nk;
    int      causal;
    AttnHint hint;
} CpPair;

/* p's hint, from the host copies of the query rank's and the owner's rows */
static void cp_ring_hint(CpPair *p, const int32_t *pos_q, const int32_t *doc_q, const int32_t *pos_k,
                         const int32_t *doc_k) {
    p->hint = attn_hint_rows(pos_q + p->q0, doc_q + p->q0, p->nq, pos_k + p->k0, doc_k + p->k0, p->nk);
}

static int cp_ring_fast(const Cp *cp, const CpPair *p, const CpAttnDims *d) {
    return !cp->be->attention_fast || cp->be->attention_fast(&p->hint, p->nq, p->nk, d->nh, d->nkv, d->hd, p->causal);
}

/* The calls of step t (owner j) for sample s: the rule's, at most nlocal x nlocal, or their bounding box
 * (Cp.ring_calls; the header says when). Returns how many. */
static int cp_ring_pairs(const Cp *cp, int j, int s, const CpAttnDims *d, CpPair *out) {
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const int64_t n = L->frag_len;
    const int32_t *pos_q = B->pos + (int64_t)L->rank * B->rows, *doc_q = B->doc_pos + (int64_t)L->rank * B->rows;
    const int32_t *pos_k = B->pos + (int64_t)j * B->rows, *doc_k = B->doc_pos + (int64_t)j * B->rows;
    int np = 0;
    for (int qf = 0; qf < L->nlocal; qf++)
        for (int kf = 0; kf < L->nlocal; kf++) {
            int a = L->frag_global[qf];
            int b = L->P == 1 ? 0 : (kf == 0 ? j : 2 * L->P - 1 - j);
            int64_t q0 = cp_frag_row(cp, s, qf), k0 = cp_frag_row(cp, s, kf);
            if (a < b) continue;
            if (a == b) {
                out[np++] = (CpPair){q0, n, k0, n, 1, {0}};
                continue;
            }
            /* the first query's document began at global position d0; the key fragment covers
             * [b n, (b+1) n) */
            int64_t d0 = (int64_t)pos_q[q0] - doc_q[q0];
            if (d0 >= (int64_t)(b + 1) * n) continue;
            int64_t skip = d0 > (int64_t)b * n ? d0 - (int64_t)b * n : 0;
            int64_t nq = 1;
            while (nq < n && doc_q[q0 + nq] != 0) nq++;
            out[np++] = (CpPair){q0, nq, k0 + skip, n - skip, 0, {0}};
        }
    int hinted = 0; /* the pairs' hints are computed only where the choice or the calls read them */
    if (cp->ring_calls != RING_CALLS_PAIRS && np > 1) { /* the pairs' bounding box, causal by pos */
        int64_t q1 = out[0].q0 + out[0].nq, k1 = out[0].k0 + out[0].nk;
        CpPair w = {out[0].q0, 0, out[0].k0, 0, 1, {0}};
        for (int i = 1; i < np; i++) {
            const CpPair *p = &out[i];
            if (p->q0 < w.q0) w.q0 = p->q0;
            if (p->k0 < w.k0) w.k0 = p->k0;
            if (p->q0 + p->nq > q1) q1 = p->q0 + p->nq;
            if (p->k0 + p->nk > k1) k1 = p->k0 + p->nk;
        }
        w.nq = q1 - w.q0;
        w.nk = k1 - w.k0;
        cp_ring_hint(&w, pos_q, doc_q, pos_k, doc_k);
        int whole = cp->ring_calls == RING_CALLS_STEPS || cp_ring_fast(cp, &w, d);
        if (!whole) { /* auto, the box slow: still the box unless the kernel runs half the rule's work fast */
            double all = 0, fast = 0; /* the pairs' areas (half of a causal one's): their work, about */
            for (int i = 0; i < np; i++) {
                CpPair *p = &out[i];
                cp_ring_hint(p, pos_q, doc_q, pos_k, doc_k);
                const double area = (double)p->nq * p->nk * (p->causal ? 0.5 : 1.0);
                all += area;
                if (cp_ring_fast(cp, p, d)) fast += area;
            }
            hinted = 1;
            whole = 2 * fast < all;
        }
        if (whole) out[0] = w, np = 1, hinted = 1;
    }
    for (int i = 0; !hinted && i < np; i++) cp_ring_hint(&out[i], pos_q, doc_q, pos_k, doc_k);
    return np;
}

/* the K|V block layer `layer`'s forward keeps for its backward (ring_keep_kv: P = 2, the other rank's) */
static void *cp_ring_kept(const Cp *cp, int layer, const CpAttnDims *d) {
    RS_CHECK(cp->kv_slot[layer] >= 0, "layer %d has no softmax attention (no kept K|V slot)", layer);
    return CP_AT_ES(cp->kv_kept, (int64_t)cp->kv_slot[layer] * cp->batch.rows * 2 * d->nkv * d->hd, cp->be->act_size);
}

void cp_ring_forward(Cp *cp, int layer, void *out, float *lse, const void *q, const void *kv, const CpAttnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const int es = be->act_size, P = L->P, r = L->rank;
    const int qd = d->nh * d->hd, kvd = d->nkv * d->hd, ldk = 2 * kvd;
    const int64_t rows = B->rows;
    const int32_t *pos_q = B->pos_dev + (int64_t)r * rows, *doc_q = B->doc_pos_dev + (int64_t)r * rows;

    /* running (out, lse) start as "no key seen" */
    be->memset_zero(cp->run_out, (size_t)rows * qd * sizeof(float));
    be->copy(cp->run_lse, cp->lse_empty, (size_t)rows * d->nh * sizeof(float));

    const void *cur = kv;
    CommHandle h = {0};
    comm_set_context(cp->comm, layer, "ring attention forward");
    for (int t = 0; t < P; t++) {
        int j = (r - t + P) % P;
        void *next = cp->ring_keep_kv ? cp_ring_kept(cp, layer, d) : cp->kv_recv[(t + 1) % 2];
        cp_ring_mark(cp, 0, t, CP_MARK_BEGIN);
        if (t < P - 1) {
            comm_isendrecv(cp->comm, COMM_CP, cur, (r + 1) % P, next, (r - 1 + P) % P,
                           rows * ldk * es, CP_TAG_KV, &h);
        }
        cp_ring_mark(cp, 0, t, CP_MARK_POSTED);
        const int32_t *pos_k = B->pos_dev + (int64_t)j * rows, *doc_k = B->doc_pos_dev + (int64_t)j * rows;
        for (int s = 0; s < B->samples; s++) {
            CpPair pr[4];
            int np = cp_ring_pairs(cp, j, s, d, pr);
            for (int i = 0; i < np; i++) {
                const CpPair *p = &pr[i];
                be->attention_forward(CP_AT(cp->blk_out, p->q0 * qd), cp->blk_lse + p->q0 * d->nh,
                                      CP_AT(q, p->q0 * qd), CP_AT(cur, p->k0 * ldk), CP_AT(cur, p->k0 * ldk + kvd),
                                      pos_q + p->q0, doc_q + p->q0, pos_k + p->k0, doc_k + p->k0, &p->hint, p->nq,
                                      p->nk, d->nh, d->nkv, d->hd, qd, ldk, qd, p->causal);
                be->attention_merge(cp->run_out + p->q0 * qd, cp->run_lse + p->q0 * d->nh,
                                    CP_AT(cp->blk_out, p->q0 * qd), cp->blk_lse + p->q0 * d->nh, p->nq, d->nh, d->hd,
                                    qd);
                cp->count.attn_kernel_calls[layer]++;
                if (t < P - 1) comm_progress(cp->comm, &h); /* MPI moves large messages only inside calls */
            }
        }
        cp_ring_mark(cp, 0, t, CP_MARK_COMPUTED);
        if (t < P - 1) {
            comm_wait(cp->comm, &h);
            cur = next;
            cp->count.ring_hops_fwd[layer]++;
        }
        cp_ring_mark(cp, 0, t, CP_MARK_END);
    }
    be->act_from_f32(out, cp->run_out, rows * qd);
    be->copy(lse, cp->run_lse, (size_t)rows * d->nh * sizeof(float));
    if (cp->ring_keep_kv) cp->kv_kept_ok[layer] = 1;
    cp->count.attn_forwards[layer]++;
    if (P > 1) cp->count.ring_passes_fwd[layer]++;
}

/* The backward's calls of one owner's block (owner j, its K|V block kvb): dq_acc += their dQ, dkv = their dK|dV
 * contributions to the block (zeroed first). */
static void cp_ring_backward_block(Cp *cp, int j, float *dkv, const void *kvb, const void *dout,
                                   const void *out, const float *lse, const void *q, const CpAttnDims *d,
                                   CommHandle *h_kv, CommHandle *h_dkv) {
    const Backend *be = cp->be;
    const CpBatch *B = &cp->batch;
    const int es = be->act_size, r = cp->L.rank;
    const int qd = d->nh * d->hd, kvd = d->nkv * d->hd, ldk = 2 * kvd;
    const int64_t rows = B->rows;
    const int32_t *pos_q = B->pos_dev + (int64_t)r * rows, *doc_q = B->doc_pos_dev + (int64_t)r * rows;
    const int32_t *pos_k = B->pos_dev + (int64_t)j * rows, *doc_k = B->doc_pos_dev + (int64_t)j * rows;
    be->memset_zero(dkv, (size_t)(rows * ldk) * sizeof(float));
    for (int s = 0; s < B->samples; s++) {
        CpPair pr[4];
        int np = cp_ring_pairs(cp, j, s, d, pr);
        for (int i = 0; i < np; i++) {
            const CpPair *p = &pr[i];
            be->attention_backward(cp->dq_acc + p->q0 * qd, dkv + p->k0 * ldk, dkv + p->k0 * ldk + kvd,
                                   CP_AT(dout, p->q0 * qd), CP_AT(out, p->q0 * qd), lse + p->q0 * d->nh,
                                   CP_AT(q, p->q0 * qd), CP_AT(kvb, p->k0 * ldk), CP_AT(kvb, p->k0 * ldk + kvd),
                                   pos_q + p->q0, doc_q + p->q0, pos_k + p->k0, doc_k + p->k0, &p->hint, p->nq, p->nk,
                                   d->nh, d->nkv, d->hd, qd, ldk, qd, p->causal);
            if (h_kv) comm_progress(cp->comm, h_kv); /* MPI moves large messages only inside calls */
            if (h_dkv) comm_progress(cp->comm, h_dkv);
        }
    }
}

/* P = 2 with the K|V the forward kept (ring_keep_kv): the other rank's block first, its dK|dV contributions sent
 * home while the own block runs, then added to the own block's (the header says why). Returns the own block's
 * complete fp32 dK|dV. */
static const float *cp_ring_backward_kept(Cp *cp, int layer, const void *dout, const void *out, const float *lse,
                                          const void *q, const void *kv, const CpAttnDims *d) {
    const Backend *be = cp->be;
    const int r = cp->L.rank, other = 1 - r;
    const int64_t nkv_el = cp->batch.rows * 2 * d->nkv * d->hd;
    RS_CHECK(cp->kv_kept_ok[layer], "ring attention backward of layer %d: no forward kept its K|V since the last "
             "backward (parallel.ring_keep_kv: each backward reads its own forward's)", layer);
    cp->kv_kept_ok[layer] = 0;
    CommHandle h = {0};
    cp_ring_mark(cp, 1, 0, CP_MARK_BEGIN);
    cp_ring_mark(cp, 1, 0, CP_MARK_POSTED);
    cp_ring_backward_block(cp, other, cp->dkv_local, cp_ring_kept(cp, layer, d), dout, out, lse, q, d, NULL,
                           NULL);
    cp_ring_mark(cp, 1, 0, CP_MARK_COMPUTED);
    comm_isendrecv(cp->comm, COMM_CP, cp->dkv_local, other, cp->dkv_buf[0], other,
                   nkv_el * (int64_t)sizeof(float), CP_TAG_DKV, &h);
    cp_ring_mark(cp, 1, 0, CP_MARK_END);
    cp_ring_mark(cp, 1, 1, CP_MARK_BEGIN);
    cp_ring_mark(cp, 1, 1, CP_MARK_POSTED);
    cp_ring_backward_block(cp, r, cp->dkv_buf[1], kv, dout, out, lse, q, d, NULL, &h);
    cp_ring_mark(cp, 1, 1, CP_MARK_COMPUTED);
    comm_wait(cp->comm, &h); /* the other rank's contributions to our block */
    be->add_f32(cp->dkv_buf[1], cp->dkv_buf[0], nkv_el);
    cp_ring_mark(cp, 1, 1, CP_MARK_END);
    cp->count.ring_passes_bwd[layer]++;
    return cp->dkv_buf[1];
}

/* ring-flash-attention's order, any P: K|V travels the ring again, each block's dK|dV partial one step behind it
 * (the header says how). Returns the own block's complete fp32 dK|dV. */
static const float *cp_ring_backward_passed(Cp *cp, int layer, const void *dout, const void *out, const float *lse,
                                            const void *q, const void *kv, const CpAttnDims *d) {
    const Backend *be = cp->be;
    const int es = be->act_size, P = cp->L.P, r = cp->L.rank;
    const int64_t nkv_el = cp->batch.rows * 2 * d->nkv * d->hd;
    const int next_rank = (r + 1) % P, prev_rank = (r - 1 + P) % P;
    const void *cur = kv;
    const float *own = cp->dkv_local; /* P = 1: this step's contributions are the whole gradient */
    CommHandle h_kv = {0}, h_dkv = {0};
    for (int t = 0; t < P; t++) {
        int j = (r - t + P) % P;
        void *next = cp->kv_recv[(t + 1) % 2];
        cp_ring_mark(cp, 1, t, CP_MARK_BEGIN);
        if (t < P - 1)
            comm_isendrecv(cp->comm, COMM_CP, cur, next_rank, next, prev_rank, nkv_el * es, CP_TAG_KV, &h_kv);
        cp_ring_mark(cp, 1, t, CP_MARK_POSTED);
        cp_ring_backward_block(cp, j, cp->dkv_local, cur, dout, out, lse, q, d, t < P - 1 ? &h_kv : NULL,
                               P > 1 ? &h_dkv : NULL);
        cp_ring_mark(cp, 1, t, CP_MARK_COMPUTED);
        if (P > 1) {
            /* the partial of block j: ours alone at t = 0, else the one that arrived plus ours */
            float *part = cp->dkv_buf[t % 2];
            if (t == 0) be->copy(part, cp->dkv_local, (size_t)nkv_el * sizeof(float));
            else {
                comm_wait(cp->comm, &h_dkv);
                be->add_f32(part, cp->dkv_local, nkv_el);
            }
            comm_isendrecv(cp->comm, COMM_CP, part, next_rank, cp->dkv_buf[(t + 1) % 2], prev_rank,
                           nkv_el * (int64_t)sizeof(float), CP_TAG_DKV, &h_dkv);
        }
        if (t < P - 1) {
            comm_wait(cp->comm, &h_kv);
            cur = next;
        }
        cp_ring_mark(cp, 1, t, CP_MARK_END);
    }
    if (P > 1) {
        comm_wait(cp->comm, &h_dkv); /* our own block, complete, from the previous rank */
        own = cp->dkv_buf[P % 2];
        cp->count.ring_passes_bwd[layer]++;
    }
    return own;
}

void cp_ring_backward(Cp *cp, int layer, void *dq, void *dkv, const void *dout, const void *out, const float *lse,
                      const void *q, const void *kv, const CpAttnDims *d) {
    const Backend *be = cp->be;
    const int64_t rows = cp->batch.rows, qd = (int64_t)d->nh * d->hd, nkv_el = rows * 2 * d->nkv * d->hd;
    be->memset_zero(cp->dq_acc, (size_t)(rows * qd) * sizeof(float));
    comm_set_context(cp->comm, layer, "ring attention backward");
    const float *own = cp->ring_keep_kv ? cp_ring_backward_kept(cp, layer, dout, out, lse, q, kv, d)
                                        : cp_ring_backward_passed(cp, layer, dout, out, lse, q, kv, d);
    be->act_from_f32(dq, cp->dq_acc, rows * qd);
    be->act_from_f32(dkv, own, nkv_el);
}
