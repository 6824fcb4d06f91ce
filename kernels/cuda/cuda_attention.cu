/*
 * cuda_attention.cu — block softmax attention on the tensor cores for the cuda backend (sm_90a): the
 * forward, the backward and the fp32 LSE merge, the primitives of the softmax layer and of the ring
 * schedule (lib/cp_ring.c). bf16 activations, fp32 accumulation and statistics.
 *
 * Entries (cuda_kernels.h; Backend attention_forward, attention_backward, attention_merge): q (Tq,ldq)
 * with nh heads of hd in {64, 128, 256}, k and v (Tk,ldk) with nkv heads (GQA: query head h reads kv
 * head h / (nh / nkv)), out (Tq,ldo) bf16, lse (Tq,nh) fp32; the backward adds into fp32 dq (Tq,ldq),
 * dk, dv (Tk,ldk). Mask: query i sees key j iff both lie in one document (pos - doc_pos equal) and, when
 * causal, pos_k[j] <= pos_q[i]; nothing is assumed about the order of pos (zigzag ring blocks and
 * packed documents follow the same rule); a row that sees no key gets out 0 and lse -inf. Callers: the
 * Backend table (backend_cuda.c), tests/cuda/test_cuda_attention.cu (parity with the cpu oracle
 * kernels/cpu/cpu_attention.c).
 *
 * Design. Two metadata kernels classify every pair of 64-query and 64-key tiles as skipped, partial or
 * full (bitmasks, one row per query tile and one per key tile), so a block walks only its live tiles
 * and tests the mask element by element only on partial ones. Forward (attn_fwd_wg_kernel): one block
 * of three warpgroups per (head, 128 queries); one producer warp loads K / V tiles by TMA into a ring,
 * two consumer warpgroups compute S = Q K^T and O += P V with wgmma and an online softmax (exponentials
 * by ex2.approx). Backward (attn_bwd3_kernel): one block per (query head, key block) accumulates dK, dV
 * of its keys in registers while the live query tiles stream through; each tile's dQ = dS K is staged
 * in shared memory and added to dq by TMA reduce-adds in key-block order (a semaphore per query tile:
 * the same bits on every run); at hd 256 the consumers split the tile's queries and stage dQ in the
 * tile's own ring stage, and above 64k keys the throttled instance keeps a head's key blocks within 4
 * tiles of each other (they share Q and dO in L2). The measurements and the history of every choice
 * are in docs/benchmarks.md (attention v2 to v5, v0.5); cuda_attention_tune.h has the two
 * measurement choices the tests set.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h> /* CUtensorMap and its enums (the encoder is fetched through the runtime) */
#include <stdlib.h>

#include "cuda_attention_tune.h"
#include "cuda_ptx.h"
#include "cuda_common.h"
#include "cuda_kernels.h"

#define ATTN_TILE    64  /* rows of a query tile and of a key tile; the granularity of skipping */
#define ATTN_THREADS 128 /* 4 warps per block; a warp owns 16 query rows (fwd, dq) or 16 keys (dk/dv) */
#define ATTN_LOG2E   1.4426950408889634f
#define ATTN_LN2     0.6931471805599453f

/* Everything a kernel needs; passed by value. Pointers to bf16 are `const bf16 *` of the head's
 * column 0 of row 0; row r of a tensor with leading dimension ld starts ld elements after row r-1. */
typedef struct {
    const bf16 *q;       /* (Tq,ldq) nh heads of hd */
    const bf16 *k, *v;   /* (Tk,ldk) nkv heads of hd */
    const bf16 *out;     /* (Tq,ldo) final output (backward) */
    const bf16 *dout;    /* (Tq,ldo) */
    bf16 *out_w;         /* (Tq,ldo) output (forward) */
    float *lse_w;        /* (Tq,nh) output (forward) */
    float *dq;           /* (Tq,ldq) += */
    float *dk, *dv;      /* (Tk,ldk) += */
    const int32_t *pos_q, *doc_pos_q; /* (Tq) */
    const int32_t *pos_k, *doc_pos_k; /* (Tk) */
    const uint32_t *q_live, *q_part;  /* (nq,nkw) bitmasks over key tiles, one row per query tile */
    const uint32_t *k_live, *k_part;  /* (nk,nqw) bitmasks over query tiles, one row per key tile */
    const float *lse2, *D;            /* (nh,Tq_pad) backward row statistics */
    uint32_t *dq_sem;                 /* (nh,nq) v3: last key block (+1) that added to a dq tile */
    uint32_t *kv_sem;                 /* (nkv,nk,2) v3 GQA: heads that added to a (key block, consumer) of dk, dv */
    uint32_t *kb_started;             /* (nh,nk) v3 throttle: 1 once the block of (head, key block) has begun */
    int dq_order;                     /* v3: 1 = dq adds in key-block order (reproducible), 0 = plain atomics */
    int Tq, Tk, Tq_pad;
    int nh, nkv, group;
    int ldq, ldk, ldo;
    int nq, nk, nqw, nkw;
    int causal;
    float scale, scale_log2; /* hd^-1/2 and hd^-1/2 log2(e) */
} AttnParams;

/* the first set bit >= `from` of a bitmask row of `nwords` words, or -1; uniform over the block */
static __device__ __forceinline__ int attn_next_live(const uint32_t *row, int nwords, int from) {
    int w = from >> 5;
    if (w >= nwords) return -1;
    uint32_t bits = __ldg(row + w) & (0xffffffffu << (from & 31));
    while (!bits) {
        if (++w >= nwords) return -1;
        bits = __ldg(row + w);
    }
    return (w << 5) + __ffs(bits) - 1;
}

static __device__ __forceinline__ int attn_bit(const uint32_t *row, int i) { return (__ldg(row + (i >> 5)) >> (i & 31)) & 1; }

static __device__ __forceinline__ float attn_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
static __device__ __forceinline__ float attn_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

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

/* ---- forward v2: wgmma + TMA, warp-specialised (sm_90a) -------------------------------------- */

#define AWG_BM      128 /* query rows per block: two consumer warpgroups of 64 rows */
#define AWG_THREADS 384 /* warpgroup 0: producer (one warp loads); warpgroups 1, 2: consumers */

template <int HD>
struct AttnWgCfg {
    static constexpr int BN = HD == 256 ? 64 : 128; /* keys per tile (registers: S is 64 x BN fp32 per warpgroup) */
    static constexpr int ST = HD == 64 ? 4 : 2;     /* K/V stages of the ring */
    static constexpr int PANELS = HD / 64;          /* 128-byte column panels of a tile (64 bf16 each) */
    static constexpr int q_bytes = AWG_BM * HD * 2;
    static constexpr int kv_bytes = BN * HD * 2; /* one K or V tile */
    static constexpr int meta_bytes = 2 * BN * 4; /* pos, doc_pos of the keys of a tile */
    static constexpr int off_k = q_bytes;
    static constexpr int off_v = off_k + ST * kv_bytes;
    static constexpr int off_meta = off_v + ST * kv_bytes;
    static constexpr int off_bar = off_meta + ST * meta_bytes; /* q, full[ST], empty[ST] (8 bytes each) */
    static constexpr int bytes = off_bar + 8 * (1 + 2 * ST) + 1024; /* + slack to align the base to 1024 */
};

/* Tiles in shared memory: a (rows x HD) bf16 tile is HD/64 panels of (rows x 128 bytes), row r of a
 * panel at r * 128 with its 16-byte chunks XOR-swizzled by r % 8: what TMA writes with the 128-byte
 * swizzle and what wgmma reads through a 128-byte-swizzle descriptor. */
template <int HD>
static __global__ void __launch_bounds__(AWG_THREADS, 1)
    attn_fwd_wg_kernel(const AttnParams p, const __grid_constant__ CUtensorMap tm_q,
                       const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
    typedef AttnWgCfg<HD> C;
    constexpr int BN = C::BN, ST = C::ST, R = BN / ATTN_TILE; /* 64-key tiles of the bitmasks per key tile */
    constexpr int NS = BN / 2, NO = HD / 2;                   /* accumulator registers of S and O per thread */
    extern __shared__ __align__(128) unsigned char attn_smem[]; /* the base is rounded up to 1024 below */
    const uint32_t raw = ptx_smem_addr(attn_smem), base = (raw + 1023u) & ~1023u;
    int *sMeta = reinterpret_cast<int *>(attn_smem + (base - raw) + C::off_meta); /* stage s: pos[BN], doc_pos[BN] */
    const uint32_t sQ = base, sK = base + C::off_k, sV = base + C::off_v;
    const uint32_t bar_q = base + C::off_bar, bar_full = bar_q + 8, bar_empty = bar_full + 8 * ST;

    const int tid = threadIdx.x, wg = tid >> 7;
    const int h = blockIdx.x, qb = gridDim.y - 1 - blockIdx.y, kvh = h / p.group, q0 = qb * AWG_BM;
    /* the block's two 64-row query tiles 2qb, 2qb+1 (the second may lie past the end) */
    const uint32_t *live_a = p.q_live + (int64_t)(2 * qb) * p.nkw;
    const uint32_t *live_b = 2 * qb + 1 < p.nq ? p.q_live + (int64_t)(2 * qb + 1) * p.nkw : nullptr;
    /* the first key tile >= from that either query tile sees, or -1: producer and consumers walk the same list */
    auto next_tile = [&](int from) -> int {
        int a = attn_next_live(live_a, p.nkw, from * R);
        if (live_b) {
            const int b = attn_next_live(live_b, p.nkw, from * R);
            if (b >= 0 && (a < 0 || b < a)) a = b;
        }
        return a < 0 ? -1 : a / R;
    };

    if (tid == 0) {
        ptx_mbar_init(bar_q, 1);
        for (int s = 0; s < ST; s++) {
            ptx_mbar_init(bar_full + 8 * s, 32); /* the producer warp's lanes (lane 0 with the TMA bytes) */
            ptx_mbar_init(bar_empty + 8 * s, 256); /* every consumer thread, after its last read of the stage */
        }
        ptx_mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) { /* ---- producer ---- */
        ptx_setmaxnreg_dec<40>();
        if (tid >= 32) return;
        const int lane = tid;
        int j = next_tile(0);
        if (j < 0) return;
        if (lane == 0) {
            ptx_mbar_arrive_tx(bar_q, C::q_bytes);
#pragma unroll
            for (int pn = 0; pn < C::PANELS; pn++) ptx_tma_load_2d(sQ + pn * AWG_BM * 128, &tm_q, h * HD + pn * 64, q0, bar_q);
        }
        for (int it = 0; j >= 0; it++, j = next_tile(j + 1)) {
            const int s = it % ST;
            if (it >= ST) ptx_mbar_wait(bar_empty + 8 * s, ((it / ST) - 1) & 1);
            int *mp = sMeta + s * 2 * BN;
            for (int r = lane; r < BN; r += 32) {
                const int key = j * BN + r;
                const bool ok = key < p.Tk;
                mp[r] = ok ? __ldg(p.pos_k + key) : 0;
                mp[BN + r] = ok ? __ldg(p.doc_pos_k + key) : 0;
            }
            if (lane == 0) {
                ptx_mbar_arrive_tx(bar_full + 8 * s, 2 * C::kv_bytes);
#pragma unroll
                for (int pn = 0; pn < C::PANELS; pn++) {
                    ptx_tma_load_2d(sK + s * C::kv_bytes + pn * BN * 128, &tm_k, kvh * HD + pn * 64, j * BN,
                                     bar_full + 8 * s);
                    ptx_tma_load_2d(sV + s * C::kv_bytes + pn * BN * 128, &tm_v, kvh * HD + pn * 64, j * BN,
                                     bar_full + 8 * s);
                }
            } else {
                ptx_mbar_arrive(bar_full + 8 * s);
            }
        }
        return;
    }

    /* ---- consumers: warpgroup cw owns query rows q0 + 64 cw .. + 63 ---- */
    ptx_setmaxnreg_inc<232>();
    const int cw = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int mytile = 2 * qb + cw;
    const uint32_t *mylive = mytile < p.nq ? p.q_live + (int64_t)mytile * p.nkw : nullptr;
    const uint32_t *mypart = mytile < p.nq ? p.q_part + (int64_t)mytile * p.nkw : nullptr;
    int row[2], qpos[2], qdoc[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        row[rr] = q0 + cw * 64 + warp * 16 + g + 8 * rr;
        qpos[rr] = row[rr] < p.Tq ? p.pos_q[row[rr]] : 0;
        qdoc[rr] = row[rr] < p.Tq ? qpos[rr] - p.doc_pos_q[row[rr]] : 0;
    }
    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; i++) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* running max (scaled, log2 domain), partial sums */
    const float sl2 = p.scale_log2;
    const uint32_t qa = sQ + cw * 64 * 128; /* this warpgroup's 64 rows inside each Q panel */

    int j = next_tile(0);
    if (j >= 0) ptx_mbar_wait(bar_q, 0);
    int pend = -1; /* the stage an issued P V product still reads (released after its wait) */
    for (int it = 0; j >= 0; it++) {
        const int s = it % ST, jn = next_tile(j + 1);
        bool live = false, part = false;
        if (mylive) {
            if (R == 1) {
                live = attn_bit(mylive, j);
                part = attn_bit(mypart, j);
            } else { /* two 64-key tiles; one seen and one not is tested element by element */
                const int j0 = 2 * j, j1 = 2 * j + 1;
                const bool l0 = attn_bit(mylive, j0), l1 = j1 < p.nk && attn_bit(mylive, j1);
                live = l0 || l1;
                part = l0 != l1 || attn_bit(mypart, j0) || (j1 < p.nk && attn_bit(mypart, j1));
            }
        }
        ptx_mbar_wait(bar_full + 8 * s, (it / ST) & 1);
        if (!live) { /* this warpgroup's rows see none of these keys */
            if (pend >= 0) { /* finish the pending P V now: the producer may need its stage before our next live tile */
                ptx_wg_wait<0>();
#pragma unroll
                for (int i = 0; i < NO; i++) ptx_reg_fence(o[i]);
                ptx_mbar_arrive(bar_empty + 8 * pend);
                pend = -1;
            }
            ptx_mbar_arrive(bar_empty + 8 * s);
            j = jn;
            continue;
        }

        /* S = Q K^T (64 x BN per warpgroup), operands straight from shared memory */
        float sc[NS];
        ptx_wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const uint64_t da = ptx_gdesc(qa + (kk >> 2) * (AWG_BM * 128) + (kk & 3) * 32, 16, 1024);
            const uint64_t db = ptx_gdesc(sK + s * C::kv_bytes + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024);
            if constexpr (BN == 128) ptx_wgmma_ss_n128(sc, da, db, kk > 0);
            else ptx_wgmma_ss_n64(sc, da, db, kk > 0);
        }
        ptx_wg_commit();
        ptx_wg_wait<0>(); /* this S and the previous tile's P V are done */
#pragma unroll
        for (int i = 0; i < NS; i++) ptx_reg_fence(sc[i]);
#pragma unroll
        for (int i = 0; i < NO; i++) ptx_reg_fence(o[i]);
        if (pend >= 0) {
            ptx_mbar_arrive(bar_empty + 8 * pend);
            pend = -1;
        }

        if (part) {
            const int *kp = sMeta + s * 2 * BN, *kd = kp + BN;
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int c = nb * 8 + 2 * t + e;
                    const int kpos = kp[c], kdoc = kpos - kd[c];
                    const bool kin = j * BN + c < p.Tk;
#pragma unroll
                    for (int rr = 0; rr < 2; rr++)
                        if (!(kin && kdoc == qdoc[rr] && (!p.causal || kpos <= qpos[rr]))) sc[4 * nb + 2 * rr + e] = -INFINITY;
                }
        }

        /* online softmax in the log2 domain: P = exp2(S scale log2e - max) */
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++) mx = fmaxf(mx, fmaxf(sc[4 * nb + 2 * rr], sc[4 * nb + 2 * rr + 1]));
            mx = attn_quad_max(mx);
            const float m_new = fmaxf(m[rr], mx * sl2);
            const float base_m = m_new == -INFINITY ? 0.0f : m_new; /* all masked so far: p = 0, no NaN */
            const float alpha = ptx_ex2_ftz(m[rr] - base_m);
            m[rr] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float pr = ptx_ex2_ftz(fmaf(sc[4 * nb + 2 * rr + e], sl2, -base_m));
                    sc[4 * nb + 2 * rr + e] = pr;
                    sum += pr;
                }
            l[rr] = l[rr] * alpha + sum;
#pragma unroll
            for (int db = 0; db < HD / 8; db++) o[4 * db + 2 * rr] *= alpha, o[4 * db + 2 * rr + 1] *= alpha;
        }

        /* O += P V: P from the S accumulators (same fragment layout), V through a transposed descriptor */
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            pa[kk][0] = ptx_pack_bf16x2(sc[8 * kk + 0], sc[8 * kk + 1]);
            pa[kk][1] = ptx_pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);
            pa[kk][2] = ptx_pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);
            pa[kk][3] = ptx_pack_bf16x2(sc[8 * kk + 6], sc[8 * kk + 7]);
        }
#pragma unroll
        for (int i = 0; i < NO; i++) ptx_reg_fence(o[i]);
        ptx_wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const uint64_t db = ptx_gdesc(sV + s * C::kv_bytes + kk * 16 * 128, BN * 128, 1024);
            if constexpr (HD == 64) ptx_wgmma_rs_t_n64(o, pa[kk], db);
            else if constexpr (HD == 128) ptx_wgmma_rs_t_n128(o, pa[kk], db);
            else ptx_wgmma_rs_t_n256(o, pa[kk], db);
        }
        ptx_wg_commit();
        pend = s;
        j = jn;
    }
    ptx_wg_wait<0>();
#pragma unroll
    for (int i = 0; i < NO; i++) ptx_reg_fence(o[i]);
    if (pend >= 0) {
        ptx_mbar_arrive(bar_empty + 8 * pend);
    }

    /* out = O / l, lse = (m + log2 l) ln 2; a row that saw no key: out 0, lse -inf */
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const float lsum = attn_quad_sum(l[rr]);
        if (row[rr] >= p.Tq) continue;
        const bool empty = m[rr] == -INFINITY;
        const float inv = empty ? 0.0f : 1.0f / lsum;
        bf16 *orow = p.out_w + (int64_t)row[rr] * p.ldo + (int64_t)h * HD;
#pragma unroll
        for (int db = 0; db < HD / 8; db++)
            *reinterpret_cast<__nv_bfloat162 *>(orow + db * 8 + 2 * t) =
                __floats2bfloat162_rn(o[4 * db + 2 * rr] * inv, o[4 * db + 2 * rr + 1] * inv);
        if (t == 0) p.lse_w[(int64_t)row[rr] * p.nh + h] = empty ? -INFINITY : (m[rr] + log2f(lsum)) * ATTN_LN2;
    }
}

/* ---- backward v3: dK, dV and dQ in one kernel ------------------------------------------------ */

#define ATTN_BWD3_THROTTLE_MIN_TK 65536 /* QS 3: above this many keys the backward runs with ATTN_BWD3_THROTTLE: at
                                         * 128k keys unthrottled v3 measured 1473 to 2768 ms fwd+bwd from call to call,
                                         * with W = 4 1836-1852 (MHA), 1750-1751 (GQA 16/2) in two rounds; at 32k W = 4
                                         * costs 20% (H100, 2026-11-23, docs/benchmarks.md "v0.5") */
#define ATTN_BWD3_THROTTLE 4 /* W > ST (QS 3, above ATTN_BWD3_THROTTLE_MIN_TK keys): a block's producer loads query
                              * tile i only once the next key block of its head, if started and live there, has added
                              * tile i - W, so a head's key blocks stay within W tiles of each other and share Q, dO
                              * in L2 */

/* v3 layout: the v2 dk/dv block (own K, V; Q, dO streamed in 64-query tiles) plus two dS^T buffers
 * (row = key, 64 query columns, 128-byte swizzle: the M-major A operand of dQ = dS K). Without SPLIT
 * the two consumers' 64-key halves fill one buffer (double-buffered over tiles, one 256-thread barrier
 * per tile); with SPLIT (hd 256) both consumers hold the same dS^T and each writes its own buffer. */
template <int HD>
struct AttnBwd3Cfg {
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
    static constexpr int DQS = BULK ? 2 : ST; /* staging buffers, by tile (BULK: 1 measured 1-2% slower) */
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

/* the highest set bit below `before` in a bitmask row, or -1 */
static __device__ __forceinline__ int attn_prev_live(const uint32_t *row, int before) {
    if (before <= 0) return -1;
    int w = (before - 1) >> 5;
    const int b = before - 32 * w; /* 1..32 bits of word w count */
    uint32_t m = __ldg(row + w) & (b == 32 ? 0xffffffffu : (1u << b) - 1u);
    for (;;) {
        if (m) return 32 * w + 31 - __clz(m);
        if (--w < 0) return -1;
        m = __ldg(row + w);
    }
}

/* v3's P^T in place, for this thread's NB x 8 streamed queries of a tile: c[4 nb + 2 rr + e] (own key rr: kpos,
 * kdoc) from S^T to exp2(S^T scale_log2 - lse2) of query c0 + 8 nb + 2 t + e (the stage's metadata mi / mf), 0
 * where the query cannot see the key (part: the tile is partly masked) */
template <int NB>
static __device__ __forceinline__ void attn_bwd3_p(float (&c)[4 * NB], const int *mi, const float *mf, int c0, int t,
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

/* v3's dS^T in place: dp[i] (dP^T) = pt[i] (P^T) (dP^T - D) for the same queries as attn_bwd3_p (D: the stage's
 * row statistics, mf + ATTN_TILE) */
template <int NB>
static __device__ __forceinline__ void attn_bwd3_ds(float (&dp)[4 * NB], const float (&pt)[4 * NB], const float *D,
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
    attn_bwd3_kernel(const AttnParams p, const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                     const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
                     const __grid_constant__ CUtensorMap tm_dq) {
    typedef AttnBwd3Cfg<HD> C;
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
                 * the loop are what the measured build compiled (its SEQPIPE switch, removed, had two reduces in
                 * flight); written out inline, ptxas emits different SASS, so they stay */
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
        const int h = h0;
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
                attn_bwd3_p<4>(c1, mi, mf, 32 * cw, t, part, p.causal, kpos, kdoc, sl2);
                put(dsb - C::ds_bytes, c1);
                ptx_wg_wait<0>(); /* dP^T */
#pragma unroll
                for (int i = 0; i < 16; i++) ptx_reg_fence(c2[i]);
                attn_bwd3_ds<4>(c2, c1, mf + ATTN_TILE, 32 * cw, t);
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
                attn_bwd3_p<8>(c1, mi, mf, 0, t, part, p.causal, kpos, kdoc, sl2);
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
                    if constexpr (OUTW == 64) ptx_wgmma_rs_t_n64(acc2, pa[kk], ptx_gdesc(os + bo, ATTN_TILE * 128, 1024));
                    else ptx_wgmma_rs_t_n128(acc2, pa[kk], ptx_gdesc(os + bo, ATTN_TILE * 128, 1024));
                }
                ptx_wg_commit();
                ptx_wg_wait<1>(); /* dP^T */
#pragma unroll
                for (int i = 0; i < 32; i++) ptx_reg_fence(c2[i]);
                attn_bwd3_ds<8>(c2, c1, mf + ATTN_TILE, 0, t);
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
                    if constexpr (OUTW == 64) ptx_wgmma_rs_t_n64(acc1, da[kk], ptx_gdesc(qs + bo, ATTN_TILE * 128, 1024));
                    else ptx_wgmma_rs_t_n128(acc1, da[kk], ptx_gdesc(qs + bo, ATTN_TILE * 128, 1024));
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

            if (C::BULK && has_dq) { /* dQ of this consumer's 64 columns -> the staging buffer (v4) */
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
            } else if (C::QSTG) { /* hd 256: scale dQ staged in the ring stage the tile came in (QS 3) */
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

/* ---- merge ----------------------------------------------------------------------------------- */

static __global__ void attn_merge_kernel(float *out /* (T,nh*hd) running */, float *lse /* (T,nh) running */,
                                         const bf16 *out_b /* (T,ldb) */, const float *lse_b /* (T,nh) */, int64_t T,
                                         int nh, int hd, int ldb) {
    const int64_t w = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= T * nh) return;
    const float Lb = lse_b[w];
    if (Lb == -INFINITY) return; /* the partial saw no key: out_b is not read */
    const float L = lse[w];
    const int64_t t = w / nh, h = w % nh;
    float *o = out + w * hd;
    const bf16 *ob = out_b + t * ldb + h * hd;
    if (L == -INFINITY) { /* nothing merged yet: take the partial, out is not read */
        for (int d = lane; d < hd; d += 32) o[d] = __bfloat162float(ob[d]);
        __syncwarp();
        if (lane == 0) lse[w] = Lb;
        return;
    }
    const float e = expf(-fabsf(L - Lb)); /* in (0, 1] */
    const float w_hi = 1.0f / (1.0f + e), w_lo = e * w_hi;
    const float wa = L >= Lb ? w_hi : w_lo, wb = L >= Lb ? w_lo : w_hi;
    for (int d = lane; d < hd; d += 32) o[d] = wa * o[d] + wb * __bfloat162float(ob[d]);
    __syncwarp(); /* every lane has read lse[w] before it is replaced */
    if (lane == 0) lse[w] = (L >= Lb ? L : Lb) + log1pf(e);
}

/* ---- host side ------------------------------------------------------------------------------- */

/* the file's workspace: grown stream-ordered on cuda_stream(), never shrunk */
static void *attn_ws;
static size_t attn_ws_bytes;

static void *attn_workspace(size_t bytes) {
    if (bytes > attn_ws_bytes) {
        cudaStream_t s = cuda_stream();
        if (attn_ws) CUDA_CHECK(cudaFreeAsync(attn_ws, s));
        attn_ws = NULL;
        bytes += bytes / 4; /* headroom for slightly larger calls */
        CUDA_CHECK(cudaMallocAsync(&attn_ws, bytes, s));
        attn_ws_bytes = bytes;
    }
    return attn_ws;
}

static size_t attn_align(size_t n) { return (n + 255) & ~(size_t)255; }

static int attn_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static void attn_check_args(const char *who, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk,
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
static size_t attn_sem_count(const AttnParams *p) {
    return (size_t)p->nh * p->nq + (size_t)p->nkv * p->nk * 2 + (size_t)p->nh * p->nk;
}

static float *attn_plan(AttnParams *p, int bwd) {
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

static AttnParams attn_params(const void *q, const void *k, const void *v, const int32_t *pos_q,
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

/* raise a kernel's dynamic shared-memory limit once */
template <typename K>
static void attn_smem_limit(K kernel, int bytes, int *done) {
    if (!*done) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        *done = 1;
    }
}

/* ---- forward v2: host side ---- */

typedef CUresult (*AttnEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* a 2-d tensor map of bf16 (esize 2) or fp32 (esize 4) over `rows` rows of `cols` columns from `base` (row
 * stride ld elements): boxes of 128 bytes of columns (128-byte swizzle) by box_rows rows; rows past the end
 * read as zeros (and are dropped by a reduce) */
static void attn_tmap_e(CUtensorMap *m, const void *base, int64_t rows, int cols, int ld, int box_rows, int esize) {
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
static void attn_tmap(CUtensorMap *m, const void *base, int64_t rows, int cols, int ld, int box_rows) {
    attn_tmap_e(m, base, rows, cols, ld, box_rows, 2);
}

template <int HD>
static void attn_launch_forward_v2(const AttnParams &p) {
    typedef AttnWgCfg<HD> C;
    static int done;
    attn_smem_limit(attn_fwd_wg_kernel<HD>, C::bytes, &done);
    CUtensorMap tq, tk, tv;
    memset(&tk, 0, sizeof tk);
    memset(&tv, 0, sizeof tv);
    attn_tmap(&tq, p.q, p.Tq, p.nh * HD, p.ldq, AWG_BM);
    if (p.Tk > 0) { /* Tk = 0: no tile is live, the maps are never read */
        attn_tmap(&tk, p.k, p.Tk, p.nkv * HD, p.ldk, C::BN);
        attn_tmap(&tv, p.v, p.Tk, p.nkv * HD, p.ldk, C::BN);
    }
    const int nqb = (p.Tq + AWG_BM - 1) / AWG_BM;
    attn_fwd_wg_kernel<HD><<<dim3(p.nh, nqb), AWG_THREADS, C::bytes, cuda_stream()>>>(p, tq, tk, tv);
    CUDA_LAUNCH_CHECK();
}

/* the measurement choices of cuda_attention_tune.h, all 0 unless a test sets them */
static CudaAttnTune attn_tune;

extern "C" void cuda_attention_tune_set(const CudaAttnTune *t) {
    RS_CHECK(!t || ((t->dq_atomic == 0 || t->dq_atomic == 1) && (t->throttle == 0 || t->throttle == 1)),
             "cuda_attention_tune_set: dq_atomic %d, throttle %d (want 0 or 1)", t->dq_atomic, t->throttle);
    if (t) attn_tune = *t;
    else memset(&attn_tune, 0, sizeof attn_tune);
}

/* v3: one kernel for dk, dv and dq */
template <int HD>
static void attn_launch_backward_v3(const AttnParams &p0) {
    typedef AttnBwd3Cfg<HD> C;
    static int done;
    AttnParams p = p0;
    p.dq_order = !attn_tune.dq_atomic;
    /* hd 256 above ATTN_BWD3_THROTTLE_MIN_TK keys (or forced): the throttled instance */
    const int force = attn_tune.throttle;
    auto kernel = attn_bwd3_kernel<HD, 0>;
    static int done_thr;
    int *kdone = &done;
    static_assert(!C::QSTG || ATTN_BWD3_THROTTLE > C::ST, "ATTN_BWD3_THROTTLE must exceed the ring stages");
    if constexpr (C::QSTG)
        if (force || p.Tk > ATTN_BWD3_THROTTLE_MIN_TK) {
            kernel = attn_bwd3_kernel<HD, ATTN_BWD3_THROTTLE>;
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

extern "C" void cuda_attention_forward(void *out /* (Tq,ldo) nh heads of hd */, float *lse /* (Tq,nh) */,
                                       const void *q /* (Tq,ldq) */, const void *k /* (Tk,ldk) nkv heads */,
                                       const void *v /* (Tk,ldk) */, const int32_t *pos_q /* (Tq) */,
                                       const int32_t *doc_pos_q /* (Tq) */, const int32_t *pos_k /* (Tk) */,
                                       const int32_t *doc_pos_k /* (Tk) */, int64_t Tq, int64_t Tk, int nh, int nkv,
                                       int hd, int ldq, int ldk, int ldo, int causal) {
    attn_check_args("cuda_attention_forward", Tq, Tk, nh, nkv, hd, ldq, ldk, ldo);
    if (Tq == 0) return;
    RS_CHECK(attn_aligned16(out) && attn_aligned16(q) && (Tk == 0 || (attn_aligned16(k) && attn_aligned16(v))),
             "cuda_attention_forward: out, q, k, v must be 16-byte aligned");
    AttnParams p = attn_params(q, k, v, pos_q, doc_pos_q, pos_k, doc_pos_k, Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, causal);
    p.out_w = (bf16 *)out;
    p.lse_w = lse;
    attn_plan(&p, 0); /* Tk = 0: no bitmask words, every block writes out 0 and lse -inf */
    switch (hd) {
    case 64: attn_launch_forward_v2<64>(p); break;
    case 128: attn_launch_forward_v2<128>(p); break;
    default: attn_launch_forward_v2<256>(p); break;
    }
}

extern "C" void cuda_attention_backward(float *dq /* (Tq,ldq) += */, float *dk /* (Tk,ldk) += */,
                                        float *dv /* (Tk,ldk) += */, const void *dout /* (Tq,ldo) */,
                                        const void *out /* (Tq,ldo) final */, const float *lse /* (Tq,nh) final */,
                                        const void *q /* (Tq,ldq) */, const void *k /* (Tk,ldk) */,
                                        const void *v /* (Tk,ldk) */, const int32_t *pos_q /* (Tq) */,
                                        const int32_t *doc_pos_q /* (Tq) */, const int32_t *pos_k /* (Tk) */,
                                        const int32_t *doc_pos_k /* (Tk) */, int64_t Tq, int64_t Tk, int nh, int nkv,
                                        int hd, int ldq, int ldk, int ldo, int causal) {
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
    case 64: attn_launch_backward_v3<64>(p); break;
    case 128: attn_launch_backward_v3<128>(p); break;
    default: attn_launch_backward_v3<256>(p); break;
    }
}

extern "C" void cuda_attention_merge(float *out /* (T,nh*hd) running */, float *lse /* (T,nh) running */,
                                     const void *out_b /* (T,ldb) partial */, const float *lse_b /* (T,nh) partial */,
                                     int64_t T, int nh, int hd, int ldb) {
    RS_CHECK(T >= 0 && nh > 0 && hd > 0 && ldb >= nh * hd, "cuda_attention_merge: T = %lld, nh = %d, hd = %d, ldb = %d",
             (long long)T, nh, hd, ldb);
    if (T == 0) return;
    const int64_t warps = T * nh;
    attn_merge_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, cuda_stream()>>>(out, lse, (const bf16 *)out_b, lse_b, T,
                                                                              nh, hd, ldb);
    CUDA_LAUNCH_CHECK();
}
