/*
 * index.cuh — the chunk index of a KDA call, on the device (no host round trip): starts[c] the first token of
 * chunk c (a chunk starts every 64 tokens of a document, counted from the document's first token or from token
 * 0: cpu_kda.c's chunking), starts[nc] = T, meta[KDA_META_NC] = nc. One block of 1024 threads walks the tokens
 * in tiles of 1024 with a block-wide exclusive scan of the start flags (the order of the starts is the token
 * order). Part of kda.cu.
 */
#pragma once

enum { KDA_META_NC = 0, KDA_META_N = 4 };

KDA_DEV bool kda_is_chunk_start(const int32_t *doc_pos, int64_t t) {
    int64_t base = t - (int64_t)doc_pos[t]; /* the document's first token, or before the call */
    if (base < 0) base = 0;
    return ((t - base) & (KDA_C - 1)) == 0;
}

__global__ void __launch_bounds__(1024) kda_index_kernel(int32_t *starts /* (T+1) */, int32_t *meta /* (KDA_META_N) */,
                                                         const int32_t *doc_pos /* (T) */, int64_t T) {
    __shared__ int s_w[32];
    __shared__ int s_tot, s_base;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    if (tid == 0) s_base = 0;
    __syncthreads();
    for (int64_t b = 0; b < T; b += 1024) {
        const int64_t t = b + tid;
        const bool flag = t < T && kda_is_chunk_start(doc_pos, t);
        const unsigned bal = __ballot_sync(KDA_FULL, flag);
        if (lane == 0) s_w[w] = __popc(bal);
        __syncthreads();
        if (w == 0) {
            const int v = s_w[lane];
            int x = v;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(KDA_FULL, x, o);
                if (lane >= o) x += y;
            }
            s_w[lane] = x - v; /* exclusive */
            if (lane == 31) s_tot = x;
        }
        __syncthreads();
        if (flag) starts[s_base + s_w[w] + __popc(bal & ((1u << lane) - 1u))] = (int32_t)t;
        __syncthreads();
        if (tid == 0) s_base += s_tot;
        __syncthreads();
    }
    if (tid == 0) {
        meta[KDA_META_NC] = s_base;
        starts[s_base] = (int32_t)T;
    }
}
