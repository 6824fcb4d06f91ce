/*
 * backward.cu — the attention backward (Backend attention_backward, cuda_attention_backward): dq (Tq,ldq),
 * dk, dv (Tk,ldk) fp32 += the gradients of out given dout, the forward's out and lse (cuda_kernels.h).
 * attn_bwd_prep_kernel turns lse into lse log2(e) and computes D = rowsum(dout * out); then one kernel
 * computes dK, dV and dQ: one block per (query head, key block of 128 keys, 64 at hd 256) keeps dK, dV
 * of its keys in registers while the live query tiles stream through a TMA ring; each tile's dQ = dS K is
 * staged in shared memory and added to dq by TMA reduce-adds in key-block order (a semaphore per query
 * tile: the same bits on every run; cuda_attention_tune.h's dq_atomic drops the order for measurement).
 * At hd 256 the two consumers split the tile's queries for S^T and dP^T and stage dQ in the tile's own
 * ring stage; above ATTN_BWD_THROTTLE_MIN_TK keys the throttled instance keeps a head's key blocks within
 * ATTN_BWD_THROTTLE tiles of each other. GQA heads add to dk, dv in head order (a semaphore per key block).
 * Callers: the Backend table, lib/cp/cp_ring.c, tests/cuda/test_cuda_attention.cu.
 */
#include "attention.cuh"
#include "cuda_attention_tune.h"
#include "cuda_kernels.h"

/* lse2 = lse log2(e) (+inf for lse = -inf and for pad rows), D = rowsum(dout * out) (0 there);
 * one warp per (row, head), layout (nh, Tq_pad). */
static __global__ void attn_bwd_prep_kernel(float *lse2 /* (nh,Tq_pad) */, float *D /* (nh,Tq_pad) */,
                                            const bf16 *dout /* (Tq,ldo) */, const bf16 *out /* (Tq,ldo) */,
                                            const float *lse /* (Tq,nh) */, int Tq, int Tq_pad, int nh, int hd,
                                            int ldo) {
    const int64_t w = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= (int64_t)Tq_pad * nh) return;
    const int i = (int)(w / nh), h = (int)(w % nh);
    float l2 = INFINITY, d = 0.0f;
    if (i < Tq) {
        const float L = lse[(int64_t)i * nh + h];
        if (L != -INFINITY) {
            const __nv_bfloat162 *a = reinterpret_cast<const __nv_bfloat162 *>(dout + (int64_t)i * ldo + (int64_t)h * hd);
            const __nv_bfloat162 *b = reinterpret_cast<const __nv_bfloat162 *>(out + (int64_t)i * ldo + (int64_t)h * hd);
            for (int c = lane; c < hd / 2; c += 32) {
                const float2 x = __bfloat1622float2(a[c]), y = __bfloat1622float2(b[c]);
                d += x.x * y.x + x.y * y.y;
            }
            for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
            l2 = L * ATTN_LOG2E;
        }
    }
    if (lane == 0) {
        lse2[(int64_t)h * Tq_pad + i] = l2;
        D[(int64_t)h * Tq_pad + i] = d;
    }
}

/* ---- the kernel: dK, dV and dQ in one ----------------------------------------------------------- */

#define ATTN_BWD_THROTTLE_MIN_TK 65536 /* hd 256: above this many keys the backward runs with ATTN_BWD_THROTTLE: at
                                         * very long key ranges the unthrottled backward's time varies widely from call to
                                         * call (a head's key blocks drift apart and stop sharing Q, dO in L2); at shorter
                                         * ones the throttle costs more than it saves (docs/design/attention-kernels.md) */
#define ATTN_BWD_THROTTLE 4 /* W > ST (hd 256, above ATTN_BWD_THROTTLE_MIN_TK keys): a block's producer loads query
                              * tile i only once the next key block of its head, if started and live there, has added
                              * tile i - W, so a head's key blocks stay within W tiles of each other and share Q, dO
                              * in L2 */

/* The block: own K, V (its key block), Q, dO streamed in 64-query tiles, plus two dS^T buffers
 * (row = key, 64 query columns, 128-byte swizzle: the M-major A operand of dQ = dS K). Without SPLIT
 * the two consumers' 64-key halves fill one buffer (double-buffered over tiles, one 256-thread barrier
 * per tile); with SPLIT (hd 256) both consumers hold the same dS^T and each writes its own buffer. */
template <int HD>
struct AttnBwdCfg {
    static constexpr bool SPLIT = HD == 256;
    static constexpr int ROWS = SPLIT ? 64 : 128; /* keys per block */
    static constexpr int OUTW = SPLIT ? 128 : HD; /* dK, dV columns per consumer */
    /* BULK (hd 64 / 128): the consumers write scale dQ (fp32, 64 queries x their 64 columns)
     * to a staging buffer in 32-column boxes of 64 rows (128-byte swizzle) instead of red.global adds; the
     * sequencer thread waits for the previous key block, adds the buffer to dq with one TMA reduce per box
     * and releases the semaphore once the reduce is complete */
    static constexpr bool BULK = !SPLIT;
    /* QSTG (hd 256): the consumers split the tile's 64 queries for S^T and dP^T (32 each, no product computed
     * twice) and meet through four buffers of ds_bytes: P^T and dS^T, by tile parity; scale dQ (fp32, 64 queries x 256) staged in the tile's own ring stage once both consumers' products
     * that read it are complete (consumer 0's 128 columns over Q, consumer 1's over dO: 4 boxes of 32 columns
     * each), added by the sequencer's TMA reduces as in BULK; the sequencer, not the consumers, then frees the
     * stage for the producer */
    static constexpr bool QSTG = SPLIT;
    /* Q/dO ring stages; hd 128: 2 with BULK (3 do not fit beside its 32 KB staging), else 3 */
    static constexpr int ST = HD == 64 ? 4 : HD == 128 ? (BULK ? 2 : 3) : 2;
    static constexpr int DQB = BULK ? (HD == 64 ? 2 : HD / 32) : QSTG ? 8 : 0; /* 32-column boxes of 8 KB staged per tile */
    static constexpr int DQS = BULK ? 2 : ST; /* staging buffers, by tile (BULK: 1 is slower) */
    static constexpr int PANELS = HD / 64;
    static constexpr int DQC = HD == 64 ? 1 : HD / 128; /* 64-column dQ chunks per consumer (hd 64: consumer 0 only) */
    static constexpr int own_bytes = ROWS * HD * 2;
    static constexpr int tile_bytes = ATTN_TILE * HD * 2;
    static constexpr int ds_bytes = (SPLIT ? 64 : ROWS) * 128; /* one dS^T buffer (bf16, 64 query columns) */
    static constexpr int NDS = QSTG ? 4 : 2; /* buffers of ds_bytes */
    static constexpr int meta_bytes = 4 * ATTN_TILE * 4;       /* lse2, D, pos, doc_pos of the streamed queries */
    static constexpr int off_b = own_bytes;
    static constexpr int off_x = 2 * own_bytes;
    static constexpr int off_y = off_x + ST * tile_bytes;
    static constexpr int off_ds = off_y + ST * tile_bytes;
    static constexpr int off_meta = off_ds + NDS * ds_bytes;
    static constexpr int off_dqs = off_meta + ST * meta_bytes; /* BULK: DQS dQ staging buffers of DQB boxes */
    static constexpr int off_bar = off_dqs + (BULK ? DQS * DQB * 8192 : 0); /* own, full[ST], empty[ST], go[2],
                                              * done[2], ds_full[2], ds_empty[2]; BULK: staged[2], staging free[2]
                                              * in the go, done slots; QSTG: staged[ST] in go, stage read[ST] in
                                              * ds_full, and empty[ST] is the sequencer's (count 1) */
    /* + 896: the base (128-byte aligned, checked in the kernel) rounded up to 1024 */
    static constexpr int bytes = off_bar + 8 * (1 + 2 * ST + 8) + 896;
    static_assert(off_dqs % 1024 == 0 && bytes <= 227 * 1024, "bwd3 shared memory");
    static constexpr int DQT = HD == 64 ? 128 : 256; /* consumer threads that arrive on done */
    /* the register split (setmaxnreg): 128 REG_P + 256 REG_C <= 64512 (384 threads x 168), multiples of 8 */
    static constexpr int REG_C = 224, REG_P = 56;
    static_assert(128 * REG_P + 256 * REG_C <= 64512 && REG_P % 8 == 0 && REG_C % 8 == 0, "bwd3 register split");
};

/* the backward's P^T in place, for this thread's NB x 8 streamed queries of a tile: c[4 nb + 2 rr + e] (own key rr: kpos,
 * kdoc) from S^T to exp2(S^T scale_log2 - lse2) of query c0 + 8 nb + 2 t + e (the stage's metadata mi / mf), 0
 * where the query cannot see the key (part: the tile is partly masked) */
template <int NB>
static __device__ __forceinline__ void attn_bwd_p(float (&c)[4 * NB], const int *mi, const float *mf, int c0, int t,
                                                   bool part, int causal, const int (&kpos)[2], const int (&kdoc)[2],
                                                   float sl2) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int q = c0 + nb * 8 + 2 * t + e;
            const float lc = mf[q];
            const int qp = mi[2 * ATTN_TILE + q], qd = qp - mi[3 * ATTN_TILE + q];
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const bool vis = !part || (kdoc[rr] == qd && (!causal || kpos[rr] <= qp));
                c[4 * nb + 2 * rr + e] = vis ? exp2f(fmaf(c[4 * nb + 2 * rr + e], sl2, -lc)) : 0.0f;
            }
        }
}

/* the backward's dS^T in place: dp[i] (dP^T) = pt[i] (P^T) (dP^T - D) for the same queries as attn_bwd_p (D: the stage's
 * row statistics, mf + ATTN_TILE) */
template <int NB>
static __device__ __forceinline__ void attn_bwd_ds(float (&dp)[4 * NB], const float (&pt)[4 * NB], const float *D,
                                                    int c0, int t) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float dc = D[c0 + nb * 8 + 2 * t + e];
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int i = 4 * nb + 2 * rr + e;
                dp[i] = pt[i] * (dp[i] - dc);
            }
        }
}

/* grid (nkv, key blocks of ROWS), in key-block order: block rb of kv head kvh streams, for each query
 * head h of the group, the live 64-query tiles i and per tile adds dQ_i += scale dS_i K_rb to dq in
 * key-block order. The order is kept by a semaphore per (h, i, consumer column half): p.dq_sem holds
 * the number (block + 1) of the last key block that added, the block waits for the value written by the
 * previous live key block of tile i (from the q_live row of i, the same bitmask that decides which
 * blocks stream i) and writes rb + 1 after its adds. A waiter's predecessor has a lower block index, so
 * it was dispatched first and is resident or finished (blocks are dispatched in index order); it never
 * waits on a later block, so the chain always moves. p.dq_order = 0 drops the waits (plain fp32
 * atomics, not reproducible: the measured comparison). */
template <int HD, int TW_ = 0>
static __global__ void __launch_bounds__(AWG_THREADS, 1)
    attn_backward_kernel(const AttnParams p, const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                     const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
                     const __grid_constant__ CUtensorMap tm_dq) {
    typedef AttnBwdCfg<HD> C;
    constexpr int ROWS = C::ROWS, ST = C::ST, OUTW = C::OUTW, NO = OUTW / 2, KT = ROWS / ATTN_TILE;
    extern __shared__ __align__(128) unsigned char attn_smem[]; /* the base is rounded up to 1024 below */
    const uint32_t raw = ptx_smem_addr(attn_smem), base = (raw + 1023u) & ~1023u;
    unsigned char *meta_g = attn_smem + (base - raw) + C::off_meta; /* stage s: 4 arrays of 64 words */
    const uint32_t sK = base, sV = base + C::off_b, sQ = base + C::off_x, sO = base + C::off_y, sDS = base + C::off_ds;
    const uint32_t bar_own = base + C::off_bar, bar_full = bar_own + 8, bar_empty = bar_full + 8 * ST;
    const uint32_t bar_go = bar_empty + 8 * ST, bar_done = bar_go + 16; /* two each, by tile parity */
    const uint32_t bar_dsf = bar_done + 16, bar_dse = bar_dsf + 16;      /* two each, by dS^T buffer */
    const uint32_t bar_stg = bar_go, bar_dqfree = C::QSTG ? bar_empty : bar_done; /* BULK, QSTG: staged, staging free */
    const uint32_t bar_used = bar_dsf; /* QSTG: both consumers' products that read ring stage s complete */
    const uint32_t sDQ = base + C::off_dqs;

    const int tid = threadIdx.x, wg = tid >> 7;
    const int h0 = blockIdx.x, kvh = h0 / p.group, rb = blockIdx.y; /* query head h0, key block rb (heaviest first) */
    const int t0 = rb * KT;
    const uint32_t *live_a = p.k_live + (int64_t)t0 * p.nqw;
    const uint32_t *live_b = (!C::SPLIT && t0 + 1 < p.nk) ? p.k_live + (int64_t)(t0 + 1) * p.nqw : nullptr;
    auto next_tile = [&](int from) -> int {
        int a = attn_next_live(live_a, p.nqw, from);
        if (live_b) {
            const int b = attn_next_live(live_b, p.nqw, from);
            if (b >= 0 && (a < 0 || b < a)) a = b;
        }
        return a;
    };
    const int first = next_tile(0);
    if (first < 0) return; /* nothing visible: every gradient += 0, no dq semaphore is this block's */

    if (tid == 0) {
        if (raw & 127u) __trap(); /* C::bytes assumes a 128-byte aligned dynamic shared memory base */
        ptx_mbar_init(bar_own, 1);
        for (int s = 0; s < ST; s++) {
            ptx_mbar_init(bar_full + 8 * s, 32);
            ptx_mbar_init(bar_empty + 8 * s, C::QSTG ? 1 : 256);
        }
        for (int b = 0; b < 2; b++) {
            ptx_mbar_init(bar_go + 8 * b, C::DQT); /* bar_stg */
            ptx_mbar_init(bar_done + 8 * b, C::BULK ? 1 : C::DQT); /* BULK: bar_dqfree */
            ptx_mbar_init(bar_dsf + 8 * b, 256);
            ptx_mbar_init(bar_dse + 8 * b, C::DQT);
        }
        ptx_mbar_init_fence();
    }
    __syncthreads();

    const int own_row = rb * ROWS;
    if (wg == 0) { /* the producer warpgroup: setmaxnreg.dec inside its own branch, so the consumers' path
                    * never meets a point where the producer's register limit might apply */
        ptx_setmaxnreg_dec<C::REG_P>();
        if (tid >= 32) { /* ---- dq sequencer (one thread): the semaphores, off the consumers' path ---- */
            if (tid != 32) return;
            {
                /* tile n (query tile ai): wait until the previous live key block's reduce is complete (acquire),
                 * then until the consumers staged scale dQ, add the staging buffer to dq (TMA reduce, one per
                 * 32-column box), free the buffer once the TMA has read it, release rb + 1 once the adds are done */
                uint32_t *sems = p.dq_sem + (int64_t)h0 * p.nq;
                /* finish: complete the reduce of tile pend and release it. The lambda and the no-op call after
                 * the loop stay as they are: written out inline, ptxas emits SASS other than the measured build's */
                int pend = -1;
                auto finish = [&]() {
                    if (pend < 0) return;
                    ptx_bulk_wait<0>();
                    if (p.dq_order) {
                        ptx_fence_proxy_async_global();
                        ptx_st_release(sems + pend, (uint32_t)(rb + 1));
                    }
                    pend = -1;
                };
                int n = 0;
                for (int ai = first; ai >= 0; ai = next_tile(ai + 1), n++) {
                    if (p.dq_order) {
                        const int prev = attn_prev_live(p.q_live + (int64_t)ai * p.nkw, t0);
                        const uint32_t want = prev < 0 ? 0u : (uint32_t)(prev / KT + 1);
                        while (ptx_ld_acquire(sems + ai) != want) __nanosleep(32);
                        ptx_fence_proxy_async_global();
                    }
                    const int sb = n % C::DQS;
                    ptx_mbar_wait(bar_stg + 8 * sb, (n / C::DQS) & 1);
#pragma unroll
                    for (int b = 0; b < C::DQB; b++)
                        ptx_tma_reduce_add_2d(&tm_dq, h0 * HD + 32 * b, ai * ATTN_TILE,
                                               C::QSTG ? (b < 4 ? sQ : sO) + sb * C::tile_bytes + (b & 3) * 8192
                                                       : sDQ + (sb * C::DQB + b) * 8192);
                    ptx_bulk_commit();
                    ptx_bulk_wait_read<0>();
                    ptx_mbar_arrive(bar_dqfree + 8 * sb);
                    pend = ai;
                    finish();
                }
                finish();
                return;
            }
        }
        /* ---- producer (warp 0): K, V once, then Q, dO and the query metadata per live tile ---- */
        const int lane = tid;
        if (lane == 0) {
            ptx_mbar_arrive_tx(bar_own, 2 * C::own_bytes);
#pragma unroll
            for (int pn = 0; pn < C::PANELS; pn++) {
                ptx_tma_load_2d(sK + pn * ROWS * 128, &tm_k, kvh * HD + pn * 64, own_row, bar_own);
                ptx_tma_load_2d(sV + pn * ROWS * 128, &tm_v, kvh * HD + pn * 64, own_row, bar_own);
            }
        }
        int it = 0;
        {
            const int h = h0;
            /* the throttle: the next key block of the head (KT = 1: SPLIT), its live tiles, its start flag */
            constexpr int TW = C::QSTG ? TW_ : 0;
            const bool throttle = TW > 0 && p.dq_order && rb + 1 < (int)gridDim.y;
            const uint32_t *succ_live = throttle ? p.k_live + (int64_t)(t0 + KT) * p.nqw : nullptr;
            const uint32_t *succ_started = throttle ? p.kb_started + (int64_t)h0 * p.nk + rb + 1 : nullptr;
            if (TW > 0 && lane == 0) ptx_st_release(p.kb_started + (int64_t)h0 * p.nk + rb, 1u);
            for (int idx = first; idx >= 0; idx = next_tile(idx + 1), it++) {
                const int s = it % ST;
                if (it >= ST) ptx_mbar_wait(bar_empty + 8 * s, ((it / ST) - 1) & 1);
                if constexpr (TW > 0) {
                    /* wait until the next key block, once started, has added tile idx - TW where it is live (its
                     * value rb + 2, or a later block's); no deadlock: it needs this block's adds of tiles up to
                     * idx - TW only, done once TW > ST */
                    const int j = idx - TW;
                    if (throttle && lane == 0 && j >= 0 && ptx_ld_acquire(succ_started) &&
                        attn_next_live(succ_live, p.nqw, j) == j) {
                        const uint32_t *sj = p.dq_sem + (int64_t)h0 * p.nq + j;
                        while (ptx_ld_acquire(sj) < (uint32_t)(rb + 2)) __nanosleep(64);
                    }
                    __syncwarp();
                }
                const int r0 = idx * ATTN_TILE;
                int *mi = reinterpret_cast<int *>(meta_g + s * C::meta_bytes);
                float *mf = reinterpret_cast<float *>(mi);
                for (int r = lane; r < ATTN_TILE; r += 32) {
                    const bool ok = r0 + r < p.Tq;
                    mf[r] = p.lse2[(int64_t)h * p.Tq_pad + r0 + r]; /* padded: +inf past Tq */
                    mf[ATTN_TILE + r] = p.D[(int64_t)h * p.Tq_pad + r0 + r];
                    mi[2 * ATTN_TILE + r] = ok ? __ldg(p.pos_q + r0 + r) : 0;
                    mi[3 * ATTN_TILE + r] = ok ? __ldg(p.doc_pos_q + r0 + r) : 0;
                }
                if (lane == 0) {
                    ptx_mbar_arrive_tx(bar_full + 8 * s, 2 * C::tile_bytes);
#pragma unroll
                    for (int pn = 0; pn < C::PANELS; pn++) {
                        ptx_tma_load_2d(sQ + s * C::tile_bytes + pn * ATTN_TILE * 128, &tm_q, h * HD + pn * 64, r0,
                                         bar_full + 8 * s);
                        ptx_tma_load_2d(sO + s * C::tile_bytes + pn * ATTN_TILE * 128, &tm_do, h * HD + pn * 64, r0,
                                         bar_full + 8 * s);
                    }
                } else {
                    ptx_mbar_arrive(bar_full + 8 * s);
                }
            }
        }
        return;
    }

    /* ---- consumers ---- */
    ptx_setmaxnreg_inc<C::REG_C>();
    const int cw = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int rowoff = C::SPLIT ? 0 : 64 * cw, col0 = C::SPLIT ? 128 * cw : 0;
    const bool has_dq = HD != 64 || cw == 0;
    const int mytile = t0 + (C::SPLIT ? 0 : cw);
    const uint32_t *mylive = mytile < p.nk ? p.k_live + (int64_t)mytile * p.nqw : nullptr;
    const uint32_t *mypart = mytile < p.nk ? p.k_part + (int64_t)mytile * p.nqw : nullptr;
    int krow[2], kpos[2], kdoc[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        krow[rr] = own_row + rowoff + warp * 16 + g + 8 * rr;
        kpos[rr] = krow[rr] < p.Tk ? p.pos_k[krow[rr]] : 0;
        kdoc[rr] = krow[rr] < p.Tk ? kpos[rr] - p.doc_pos_k[krow[rr]] : 0;
    }
    float acc1[NO], acc2[NO]; /* dK, dV of this consumer's 64 keys (x OUTW columns) */
#pragma unroll
    for (int i = 0; i < NO; i++) acc1[i] = 0.0f, acc2[i] = 0.0f;
    const float sl2 = p.scale_log2;
    /* dQ (64 queries x the 64 columns of panel pn) = dS K, dS^T from the buffer at ds, K from the block's own
     * tile, issued as one commit group; dq_product also waits for it and for every product this consumer
     * issued before (so also for the tile's dK, dV) */
    auto dq_issue = [&](float (&dqa)[32], uint32_t ds, int pn) {
        ptx_wg_fence();
#pragma unroll
        for (int kk = 0; kk < ROWS / 16; kk++)
            ptx_wgmma_ss_n64<1, 1>(dqa, ptx_gdesc(ds + kk * 16 * 128, 64 * 128, 1024),
                                 ptx_gdesc(sK + pn * ROWS * 128 + kk * 16 * 128, ROWS * 128, 1024), kk > 0);
        ptx_wg_commit();
    };
    auto dq_product = [&](float (&dqa)[32], uint32_t ds, int pn) {
        dq_issue(dqa, ds, pn);
        ptx_wg_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; i++) ptx_reg_fence(dqa[i]);
    };

    ptx_mbar_wait(bar_own, 0);
    int it = 0;
    {
        for (int idx = first; idx >= 0; idx = next_tile(idx + 1), it++) {
            const int s = it % ST;
            const bool live = mylive && attn_bit(mylive, idx);
            const bool part = live && attn_bit(mypart, idx);
            const uint32_t qs = sQ + s * C::tile_bytes, os = sO + s * C::tile_bytes;
            /* this tile's dS^T buffer (QSTG: P^T sits in the buffer before it) */
            const uint32_t dsb = sDS + (C::QSTG ? 2 * (it & 1) + 1 : (it & 1)) * C::ds_bytes;
            ptx_mbar_wait(bar_full + 8 * s, (it / ST) & 1);
            if constexpr (C::QSTG) { /* always live (SPLIT: both consumers own the block's 64 keys, the tile walk is theirs) */
                /* S^T, dP^T of the 64 keys x this consumer's 32 queries [32 cw, 32 cw + 32) as two commit groups */
                float c1[16], c2[16];
                /* c = own (K or V, 64 keys x 256) times this consumer's 32 rows of the streamed tile (Q or dO)^T */
                auto sdp_issue = [&](float (&c)[16], uint32_t own, uint32_t tile) {
#pragma unroll
                    for (int kk = 0; kk < HD / 16; kk++) {
                        const uint32_t ao = (kk >> 2) * (ROWS * 128) + (kk & 3) * 32;
                        const uint32_t bo = (kk >> 2) * (ATTN_TILE * 128) + cw * 32 * 128 + (kk & 3) * 32;
                        ptx_wgmma_ss_n32(c, ptx_gdesc(own + ao, 16, 1024), ptx_gdesc(tile + bo, 16, 1024), kk > 0);
                    }
                    ptx_wg_commit();
                };
                ptx_wg_fence();
                sdp_issue(c1, sK, qs);
                sdp_issue(c2, sV, os);
                ptx_wg_wait<1>(); /* S^T */
#pragma unroll
                for (int i = 0; i < 16; i++) ptx_reg_fence(c1[i]);
                const int *mi = reinterpret_cast<const int *>(meta_g + s * C::meta_bytes);
                const float *mf = reinterpret_cast<const float *>(mi);
                /* P^T, dS^T (bf16) -> row r, query chunk 4 cw + nb of buffer b: r * 128 + 16 ((4 cw + nb) ^ r % 8) + 4 t */
                auto put = [&](uint32_t b, const float (&c)[16]) {
#pragma unroll
                    for (int rr = 0; rr < 2; rr++) {
                        const int r = warp * 16 + g + 8 * rr;
#pragma unroll
                        for (int nb = 0; nb < 4; nb++)
                            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(b + r * 128 + (((4 * cw + nb) ^ (r & 7)) << 4) + 4 * t),
                                         "r"(ptx_pack_bf16x2(c[4 * nb + 2 * rr], c[4 * nb + 2 * rr + 1]))
                                         : "memory");
                    }
                };
                attn_bwd_p<4>(c1, mi, mf, 32 * cw, t, part, p.causal, kpos, kdoc, sl2);
                put(dsb - C::ds_bytes, c1);
                ptx_wg_wait<0>(); /* dP^T */
#pragma unroll
                for (int i = 0; i < 16; i++) ptx_reg_fence(c2[i]);
                attn_bwd_ds<4>(c2, c1, mf + ATTN_TILE, 32 * cw, t);
                put(dsb, c2);
                ptx_fence_proxy_async();
                ptx_bar_sync(1, 256); /* both query halves of P^T, dS^T written */
                /* dV += P^T dO, dK += dS^T Q over the whole tile, this consumer's 128 columns (A and B from shared memory) */
#pragma unroll
                for (int i = 0; i < NO; i++) ptx_reg_fence(acc1[i]), ptx_reg_fence(acc2[i]);
                /* acc += (the 64 keys x 64 queries buffer at a) times the tile's 64 queries x this consumer's 128 columns */
                auto kv_issue = [&](float (&acc)[NO], uint32_t a, uint32_t tile) {
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) {
                        const uint32_t bo = (col0 >> 6) * (ATTN_TILE * 128) + kk * 16 * 128;
                        ptx_wgmma_ss_n128<0, 1>(acc, ptx_gdesc(a + kk * 32, 16, 1024), ptx_gdesc(tile + bo, ATTN_TILE * 128, 1024), 1);
                    }
                    ptx_wg_commit();
                };
                ptx_wg_fence();
                kv_issue(acc2, dsb - C::ds_bytes, os); /* dV += P^T dO */
                kv_issue(acc1, dsb, qs);              /* dK += dS^T Q */
            } else if (live) {
                float c1[32], c2[32]; /* S^T, dP^T (64 keys x 64 queries) */
                /* four commit groups, each waited for only when needed: S^T; dP^T (runs while P is formed);
                 * dV += P^T dO (runs while dS is formed); dK += dS^T Q */
                ptx_wg_fence();
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
                    const uint32_t ao = (kk >> 2) * (ROWS * 128) + rowoff * 128 + (kk & 3) * 32;
                    const uint32_t bo = (kk >> 2) * (ATTN_TILE * 128) + (kk & 3) * 32;
                    ptx_wgmma_ss_n64(c1, ptx_gdesc(sK + ao, 16, 1024), ptx_gdesc(qs + bo, 16, 1024), kk > 0);
                }
                ptx_wg_commit();
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
                    const uint32_t ao = (kk >> 2) * (ROWS * 128) + rowoff * 128 + (kk & 3) * 32;
                    const uint32_t bo = (kk >> 2) * (ATTN_TILE * 128) + (kk & 3) * 32;
                    ptx_wgmma_ss_n64(c2, ptx_gdesc(sV + ao, 16, 1024), ptx_gdesc(os + bo, 16, 1024), kk > 0);
                }
                ptx_wg_commit();
                ptx_wg_wait<1>(); /* S^T */
#pragma unroll
                for (int i = 0; i < 32; i++) ptx_reg_fence(c1[i]);

                /* P^T into c1; element (own key rr, streamed query c) */
                const int *mi = reinterpret_cast<const int *>(meta_g + s * C::meta_bytes);
                const float *mf = reinterpret_cast<const float *>(mi);
                attn_bwd_p<8>(c1, mi, mf, 0, t, part, p.causal, kpos, kdoc, sl2);
                uint32_t pa[4][4], da[4][4];
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
#pragma unroll
                    for (int q4 = 0; q4 < 4; q4++) pa[kk][q4] = ptx_pack_bf16x2(c1[8 * kk + 2 * q4], c1[8 * kk + 2 * q4 + 1]);
#pragma unroll
                for (int i = 0; i < NO; i++) ptx_reg_fence(acc2[i]);
                ptx_wg_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++) { /* dV += P^T dO */
                    const uint32_t bo = (col0 >> 6) * (ATTN_TILE * 128) + kk * 16 * 128;
                    if constexpr (OUTW == 64) ptx_wgmma_rs_n64(acc2, pa[kk], ptx_gdesc(os + bo, ATTN_TILE * 128, 1024));
                    else ptx_wgmma_rs_n128(acc2, pa[kk], ptx_gdesc(os + bo, ATTN_TILE * 128, 1024));
                }
                ptx_wg_commit();
                ptx_wg_wait<1>(); /* dP^T */
#pragma unroll
                for (int i = 0; i < 32; i++) ptx_reg_fence(c2[i]);
                attn_bwd_ds<8>(c2, c1, mf + ATTN_TILE, 0, t);
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
#pragma unroll
                    for (int q4 = 0; q4 < 4; q4++) da[kk][q4] = ptx_pack_bf16x2(c2[8 * kk + 2 * q4], c2[8 * kk + 2 * q4 + 1]);
#pragma unroll
                for (int i = 0; i < NO; i++) ptx_reg_fence(acc1[i]);
                ptx_wg_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++) { /* dK += dS^T Q */
                    const uint32_t bo = (col0 >> 6) * (ATTN_TILE * 128) + kk * 16 * 128;
                    if constexpr (OUTW == 64) ptx_wgmma_rs_n64(acc1, da[kk], ptx_gdesc(qs + bo, ATTN_TILE * 128, 1024));
                    else ptx_wgmma_rs_n128(acc1, da[kk], ptx_gdesc(qs + bo, ATTN_TILE * 128, 1024));
                }
                ptx_wg_commit();
                /* dS^T (bf16, as rounded for dK) -> this consumer's 64 rows of the buffer, 128-byte swizzle:
                 * row r, query chunk nb (8 columns) at r * 128 + 16 (nb ^ r % 8) + 4 t */
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int r = rowoff + warp * 16 + g + 8 * rr;
#pragma unroll
                    for (int nb = 0; nb < 8; nb++)
                        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dsb + r * 128 + ((nb ^ (r & 7)) << 4) + 4 * t),
                                     "r"(da[nb >> 1][(nb & 1) * 2 + rr])
                                     : "memory");
                }
            } else if (!C::SPLIT) { /* these keys see none of the tile's queries: their dS^T rows are 0 */
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int chunk = (tid & 127) + 128 * c; /* 512 16-byte chunks of 64 rows */
                    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(dsb + rowoff * 128 + chunk * 16),
                                 "r"(0)
                                 : "memory");
                }
            }
            if (!C::QSTG) ptx_fence_proxy_async();
            if (!C::SPLIT) ptx_bar_sync(1, 256); /* both halves of dS^T written; the other buffer no longer read */

            if (C::BULK && has_dq) { /* dQ of this consumer's 64 columns -> the staging buffer */
                float dqa[32];
                dq_product(dqa, dsb, cw);
#pragma unroll
                for (int i = 0; i < NO; i++) ptx_reg_fence(acc1[i]), ptx_reg_fence(acc2[i]);
                ptx_mbar_arrive(bar_empty + 8 * s);
                const int sb = it % C::DQS; /* the staging buffer of this tile, free once tile it - DQS's boxes are read */
                if (it >= C::DQS) ptx_mbar_wait(bar_dqfree + 8 * sb, ((it / C::DQS) - 1) & 1);
                /* element (row r, column 8 ob + 2 t) -> box 2 cw + ob / 4, 128-byte row r, 16-byte chunk
                 * (2 (ob % 4) + t / 2) ^ (r % 8), byte 8 (t % 2): two wavefronts per warp store */
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int r = warp * 16 + g + 8 * rr;
#pragma unroll
                    for (int ob = 0; ob < 8; ob++) {
                        const uint32_t a = sDQ + (sb * C::DQB + 2 * cw + (ob >> 2)) * 8192 + r * 128 +
                                           (((2 * (ob & 3) + (t >> 1)) ^ (r & 7)) << 4) + 8 * (t & 1);
                        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(p.scale * dqa[4 * ob + 2 * rr]),
                                     "f"(p.scale * dqa[4 * ob + 2 * rr + 1])
                                     : "memory");
                    }
                }
                ptx_fence_proxy_async();
                ptx_mbar_arrive(bar_stg + 8 * sb);
            } else if (C::QSTG) { /* hd 256: scale dQ staged in the ring stage the tile came in */
                float dqa[32], dqb[32];
                dq_issue(dqa, dsb, 2 * cw);
                dq_issue(dqb, dsb, 2 * cw + 1);
                ptx_wg_wait<1>(); /* dV, dK and chunk 0: this consumer no longer reads stage s */
#pragma unroll
                for (int i = 0; i < 32; i++) ptx_reg_fence(dqa[i]);
#pragma unroll
                for (int i = 0; i < NO; i++) ptx_reg_fence(acc1[i]), ptx_reg_fence(acc2[i]);
                ptx_mbar_arrive(bar_used + 8 * s);
                ptx_mbar_wait(bar_used + 8 * s, (it / ST) & 1); /* nor does the other consumer */
                /* element (row r, column 64 ch + 8 ob + 2 t) of this consumer's 128 -> box 2 ch + ob / 4 of its half
                 * of the stage (consumer 0: the Q tile, 1: the dO tile), 128-byte row r, 16-byte chunk
                 * (2 (ob % 4) + t / 2) ^ (r % 8), byte 8 (t % 2) */
                const uint32_t stg = (cw ? sO : sQ) + s * C::tile_bytes;
                auto stage = [&](const float (&d32)[32], int ch) {
#pragma unroll
                    for (int rr = 0; rr < 2; rr++) {
                        const int r = warp * 16 + g + 8 * rr;
#pragma unroll
                        for (int ob = 0; ob < 8; ob++) {
                            const uint32_t a = stg + (2 * ch + (ob >> 2)) * 8192 + r * 128 +
                                               (((2 * (ob & 3) + (t >> 1)) ^ (r & 7)) << 4) + 8 * (t & 1);
                            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(p.scale * d32[4 * ob + 2 * rr]),
                                         "f"(p.scale * d32[4 * ob + 2 * rr + 1])
                                         : "memory");
                        }
                    }
                };
                stage(dqa, 0);
                ptx_wg_wait<0>();
#pragma unroll
                for (int i = 0; i < 32; i++) ptx_reg_fence(dqb[i]);
                stage(dqb, 1);
                ptx_fence_proxy_async();
                ptx_mbar_arrive(bar_stg + 8 * s);
            } else {
                ptx_wg_wait<0>();
#pragma unroll
                for (int i = 0; i < NO; i++) ptx_reg_fence(acc1[i]), ptx_reg_fence(acc2[i]);
                ptx_mbar_arrive(bar_empty + 8 * s);
            }
        }
    }

    /* += into the fp32 dk, dv; every element owned by one thread. With GQA the blocks of the group's query
     * heads add to the same rows, in head order: a semaphore per (kv head, key block, consumer) holds the
     * number of heads that added; the block of head h0 % group waits for its own number. Those blocks are
     * adjacent in the grid (blockIdx.x = head), started together, and equal in work, so the wait is short. */
    const bool chain = p.group > 1;
    uint32_t *ksem = p.kv_sem + ((int64_t)kvh * gridDim.y + rb) * 2 + cw;
    if (chain) {
        if ((tid & 127) == 0)
            while (ptx_ld_acquire(ksem) != (uint32_t)(h0 % p.group)) {
            }
        __syncwarp();
        ptx_bar_sync(2 + cw, 128);
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        if (krow[rr] >= p.Tk) continue;
        const int64_t off = (int64_t)krow[rr] * p.ldk + (int64_t)kvh * HD + col0;
        /* red.global.add.v2, fire and forget (load-add-store waits load by load: dk and dv may alias for
         * the compiler); the release below orders them as the stores */
#pragma unroll
        for (int ob = 0; ob < OUTW / 8; ob++) {
            ptx_red_add2(p.dk + off + ob * 8 + 2 * t, p.scale * acc1[4 * ob + 2 * rr], p.scale * acc1[4 * ob + 2 * rr + 1]);
            ptx_red_add2(p.dv + off + ob * 8 + 2 * t, acc2[4 * ob + 2 * rr], acc2[4 * ob + 2 * rr + 1]);
        }
    }
    if (chain) {
        ptx_bar_sync(2 + cw, 128); /* every add of this consumer done before the release */
        if ((tid & 127) == 0) ptx_st_release(ksem, (uint32_t)(h0 % p.group + 1));
    }
}

/* the measurement choices of cuda_attention_tune.h, all 0 unless a test sets them */
static CudaAttnTune attn_tune;

extern "C" void cuda_attention_tune_set(const CudaAttnTune *t) {
    RS_CHECK(!t || ((t->dq_atomic == 0 || t->dq_atomic == 1) && (t->throttle == 0 || t->throttle == 1)),
             "cuda_attention_tune_set: dq_atomic %d, throttle %d (want 0 or 1)", t->dq_atomic, t->throttle);
    if (t) attn_tune = *t;
    else memset(&attn_tune, 0, sizeof attn_tune);
}

/* one kernel for dk, dv and dq */
template <int HD>
static void attn_launch_backward(const AttnParams &p0) {
    typedef AttnBwdCfg<HD> C;
    static int done;
    AttnParams p = p0;
    p.dq_order = !attn_tune.dq_atomic;
    /* hd 256 above ATTN_BWD_THROTTLE_MIN_TK keys (or forced): the throttled instance */
    const int force = attn_tune.throttle;
    auto kernel = attn_backward_kernel<HD, 0>;
    static int done_thr;
    int *kdone = &done;
    static_assert(!C::QSTG || ATTN_BWD_THROTTLE > C::ST, "ATTN_BWD_THROTTLE must exceed the ring stages");
    if constexpr (C::QSTG)
        if (force || p.Tk > ATTN_BWD_THROTTLE_MIN_TK) {
            kernel = attn_backward_kernel<HD, ATTN_BWD_THROTTLE>;
            kdone = &done_thr;
        }
    attn_smem_limit(kernel, C::bytes, kdone);
    CUDA_CHECK(cudaMemsetAsync(p.dq_sem, 0, attn_sem_count(&p) * 4, cuda_stream()));
    CUtensorMap tk, tv, tq, tdo, tdq;
    attn_tmap(&tk, p.k, p.Tk, p.nkv * HD, p.ldk, C::ROWS);
    attn_tmap(&tv, p.v, p.Tk, p.nkv * HD, p.ldk, C::ROWS);
    attn_tmap(&tq, p.q, p.Tq, p.nh * HD, p.ldq, ATTN_TILE);
    attn_tmap(&tdo, p.dout, p.Tq, p.nh * HD, p.ldo, ATTN_TILE);
    memset(&tdq, 0, sizeof tdq);
    attn_tmap_e(&tdq, p.dq, p.Tq, p.nh * HD, p.ldq, ATTN_TILE, 4); /* fp32 dq, 32-column boxes */
    kernel<<<dim3(p.nh, (p.Tk + C::ROWS - 1) / C::ROWS), AWG_THREADS, C::bytes, cuda_stream()>>>(p, tk, tv, tq, tdo,
                                                                                             tdq);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_attention_backward(float *dq /* (Tq,ldq) += */, float *dk /* (Tk,ldk) += */,
                                        float *dv /* (Tk,ldk) += */, const void *dout /* (Tq,ldo) */,
                                        const void *out /* (Tq,ldo) final */, const float *lse /* (Tq,nh) final */,
                                        const void *q /* (Tq,ldq) */, const void *k /* (Tk,ldk) */,
                                        const void *v /* (Tk,ldk) */, const int32_t *pos_q /* (Tq) */,
                                        const int32_t *doc_pos_q /* (Tq) */, const int32_t *pos_k /* (Tk) */,
                                        const int32_t *doc_pos_k /* (Tk) */, const AttnHint *hint /* unused */,
                                        int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo,
                                        int causal) {
    attn_check_args("cuda_attention_backward", Tq, Tk, nh, nkv, hd, ldq, ldk, ldo);
    if (Tq == 0 || Tk == 0) return; /* nothing is visible: every gradient += 0 */
    RS_CHECK(attn_aligned16(dq) && attn_aligned16(dk) && attn_aligned16(dv) && attn_aligned16(dout) &&
                 attn_aligned16(out) && attn_aligned16(q) && attn_aligned16(k) && attn_aligned16(v),
             "cuda_attention_backward: every tensor must be 16-byte aligned");
    AttnParams p = attn_params(q, k, v, pos_q, doc_pos_q, pos_k, doc_pos_k, Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, causal);
    p.out = (const bf16 *)out, p.dout = (const bf16 *)dout;
    p.dq = dq, p.dk = dk, p.dv = dv;
    float *stats = attn_plan(&p, 1);
    float *lse2 = stats, *D = stats + attn_align((size_t)nh * p.Tq_pad * 4) / 4;
    p.lse2 = lse2, p.D = D;
    const int64_t warps = (int64_t)p.Tq_pad * nh;
    attn_bwd_prep_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, cuda_stream()>>>(lse2, D, p.dout, p.out, lse, p.Tq,
                                                                                p.Tq_pad, nh, hd, ldo);
    CUDA_LAUNCH_CHECK();
    switch (hd) {
    case 64: attn_launch_backward<64>(p); break;
    case 128: attn_launch_backward<128>(p); break;
    default: attn_launch_backward<256>(p); break;
    }
}

