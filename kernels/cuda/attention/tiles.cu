/*
 * tiles.cu — which (64-query, 64-key) tile pairs of an attention call are live: per tile the range of
 * positions and document starts (attn_ranges_kernel), per pair skipped / partial / full as two bitmasks
 * stored twice (rows = query tiles for the forward, rows = key tiles for the backward; attn_pairs_kernel),
 * and the host side every entry shares: the workspace, the argument checks, AttnParams, the tensor maps.
 * A pair is skipped when the two document-start ranges do not overlap or, with `causal`, min pos_k >
 * max pos_q (the cpu kernel's rule, at 64 x 64); it is full (no per-element test) when both tiles lie in
 * one document, every key precedes every query (or !causal) and the key tile is complete.
 * Callers: forward.cu, backward.cu (attention.cuh).
 */
#include "attention.cuh"

/* ---- metadata kernels ------------------------------------------------------------------------ */

/* ranges[t] = {min pos, max pos, min doc start, max doc start} over the rows of tile t: tiles
 * 0..nq-1 of the query block, then nq..nq+nk-1 of the key block. One warp per tile. */
static __global__ void attn_ranges_kernel(int4 *ranges /* (nq+nk) */, const int32_t *pos_q /* (Tq) */,
                                          const int32_t *doc_pos_q /* (Tq) */, const int32_t *pos_k /* (Tk) */,
                                          const int32_t *doc_pos_k /* (Tk) */, int Tq, int Tk, int nq, int nk) {
    const int tile = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), lane = threadIdx.x & 31;
    if (tile >= nq + nk) return;
    const bool is_q = tile < nq;
    const int32_t *pos = is_q ? pos_q : pos_k, *dp = is_q ? doc_pos_q : doc_pos_k;
    const int T = is_q ? Tq : Tk, t0 = (is_q ? tile : tile - nq) * ATTN_TILE;
    const int t1 = min(t0 + ATTN_TILE, T);
    int pmin = INT32_MAX, pmax = INT32_MIN, dmin = INT32_MAX, dmax = INT32_MIN;
    for (int r = t0 + lane; r < t1; r += 32) {
        const int p = pos[r], d = p - dp[r];
        pmin = min(pmin, p);
        pmax = max(pmax, p);
        dmin = min(dmin, d);
        dmax = max(dmax, d);
    }
    pmin = __reduce_min_sync(0xffffffffu, pmin);
    pmax = __reduce_max_sync(0xffffffffu, pmax);
    dmin = __reduce_min_sync(0xffffffffu, dmin);
    dmax = __reduce_max_sync(0xffffffffu, dmax);
    if (lane == 0) ranges[tile] = make_int4(pmin, pmax, dmin, dmax);
}

/* 0: no query of tile q sees a key of tile k; 2: every query sees every key; 1: test each pair */
static __device__ __forceinline__ int attn_pair_class(int4 q, int4 k, bool k_complete, int causal) {
    if (q.w < k.z || k.w < q.z) return 0;          /* document-start ranges disjoint */
    if (causal && k.x > q.y) return 0;              /* every key after every query */
    const bool one_doc = q.z == q.w && k.z == k.w && q.z == k.z;
    return one_doc && k_complete && (!causal || k.y <= q.x) ? 2 : 1;
}

/* One thread per 32-bit word: q_live/q_part (nq, nkw) then k_live/k_part (nk, nqw). */
static __global__ void attn_pairs_kernel(uint32_t *q_live, uint32_t *q_part /* (nq,nkw) */, uint32_t *k_live,
                                         uint32_t *k_part /* (nk,nqw) */, const int4 *ranges /* (nq+nk) */, int nq,
                                         int nk, int nqw, int nkw, int Tk, int causal) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t n1 = (int64_t)nq * nkw, n2 = (int64_t)nk * nqw;
    uint32_t live = 0, part = 0;
    if (idx < n1) {
        const int i = (int)(idx / nkw), w = (int)(idx % nkw);
        const int4 qr = ranges[i];
        for (int b = 0; b < 32; b++) {
            const int j = w * 32 + b;
            if (j >= nk) break;
            const int c = attn_pair_class(qr, ranges[nq + j], (int64_t)(j + 1) * ATTN_TILE <= Tk, causal);
            live |= (uint32_t)(c != 0) << b;
            part |= (uint32_t)(c == 1) << b;
        }
        q_live[idx] = live;
        q_part[idx] = part;
    } else if (idx < n1 + n2) {
        const int64_t e = idx - n1;
        const int j = (int)(e / nqw), w = (int)(e % nqw);
        const int4 kr = ranges[nq + j];
        const bool complete = (int64_t)(j + 1) * ATTN_TILE <= Tk;
        for (int b = 0; b < 32; b++) {
            const int i = w * 32 + b;
            if (i >= nq) break;
            const int c = attn_pair_class(ranges[i], kr, complete, causal);
            live |= (uint32_t)(c != 0) << b;
            part |= (uint32_t)(c == 1) << b;
        }
        k_live[e] = live;
        k_part[e] = part;
    }
}


/* the file's workspace: grown through cuda_internal_alloc (counted in memory_stats), never shrunk; the
 * old one is freed once the device is idle (a host synchronisation on growth only, the first calls) */
static void *attn_ws;
static size_t attn_ws_bytes;

void *attn_workspace(size_t bytes) {
    if (bytes > attn_ws_bytes) {
        if (attn_ws) {
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
            cuda_internal_free(attn_ws, attn_ws_bytes);
        }
        bytes += bytes / 4; /* headroom for slightly larger calls */
        attn_ws = cuda_internal_alloc(bytes);
        attn_ws_bytes = bytes;
    }
    return attn_ws;
}

size_t attn_align(size_t n) { return (n + 255) & ~(size_t)255; }

int attn_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

void attn_check_args(const char *who, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk,
                            int ldo) {
    RS_CHECK(Tq >= 0 && Tk >= 0 && Tq <= (int64_t)65535 * ATTN_TILE && Tk <= (int64_t)65535 * ATTN_TILE,
             "%s: Tq = %lld, Tk = %lld (the cuda kernel supports 0..%d rows per block)", who, (long long)Tq,
             (long long)Tk, 65535 * ATTN_TILE);
    RS_CHECK(nh > 0 && nkv > 0 && nh % nkv == 0, "%s: nh = %d must be a positive multiple of nkv = %d", who, nh, nkv);
    RS_CHECK(hd == 64 || hd == 128 || hd == 256, "%s: hd = %d (the cuda kernel supports 64, 128, 256)", who, hd);
    RS_CHECK(ldq >= nh * hd && ldo >= nh * hd && ldk >= nkv * hd,
             "%s: ldq = %d, ldo = %d (need >= %d), ldk = %d (need >= %d)", who, ldq, ldo, nh * hd, ldk, nkv * hd);
    RS_CHECK(ldq % 8 == 0 && ldk % 8 == 0 && ldo % 8 == 0,
             "%s: ldq = %d, ldk = %d, ldo = %d must be multiples of 8 (16-byte rows)", who, ldq, ldk, ldo);
}

/* Fills the metadata part of p (tile counts, bitmasks; lse2/D space when `bwd`) and launches the
 * ranges and pairs kernels. Returns the workspace's lse2/D area (bwd) or NULL. */
/* the backward's semaphore words: dq_sem (nh,nq), kv_sem (nkv,nk,2), kb_started (nh,nk) */
size_t attn_sem_count(const AttnParams *p) {
    return (size_t)p->nh * p->nq + (size_t)p->nkv * p->nk * 2 + (size_t)p->nh * p->nk;
}

float *attn_plan(AttnParams *p, int bwd) {
    p->nq = (p->Tq + ATTN_TILE - 1) / ATTN_TILE;
    p->nk = (p->Tk + ATTN_TILE - 1) / ATTN_TILE;
    p->nqw = (p->nq + 31) / 32;
    p->nkw = (p->nk + 31) / 32;
    p->Tq_pad = p->nq * ATTN_TILE;
    const size_t b_ranges = attn_align((size_t)(p->nq + p->nk) * sizeof(int4));
    const size_t b_qmask = attn_align((size_t)p->nq * p->nkw * 4), b_kmask = attn_align((size_t)p->nk * p->nqw * 4);
    const size_t b_stats = bwd ? attn_align((size_t)p->nh * p->Tq_pad * 4) : 0;
    const size_t n_sem = bwd ? attn_sem_count(p) : 0; /* dq_sem, kv_sem, kb_started */
    const size_t b_sem = attn_align(n_sem * 4);
    unsigned char *ws =
        (unsigned char *)attn_workspace(b_ranges + 2 * b_qmask + 2 * b_kmask + 2 * b_stats + b_sem + 256);
    p->dq_sem = bwd ? (uint32_t *)(ws + b_ranges + 2 * b_qmask + 2 * b_kmask + 2 * b_stats) : NULL;
    p->kv_sem = bwd ? p->dq_sem + (size_t)p->nh * p->nq : NULL;
    p->kb_started = bwd ? p->kv_sem + (size_t)p->nkv * p->nk * 2 : NULL;
    int4 *ranges = (int4 *)ws;
    uint32_t *q_live = (uint32_t *)(ws + b_ranges), *q_part = (uint32_t *)(ws + b_ranges + b_qmask);
    uint32_t *k_live = (uint32_t *)(ws + b_ranges + 2 * b_qmask);
    uint32_t *k_part = (uint32_t *)(ws + b_ranges + 2 * b_qmask + b_kmask);
    p->q_live = q_live, p->q_part = q_part, p->k_live = k_live, p->k_part = k_part;
    cudaStream_t s = cuda_stream();
    if (p->nq > 0 && p->nk > 0) {
        const int tiles = p->nq + p->nk;
        attn_ranges_kernel<<<(tiles + 7) / 8, 256, 0, s>>>(ranges, p->pos_q, p->doc_pos_q, p->pos_k, p->doc_pos_k,
                                                            p->Tq, p->Tk, p->nq, p->nk);
        CUDA_LAUNCH_CHECK();
        const int64_t words = (int64_t)p->nq * p->nkw + (int64_t)p->nk * p->nqw;
        attn_pairs_kernel<<<(unsigned)((words + 255) / 256), 256, 0, s>>>(q_live, q_part, k_live, k_part, ranges,
                                                                          p->nq, p->nk, p->nqw, p->nkw, p->Tk,
                                                                          p->causal);
        CUDA_LAUNCH_CHECK();
    }
    return bwd ? (float *)(ws + b_ranges + 2 * b_qmask + 2 * b_kmask) : NULL;
}

AttnParams attn_params(const void *q, const void *k, const void *v, const int32_t *pos_q,
                              const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, int64_t Tq,
                              int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal) {
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.q = (const bf16 *)q, p.k = (const bf16 *)k, p.v = (const bf16 *)v;
    p.pos_q = pos_q, p.doc_pos_q = doc_pos_q, p.pos_k = pos_k, p.doc_pos_k = doc_pos_k;
    p.Tq = (int)Tq, p.Tk = (int)Tk, p.nh = nh, p.nkv = nkv, p.group = nh / nkv;
    p.ldq = ldq, p.ldk = ldk, p.ldo = ldo, p.causal = causal != 0;
    p.scale = (float)(1.0 / sqrt((double)hd));
    p.scale_log2 = (float)(1.4426950408889634 / sqrt((double)hd));
    return p;
}


typedef CUresult (*AttnEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* a 2-d tensor map of bf16 (esize 2) or fp32 (esize 4) over `rows` rows of `cols` columns from `base` (row
 * stride ld elements): boxes of 128 bytes of columns (128-byte swizzle) by box_rows rows; rows past the end
 * read as zeros (and are dropped by a reduce) */
void attn_tmap_e(CUtensorMap *m, const void *base, int64_t rows, int cols, int ld, int box_rows, int esize) {
    static AttnEncodeTiled encode;
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                                    cudaEnableDefault, &q));
        RS_CHECK(q == cudaDriverEntryPointSuccess && encode, "cuda attention: cuTensorMapEncodeTiled not found");
    }
    RS_CHECK(esize == 2 || esize == 4, "attn_tmap_e: element size %d", esize);
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * esize};
    const cuuint32_t box[2] = {(cuuint32_t)(128 / esize), (cuuint32_t)box_rows}, estr[2] = {1, 1};
    const CUresult r = encode(m, esize == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                              (void *)base, dims, strides, box, estr,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    RS_CHECK(r == CUDA_SUCCESS, "cuda attention: cuTensorMapEncodeTiled failed (%d): rows %lld cols %d ld %d",
             (int)r, (long long)rows, cols, ld);
}
void attn_tmap(CUtensorMap *m, const void *base, int64_t rows, int cols, int ld, int box_rows) {
    attn_tmap_e(m, base, rows, cols, ld, box_rows, 2);
}

