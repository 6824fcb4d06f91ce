/*
 * test_attn_hint.c — the host summary of a block attention call's rows
 * (lib/backend/attn_hint.h) and the cuDNN route's workspace layout
 * (kernels/cuda/attention/cudnn_graph.h cdg_workspace); run by build/test_ops, no GPU.
 *
 *   attn_hint_fold       on ring-shaped calls of random document layouts (zigzag fragments at P = 2 and 4,
 *                        documents crossing fragments, dense rectangles cut at a document start, empty and
 *                        one-row sides, a rank's two segments in one call), three summaries agree field by
 *                        field: attn_hint_rows (what lib/cp/cp_ring.c passes), the device's reduction
 *                        (cuda_attention_cudnn_glue.cu: blocks of threads each folding a strided share,
 *                        joined in a shuffled order, as the atomics may) and a reference written from the
 *                        definitions; and cdg_route decides the same from each. Also a rank's own block at
 *                        step 0 (both sides its two fragments, positions rising with a gap; and the other
 *                        way round). Wherever the route is cuDNN's, its mask (every key, or top-left causal
 *                        by row index) equals ours (documents, causal by pos) on every (query, key) pair
 *   attn_hint_must_fail  a hint of other rows (one document start moved by one token, one position
 *                        shifted) differs from the rows', and cpu_attention_forward given it exits non-zero
 *                        (in a child process) while the right hint passes; a hint whose document runs
 *                        (runs, run_max, runs_clean) differ from the rows' differs too
 *   attn_cudnn_workspace the layout's regions are 256-byte aligned, disjoint, each as large as its tensor,
 *                        present by direction and form (no dq accumulator for cudnn_det), and the total is
 *                        the header's formula; the variable-length layout's too (lengths, offsets, GQA's
 *                        per-head dk, dv) beside the one-sequence regions
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attention/cudnn_graph.h"
#include "backend/attn_hint.h"
#include "cpu_kernels.h"
#include "test_util.h"

/* pos/doc_pos of global tokens [lo, hi) of a sample whose documents start at starts[0..ns) (and 0) */
static void th_rows(int32_t *pos, int32_t *doc_pos, int64_t lo, int64_t hi, const int64_t *starts, int ns) {
    for (int64_t g = lo; g < hi; g++) {
        int64_t s0 = 0;
        for (int i = 0; i < ns; i++)
            if (starts[i] <= g && starts[i] > s0) s0 = starts[i];
        pos[g - lo] = (int32_t)g;
        doc_pos[g - lo] = (int32_t)(g - s0);
    }
}

/* the summary from its definition, written apart from the fold */
static AttnHint th_reference(const int32_t *pq, const int32_t *dq, int64_t Tq, const int32_t *pk, const int32_t *dk,
                             int64_t Tk) {
    AttnHint h = {INT32_MAX, INT32_MIN, 1, 1, Tq ? pq[0] : 0, Tk ? pk[0] : 0, INT32_MAX, INT32_MIN, 1, Tq == Tk,
                  0, 0, 1};
    for (int64_t i = 0; i < Tq; i++) {
        if (i && pq[i] <= pq[i - 1]) h.rising = 0;
        if (i < Tk && (pq[i] != pk[i] || dq[i] != dk[i])) h.same_pos = 0;
        /* runs: a run begins at row 0 and wherever the document start changes; its length so far is the rows
         * since then, capped by doc_pos + 1 (what the fold computes without looking back) */
        if (i == 0 || pq[i] - dq[i] != pq[i - 1] - dq[i - 1]) {
            h.runs++;
            if (i && dq[i] != 0) h.runs_clean = 0;
        }
        if (dq[i] < 0) h.runs_clean = 0;
        if ((dq[i] < i ? dq[i] : i) + 1 > h.run_max) h.run_max = (int32_t)((dq[i] < i ? dq[i] : i) + 1);
        h.doc_min = pq[i] - dq[i] < h.doc_min ? pq[i] - dq[i] : h.doc_min;
        h.doc_max = pq[i] - dq[i] > h.doc_max ? pq[i] - dq[i] : h.doc_max;
        h.pos_q_min = pq[i] < h.pos_q_min ? pq[i] : h.pos_q_min;
        if (i && pq[i] != pq[i - 1] + 1) h.q_consec = 0;
    }
    for (int64_t j = 0; j < Tk; j++) {
        if (j && pk[j] <= pk[j - 1]) h.rising = 0;
        h.doc_min = pk[j] - dk[j] < h.doc_min ? pk[j] - dk[j] : h.doc_min;
        h.doc_max = pk[j] - dk[j] > h.doc_max ? pk[j] - dk[j] : h.doc_max;
        h.pos_k_max = pk[j] > h.pos_k_max ? pk[j] : h.pos_k_max;
        if (j && pk[j] != pk[j - 1] + 1) h.k_consec = 0;
    }
    return h;
}

/* the device's order: nthreads threads, thread t folding rows t, t + nthreads, ... of the Tq + Tk rows (q
 * first), the partial summaries joined in a shuffled order */
static AttnHint th_strided(const int32_t *pq, const int32_t *dq, int64_t Tq, const int32_t *pk, const int32_t *dk,
                           int64_t Tk, int nthreads) {
    AttnHint part[64];
    const int32_t q0 = Tq ? pq[0] : 0, k0 = Tk ? pk[0] : 0;
    for (int t = 0; t < nthreads; t++) {
        part[t] = attn_hint_begin(q0, k0);
        for (int64_t i = t; i < Tq + Tk; i += nthreads) {
            const int is_k = i >= Tq;
            const int64_t r = is_k ? i - Tq : i;
            attn_hint_add(&part[t], is_k, r, pq, dq, Tq, pk, dk, Tk);
        }
    }
    for (int t = nthreads - 1; t > 0; t--) { /* shuffle */
        int u = (int)(test_uniform() * (t + 1));
        AttnHint x = part[t];
        part[t] = part[u], part[u] = x;
    }
    AttnHint h = attn_hint_begin(q0, k0);
    for (int t = 0; t < nthreads; t++) attn_hint_join(&h, &part[t]);
    return h;
}

TEST(attn_hint_fold) {
    enum { N = 40, MAXP = 4 };
    static int32_t pq[N], dq[N], pk[N], dk[N];
    int64_t calls = 0, bad = 0, routed[CDG_ROUTE_COUNT] = {0}, own_causal = 0;
    test_rng_seed(22);
    for (int trial = 0; trial < 600; trial++) {
        const int P = trial % 2 ? 2 : MAXP, nseg = 2 * P;
        int64_t starts[6];
        const int ns = trial % 7 == 0 || trial % 12 == 5 ? 0 : 1 + (int)(test_uniform() * 5);
        for (int i = 0; i < ns; i++) starts[i] = 1 + (int64_t)(test_uniform() * (nseg * N - 1));
        int a = (int)(test_uniform() * nseg), b = (int)(test_uniform() * nseg);
        if (a < b) { int t = a; a = b; b = t; }
        th_rows(pq, dq, (int64_t)a * N, (int64_t)(a + 1) * N, starts, ns);
        th_rows(pk, dk, (int64_t)b * N, (int64_t)(b + 1) * N, starts, ns);
        if (trial % 3 == 1) { /* a rank's rows [seg r | seg 2P-1-r] in one call: positions with a gap */
            int32_t *pos = trial % 2 ? pq : pk, *dp = trial % 2 ? dq : dk;
            const int g = trial % 2 ? a : b, other = nseg - 1 - g;
            th_rows(pos, dp, (int64_t)g * N, (int64_t)g * N + N / 2, starts, ns);
            th_rows(pos + N / 2, dp + N / 2, (int64_t)other * N, (int64_t)other * N + N / 2, starts, ns);
        }
        if (trial % 6 == 5) { /* a rank's own block at ring step 0: q rows = k rows = [seg a | seg 2P-1-a] */
            th_rows(pq, dq, (int64_t)a * N, (int64_t)a * N + N / 2, starts, ns);
            th_rows(pq + N / 2, dq + N / 2, (int64_t)(nseg - 1 - a) * N, (int64_t)(nseg - 1 - a) * N + N / 2, starts,
                    ns);
            if (trial % 4 == 1) { /* its fragments the other way round: positions fall once */
                memcpy(pk, pq + N / 2, N / 2 * sizeof *pq), memcpy(pk + N / 2, pq, N / 2 * sizeof *pq);
                memcpy(pq, pk, sizeof pq), memcpy(dk, dq + N / 2, N / 2 * sizeof *dq);
                memcpy(dk + N / 2, dq, N / 2 * sizeof *dq), memcpy(dq, dk, sizeof dq);
            }
            memcpy(pk, pq, sizeof pk), memcpy(dk, dq, sizeof dk);
        }
        /* the ring's shapes: the whole pair, a rectangle (queries up to a document start x keys from one on),
         * and odd sizes: empty and one-row sides */
        int64_t q0 = 0, nq = N, k0 = 0, nk = N;
        switch (trial % 5) {
        case 1: nq = 1 + (int64_t)(test_uniform() * N), k0 = (int64_t)(test_uniform() * N), nk = N - k0; break;
        case 2: nq = trial % 3 ? 0 : 1; break;
        case 3: nk = trial % 3 ? 0 : 1; break;
        case 4: q0 = (int64_t)(test_uniform() * N), nq = N - q0; break;
        }
        const int causal = trial % 4 != 3;
        const AttnHint ref = th_reference(pq + q0, dq + q0, nq, pk + k0, dk + k0, nk);
        const AttnHint rows = attn_hint_rows(pq + q0, dq + q0, nq, pk + k0, dk + k0, nk);
        const AttnHint dev = th_strided(pq + q0, dq + q0, nq, pk + k0, dk + k0, nk, 1 + trial % 64);
        const int f1 = attn_hint_differs(&rows, &ref), f2 = attn_hint_differs(&dev, &ref);
        const CdgRoute r = cdg_route(&ref, nq, nk, 16, 2, 128, causal, NULL);
        const int route_differs = cdg_route(&rows, nq, nk, 16, 2, 128, causal, NULL) != r ||
                                  cdg_route(&dev, nq, nk, 16, 2, 128, causal, NULL) != r;
        if ((f1 >= 0 || f2 >= 0 || route_differs) && bad++ < 3)
            EXPECT(0, "trial %d (P %d, q frag %d [%lld, +%lld), k frag %d [%lld, +%lld), %d starts): rows' %s %d, "
                      "strided %s %d, reference %d / %d, routes differ %d",
                   trial, P, a, (long long)q0, (long long)nq, b, (long long)k0, (long long)nk, ns,
                   attn_hint_field_name(f1), f1 >= 0 ? attn_hint_field(&rows, f1) : 0, attn_hint_field_name(f2),
                   f2 >= 0 ? attn_hint_field(&dev, f2) : 0, f1 >= 0 ? attn_hint_field(&ref, f1) : 0,
                   f2 >= 0 ? attn_hint_field(&ref, f2) : 0, route_differs);
        /* the mask cuDNN applies on its route (every key, key row j <= query row i, or that within each run of
         * the query rows for variable length) is ours exactly */
        int64_t wrong = 0;
        int run[N];
        for (int64_t i = 0; i < nq; i++)
            run[i] = i == 0 ? 0 : run[i - 1] + (pq[q0 + i] - dq[q0 + i] != pq[q0 + i - 1] - dq[q0 + i - 1]);
        for (int64_t i = 0; r != CDG_ROUTE_OURS && i < nq; i++)
            for (int64_t j = 0; j < nk; j++) {
                const int ours = pq[q0 + i] - dq[q0 + i] == pk[k0 + j] - dk[k0 + j] &&
                                 (!causal || pk[k0 + j] <= pq[q0 + i]);
                const int theirs = r == CDG_ROUTE_DENSE || (j <= i && (r != CDG_ROUTE_VARLEN || run[i] == run[j]));
                wrong += ours != theirs;
            }
        if (wrong && bad++ < 3)
            EXPECT(0, "trial %d: route %d masks %lld (query, key) pairs differently from ours", trial, (int)r,
                   (long long)wrong);
        calls++;
        routed[r]++;
        own_causal += trial % 6 == 5 && r == CDG_ROUTE_CAUSAL;
    }
    printf("attn_hint_fold: %lld calls, summaries and masks equal on %lld; routes ours %lld, cuDNN dense %lld, "
           "causal %lld (a rank's own block: %lld), variable length %lld\n",
           (long long)calls, (long long)(calls - bad), (long long)routed[CDG_ROUTE_OURS],
           (long long)routed[CDG_ROUTE_DENSE], (long long)routed[CDG_ROUTE_CAUSAL], (long long)own_causal,
           (long long)routed[CDG_ROUTE_VARLEN]);
    EXPECT(bad == 0, "%lld calls with differing summaries or routes", (long long)bad);
    EXPECT(own_causal >= 3, "only %lld of a rank's own blocks went to cuDNN causal", (long long)own_causal);
    EXPECT(routed[CDG_ROUTE_OURS] > 50 && routed[CDG_ROUTE_DENSE] > 20 && routed[CDG_ROUTE_CAUSAL] > 5,
           "too few calls of one route: %lld / %lld / %lld", (long long)routed[0], (long long)routed[1],
           (long long)routed[2]);
}

/* cpu_attention_forward with this hint in a child process; its exit status */
static int th_forward_status(const AttnHint *hint, const int32_t *pos, const int32_t *doc_pos, int64_t T) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        enum { NH = 2, HD = 8 };
        float *q = calloc((size_t)(T * NH * HD), sizeof(float)), *out = calloc((size_t)(T * NH * HD), sizeof(float));
        float *lse = calloc((size_t)(T * NH), sizeof(float));
        for (int64_t i = 0; i < T * NH * HD; i++) q[i] = (float)((i * 7919) % 13) / 13.0f - 0.4f;
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        cpu_attention_forward(out, lse, q, q, q, pos, doc_pos, pos, doc_pos, hint, T, T, NH, NH, HD, NH * HD,
                              NH * HD, NH * HD, 1);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(attn_hint_must_fail) {
    enum { N = 64 };
    int32_t pos[N], dp[N], pos2[N], dp2[N];
    int64_t cut[1] = {23}, moved[1] = {24};
    th_rows(pos, dp, 0, N, cut, 1);
    const AttnHint right = attn_hint_rows(pos, dp, N, pos, dp, N);
    th_rows(pos2, dp2, 0, N, moved, 1);
    const AttnHint other_doc = attn_hint_rows(pos2, dp2, N, pos2, dp2, N);
    th_rows(pos2, dp2, 1, N + 1, cut, 1);
    const AttnHint shifted = attn_hint_rows(pos2, dp2, N, pos2, dp2, N);
    const int f1 = attn_hint_differs(&other_doc, &right), f2 = attn_hint_differs(&shifted, &right);
    printf("document start moved: %s differs; positions shifted: %s differs\n", attn_hint_field_name(f1),
           attn_hint_field_name(f2));
    EXPECT(f1 >= 0 && f2 >= 0, "a hint of other rows equals the rows': %d %d", f1, f2);
    const int ok = th_forward_status(&right, pos, dp, N), wrong = th_forward_status(&other_doc, pos, dp, N);
    const int none = th_forward_status(NULL, pos, dp, N);
    printf("cpu_attention_forward exit status: right hint %d, wrong hint %d, no hint %d\n", ok, wrong, none);
    EXPECT(ok == 0 && none == 0, "the right hint or none failed: %d %d", ok, none);
    EXPECT(wrong != 0, "a wrong hint passed the cpu backend's check");
    /* the document runs' fields take part in the check: each one off, the rest right */
    for (int f = 0; f < 3; f++) {
        AttnHint t = right;
        if (f == 0) t.runs++;
        else if (f == 1) t.run_max--;
        else t.runs_clean = 0;
        const int d = attn_hint_differs(&t, &right);
        EXPECT(d >= 10 && strcmp(attn_hint_field_name(d), f == 0 ? "runs" : f == 1 ? "run_max" : "runs_clean") == 0,
               "run field %d: differs at %s", f, attn_hint_field_name(d));
        EXPECT(th_forward_status(&t, pos, dp, N) != 0, "a hint with run field %d wrong passed the cpu check", f);
    }
    EXPECT(right.runs == 2 && right.run_max == N - 23 && right.runs_clean, "runs %d, run_max %d, clean %d",
           right.runs, right.run_max, right.runs_clean);
}

TEST(attn_cudnn_workspace) {
    const int shapes[][3] = {{16, 2, 128}, {16, 16, 128}, {8, 1, 256}, {4, 4, 64}};
    const int64_t Ts[][2] = {{333, 197}, {4096, 4096}, {262144, 262144}, {1, 77}};
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
            for (int mode = 0; mode < 3; mode++) {
                const int nh = shapes[s][0], nkv = shapes[s][1], hd = shapes[s][2], bwd = mode > 0, det = mode == 2;
                const int64_t Tq = Ts[t][0], Tk = Ts[t][1];
                CdgWorkspace w;
                cdg_workspace(&w, Tq, Tk, nh, nkv, hd, 3 * nh * hd, 5 * nkv * hd, bwd, det, 0); /* ld unused */
                const int64_t off[6] = {w.stats, w.softmax_sum, w.dq_accum, w.dq, w.dk, w.dv};
                const int64_t need[6] = {Tq * nh * 4, Tq * nh * 4, Tq * nh * hd * 4, Tq * nh * hd * 2,
                                         Tk * nkv * hd * 2, Tk * nkv * hd * 2};
                const int present[6] = {1, bwd, bwd && !det, bwd, bwd, bwd};
                for (int i = 0; i < 6; i++) {
                    EXPECT((off[i] >= 0) == present[i], "region %d present %d, want %d", i, off[i] >= 0, present[i]);
                    if (off[i] < 0) continue;
                    EXPECT(off[i] % 256 == 0 && off[i] + need[i] <= w.bytes, "region %d at %lld of %lld bytes", i,
                           (long long)off[i], (long long)w.bytes);
                    for (int j = 0; j < i; j++)
                        if (off[j] >= 0)
                            EXPECT(off[j] + need[j] <= off[i] || off[i] + need[i] <= off[j],
                                   "regions %d and %d overlap", j, i);
                }
#define R256(x) (((x) + 255) / 256 * 256)
                int64_t want = R256(Tq * nh * 4);
                if (bwd) want += R256(Tq * nh * 4) + (det ? 0 : R256(Tq * nh * hd * 4)) + R256(Tq * nh * hd * 2) +
                                 2 * R256(Tk * nkv * hd * 2);
#undef R256
                EXPECT(w.bytes == want, "total %lld, formula %lld", (long long)w.bytes, (long long)want);
                n++;
            }
    /* variable length: the one-sequence regions with the gradients in their inputs' row strides (q's ldq, k's
     * and v's ldk: cudnn_graph.h), then the lengths, the offsets and GQA's per-head dk, dv (rows of ldk g) */
    for (int gqa = 0; gqa < 2; gqa++)
        for (int bwd = 0; bwd < 2; bwd++) {
            const int64_t T = 4000;
            const int nh = 16, nkv = gqa ? 2 : 16, hd = 128, batch = 32, ldq = nh * hd + 64, ldk = 2 * nkv * hd;
            CdgWorkspace w, d;
            cdg_workspace(&w, T, T, nh, nkv, hd, ldq, ldk, bwd, 0, batch);
            cdg_workspace(&d, T, T, nh, nkv, hd, ldq, ldk, bwd, 0, 0);
            int64_t off[16], need[16];
            int k = 0;
            off[k] = w.stats, need[k++] = T * nh * 4;
            if (bwd) {
                off[k] = w.softmax_sum, need[k++] = T * nh * 4;
                off[k] = w.dq_accum, need[k++] = T * ldq * 4;
                off[k] = w.dq, need[k++] = T * ldq * 2;
                off[k] = w.dk, need[k++] = T * ldk * 2; /* dv interleaved: nkv hd after dk, the same rows */
                EXPECT(w.dv == w.dk + (int64_t)nkv * hd * 2, "dv not interleaved with dk");
            }
            off[k] = w.seq, need[k++] = batch * 4;
            for (int i = 0; i < CDG_NOFF; i++) off[k] = w.off[i], need[k++] = (batch + 1) * 8;
            EXPECT((w.dk_full >= 0) == (bwd && gqa) && (w.dv_full >= 0) == (bwd && gqa), "per-head regions");
            if (w.dk_full >= 0) off[k] = w.dk_full, need[k++] = T * ldk * (nh / nkv) * 2;
            if (w.dv_full >= 0) off[k] = w.dv_full, need[k++] = T * ldk * (nh / nkv) * 2;
            for (int i = 0; i < k; i++) {
                EXPECT(off[i] >= 0 && off[i] % 256 == 0 && off[i] + need[i] <= w.bytes, "varlen region %d", i);
                for (int j = 0; j < i; j++)
                    EXPECT(off[j] + need[j] <= off[i] || off[i] + need[i] <= off[j], "varlen regions %d, %d overlap",
                           j, i);
            }
            EXPECT(w.stats == d.stats && w.softmax_sum == d.softmax_sum && w.bytes > d.bytes,
                   "varlen regions moved the others");
            n++;
        }
    CdgWorkspace w;
    cdg_workspace(&w, 262144, 262144, 16, 2, 128, 16 * 128, 2 * 2 * 128, 1, 0, 0);
    printf("attn_cudnn_workspace: %d layouts; the 1M cp 2 backward (256k rows, 16/2/128, cudnn): %.2f GiB\n", n,
           w.bytes / 1073741824.0);
}
