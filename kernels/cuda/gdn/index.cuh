/*
 * index.cuh — the chunk index of a GDN call, on the device (no host round trip): chunk starts from
 * doc_pos (a chunk starts every 64 tokens of a document, counted from the document's first token or from
 * token 0), the first and last chunk that starts a document, (t0, L, flags) per chunk, and the cuts of the
 * document segments a state pass runs side by side (with the dual launch's pick). Part of gdn.cu.
 */
#pragma once

/* ------------------------------------------------------------------------------------------------ */
/* index: chunk starts from doc_pos                                                                   */

GDN_DEV bool gdn_is_chunk_start(const int32_t *doc_pos, int64_t t) {
    int64_t base = t - (int64_t)doc_pos[t]; /* the document's first token, or before the call */
    if (base < 0) base = 0;
    return ((t - base) & (GDN_C - 1)) == 0;
}

/* per block of 1024 tokens: number of chunk starts, first and last document start token */
__global__ void __launch_bounds__(1024) gdn_index_count_kernel(int32_t *blk /* (nb,3) */,
                                                               const int32_t *doc_pos /* (T) */, int64_t T) {
    __shared__ int s_cnt[32], s_first[32], s_last[32];
    const int64_t t = (int64_t)blockIdx.x * 1024 + threadIdx.x;
    const bool in = t < T;
    const int flag = in && gdn_is_chunk_start(doc_pos, t);
    const bool rs = in && doc_pos[t] == 0;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int cnt = __reduce_add_sync(GDN_FULL, flag);
    int first = __reduce_min_sync(GDN_FULL, rs ? (int)t : INT_MAX);
    int last = __reduce_max_sync(GDN_FULL, rs ? (int)t : -1);
    if (lane == 0) {
        s_cnt[w] = cnt;
        s_first[w] = first;
        s_last[w] = last;
    }
    __syncthreads();
    if (w == 0) {
        cnt = __reduce_add_sync(GDN_FULL, s_cnt[lane]);
        first = __reduce_min_sync(GDN_FULL, s_first[lane]);
        last = __reduce_max_sync(GDN_FULL, s_last[lane]);
        if (lane == 0) {
            blk[3 * blockIdx.x] = cnt;
            blk[3 * blockIdx.x + 1] = first;
            blk[3 * blockIdx.x + 2] = last;
        }
    }
}

/* one block: blk counts -> exclusive offsets (in place); meta; starts[NC] = T */
__global__ void __launch_bounds__(1024) gdn_index_scan_kernel(int32_t *blk /* (nb,3) */, int32_t *meta,
                                                              int32_t *starts /* (T+1) */, int nb, int64_t T) {
    __shared__ int s_w[32], s_first[32], s_last[32];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int running = 0, first = INT_MAX, last = -1;
    for (int base = 0; base < nb; base += 1024) {
        const int b = base + threadIdx.x;
        const int v = b < nb ? blk[3 * b] : 0;
        if (b < nb) {
            first = min(first, blk[3 * b + 1]);
            last = max(last, blk[3 * b + 2]);
        }
        int x = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(GDN_FULL, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) s_w[w] = x;
        __syncthreads();
        if (w == 0) {
            int y = s_w[lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int z = __shfl_up_sync(GDN_FULL, y, o);
                if (lane >= o) y += z;
            }
            s_w[lane] = y;
        }
        __syncthreads();
        const int excl = running + (w > 0 ? s_w[w - 1] : 0) + x - v;
        const int total = s_w[31];
        __syncthreads();
        if (b < nb) blk[3 * b] = excl;
        running += total;
    }
    first = __reduce_min_sync(GDN_FULL, first);
    last = __reduce_max_sync(GDN_FULL, last);
    if (lane == 0) {
        s_first[w] = first;
        s_last[w] = last;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < 32; i++) {
            first = min(first, s_first[i]);
            last = max(last, s_last[i]);
        }
        meta[GDN_META_NC] = running;
        meta[GDN_META_FIRST_RESET] = running; /* none: every chunk is before the first reset */
        meta[GDN_META_LAST_RESET] = 0;        /* none: the transition starts at chunk 0 */
        meta[GDN_META_FIRST_TOK] = first == INT_MAX ? -1 : first;
        meta[GDN_META_LAST_TOK] = last;
        starts[running] = (int32_t)T;
    }
}

/* starts[idx] = t for every chunk start t; the chunk indices of the first and last document start */
__global__ void __launch_bounds__(1024) gdn_index_write_kernel(int32_t *starts, int32_t *meta,
                                                               const int32_t *blk /* (nb,3) */,
                                                               const int32_t *doc_pos, int64_t T) {
    __shared__ int s_w[32];
    const int64_t t = (int64_t)blockIdx.x * 1024 + threadIdx.x;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool flag = t < T && gdn_is_chunk_start(doc_pos, t);
    const unsigned bal = __ballot_sync(GDN_FULL, flag);
    if (lane == 0) s_w[w] = __popc(bal);
    __syncthreads();
    if (w == 0) {
        const int v = s_w[lane];
        int x = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(GDN_FULL, x, o);
            if (lane >= o) x += y;
        }
        s_w[lane] = x - v;
    }
    __syncthreads();
    if (flag) {
        const int idx = blk[3 * blockIdx.x] + s_w[w] + __popc(bal & ((1u << lane) - 1u));
        starts[idx] = (int32_t)t;
        if (t == meta[GDN_META_FIRST_TOK]) meta[GDN_META_FIRST_RESET] = idx;
        if (t == meta[GDN_META_LAST_TOK]) meta[GDN_META_LAST_RESET] = idx;
    }
}

/* info[c] = (t0, L, flags) per chunk, for the state passes (one load per chunk, prefetched):
 * flags bit 0: the chunk starts a document (its state starts at 0); bit 1: a state leaves it
 * (the call ends with it, or the next chunk continues its document) */
__global__ void gdn_index_info_kernel(int4 *info /* (T+1) */, const int32_t *starts, const int32_t *meta,
                                      const int32_t *doc_pos, int64_t T) {
    const int nc = meta[GDN_META_NC];
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < nc; c += gridDim.x * blockDim.x) {
        const int t0 = starts[c], t1 = starts[c + 1];
        const int flags = (doc_pos[t0] == 0 ? 1 : 0) | ((t1 == T || doc_pos[t1] != 0) ? 2 : 0);
        info[c] = make_int4(t0, t1 - t0, flags, 0);
    }
}

/* cuts (Z + 1) of the document segments of the state passes (gdn/state_pass.cuh, gdn_doc_range) over all
 * chunks: cuts[0] = 0, cuts[Z] = nc, cuts[p] = the first chunk at or after p nc / Zc that starts a
 * document (nc if none, and for p >= Zc), so the cuts never decrease. Zc = Z; with wave > 0, where more
 * than `wave` segments have work (more than one wave of the pass's blocks), Zc = Z / 2: many documents
 * fill the GPU in fewer, longer segments, while a few get one segment each (the longest segment is then
 * the longest document). One block; each thread keeps the first hit of its strided walk, the block takes
 * the smallest. With pick (the dual launch, gdn/state_pass.cuh): *pick = 1 when the non-empty segments
 * times bps (state column blocks per segment) reach need, else 0. */
__global__ void __launch_bounds__(1024) gdn_index_cuts_kernel(int32_t *cuts /* (Z+1) */, const int4 *info,
                                                              const int32_t *meta, int Z, int32_t *pick, int bps,
                                                              int64_t need, int wave) {
    __shared__ int s_min[32], s_used;
    const int nc = meta[GDN_META_NC];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int Zc = Z;; Zc /= 2) {
        for (int p = 1; p < Z; p++) {
            int best = nc;
            if (p < Zc) {
                const int target = (int)((int64_t)nc * p / Zc);
                for (int c = target + (int)threadIdx.x; c < nc; c += blockDim.x)
                    if (info[c].z & 1) {
                        best = c;
                        break;
                    }
            }
            best = __reduce_min_sync(GDN_FULL, best);
            if (lane == 0) s_min[w] = best;
            __syncthreads();
            if (threadIdx.x == 0) {
                for (int i = 1; i < nw; i++) best = min(best, s_min[i]);
                cuts[p] = min(best, s_min[0]);
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            cuts[0] = 0;
            cuts[Z] = nc;
            int used = 0;
            for (int p = 0; p < Z; p++) used += cuts[p + 1] > cuts[p] ? 1 : 0;
            s_used = used;
        }
        __syncthreads();
        if (wave <= 0 || s_used <= wave || Zc < Z || Zc < 2) break;
        __syncthreads(); /* every thread has read s_used before thread 0 writes it again */
    }
    if (threadIdx.x == 0 && pick) *pick = (int64_t)s_used * bps >= need ? 1 : 0;
}

