/*
 * forward.cu — the attention forward (Backend attention_forward, cuda_attention_forward): out (Tq,ldo) bf16
 * and lse (Tq,nh) fp32 of q (Tq,ldq) against k, v (Tk,ldk) under the document / causal mask (attention.cuh,
 * cuda_kernels.h). One block of three warpgroups per (head, 128 queries), the heaviest query blocks first:
 * one producer warp loads K / V tiles by TMA into a ring of stages, two consumer warpgroups of 64 query
 * rows each compute S = Q K^T and O += P V with wgmma (128-byte swizzled tiles read through matrix
 * descriptors) and an online softmax in exp2 (ex2.approx, subnormal P flushed to 0); only live key tiles
 * (tiles.cu) are loaded, partial ones masked element by element. Callers: the Backend table,
 * lib/cp/cp_ring.c (the ring's pieces, merged by merge.cu), tests/cuda/test_cuda_attention.cu.
 */
#include "attention.cuh"
#include "cuda_kernels.h"

/* ---- the kernel: wgmma + TMA, warp-specialised ------------------------------------------------ */

#define AWG_BM      128 /* query rows per block: two consumer warpgroups of 64 rows */

template <int HD>
struct AttnFwdCfg {
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
    attn_forward_kernel(const AttnParams p, const __grid_constant__ CUtensorMap tm_q,
                       const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
    typedef AttnFwdCfg<HD> C;
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
            if constexpr (HD == 64) ptx_wgmma_rs_n64(o, pa[kk], db);
            else if constexpr (HD == 128) ptx_wgmma_rs_n128(o, pa[kk], db);
            else ptx_wgmma_rs_n256(o, pa[kk], db);
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

template <int HD>
static void attn_launch_forward(const AttnParams &p) {
    typedef AttnFwdCfg<HD> C;
    static int done;
    attn_smem_limit(attn_forward_kernel<HD>, C::bytes, &done);
    CUtensorMap tq, tk, tv;
    memset(&tk, 0, sizeof tk);
    memset(&tv, 0, sizeof tv);
    attn_tmap(&tq, p.q, p.Tq, p.nh * HD, p.ldq, AWG_BM);
    if (p.Tk > 0) { /* Tk = 0: no tile is live, the maps are never read */
        attn_tmap(&tk, p.k, p.Tk, p.nkv * HD, p.ldk, C::BN);
        attn_tmap(&tv, p.v, p.Tk, p.nkv * HD, p.ldk, C::BN);
    }
    const int nqb = (p.Tq + AWG_BM - 1) / AWG_BM;
    attn_forward_kernel<HD><<<dim3(p.nh, nqb), AWG_THREADS, C::bytes, cuda_stream()>>>(p, tq, tk, tv);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_attention_forward(void *out /* (Tq,ldo) nh heads of hd */, float *lse /* (Tq,nh) */,
                                       const void *q /* (Tq,ldq) */, const void *k /* (Tk,ldk) nkv heads */,
                                       const void *v /* (Tk,ldk) */, const int32_t *pos_q /* (Tq) */,
                                       const int32_t *doc_pos_q /* (Tq) */, const int32_t *pos_k /* (Tk) */,
                                       const int32_t *doc_pos_k /* (Tk) */, const AttnHint *hint /* unused */,
                                       int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo,
                                       int causal) {
    attn_check_args("cuda_attention_forward", Tq, Tk, nh, nkv, hd, ldq, ldk, ldo);
    if (Tq == 0) return;
    RS_CHECK(attn_aligned16(out) && attn_aligned16(q) && (Tk == 0 || (attn_aligned16(k) && attn_aligned16(v))),
             "cuda_attention_forward: out, q, k, v must be 16-byte aligned");
    AttnParams p = attn_params(q, k, v, pos_q, doc_pos_q, pos_k, doc_pos_k, Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, causal);
    p.out_w = (bf16 *)out;
    p.lse_w = lse;
    attn_plan(&p, 0); /* Tk = 0: no bitmask words, every block writes out 0 and lse -inf */
    switch (hd) {
    case 64: attn_launch_forward<64>(p); break;
    case 128: attn_launch_forward<128>(p); break;
    default: attn_launch_forward<256>(p); break;
    }
}

