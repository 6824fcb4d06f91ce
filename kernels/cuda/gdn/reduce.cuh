/*
 * reduce.cuh — the small fp32 kernels of the GDN entries: the GVA group reduction of dq, dk (the value
 * heads of a key head summed in head order, one bf16 rounding) and state_affine, S_out = op(M) S_in + H
 * (fp32 IEEE, tiled). Part of gdn.cu.
 */
#pragma once

/* dq, dk per key head = the value heads of its group summed in head order (fp32), one bf16 rounding */
__global__ void gdn_group_reduce_kernel(bf16 *dq /* (T,ldq) */, bf16 *dk /* (T,ldq) */,
                                        const float *dqv /* (T,nv,DK) */, const float *dkv /* (T,nv,DK) */,
                                        int64_t T, int nk, int nv, int DK, int ldq) {
    const int half = DK / 2;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = T * nk * half;
    if (i >= n) return;
    const int64_t t = i / (nk * half);
    const int rem = (int)(i % (nk * half)), kh = rem / half, a = (rem % half) * 2, grp = nv / nk;
    float2 sq = make_float2(0.0f, 0.0f), sk = make_float2(0.0f, 0.0f);
    for (int gi = 0; gi < grp; gi++) {
        const int64_t off = (t * nv + kh * grp + gi) * DK + a;
        const float2 x = *(const float2 *)(dqv + off), y = *(const float2 *)(dkv + off);
        sq.x += x.x;
        sq.y += x.y;
        sk.x += y.x;
        sk.y += y.y;
    }
    gdn_store2(dq + t * ldq + (int64_t)kh * DK + a, sq.x, sq.y);
    gdn_store2(dk + t * ldq + (int64_t)kh * DK + a, sk.x, sk.y);
}

/* S_out = op(M) S_in + H, fp32 fmaf in ascending b, per head; 32x32 output tiles, 4 rows per thread */
__global__ void __launch_bounds__(256)
    gdn_state_affine_kernel(float *S_out /* (nv,dk,dv) */, const float *M /* (nv,dk,dk) */,
                            const float *S_in /* (nv,dk,dv) or NULL */, const float *H /* (nv,dk,dv) */,
                            int transpose_M, int dk, int dv) {
    __shared__ float sM[32][33], sS[32][33];
    const int h = blockIdx.z, a0 = blockIdx.y * 32, c0 = blockIdx.x * 32, tx = threadIdx.x, ty = threadIdx.y;
    const float *Mh = M + (int64_t)h * dk * dk;
    const int64_t so = (int64_t)h * dk * dv;
    float acc[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int a = a0 + ty + 8 * i, cc = c0 + tx;
        acc[i] = (a < dk && cc < dv) ? H[so + (int64_t)a * dv + cc] : 0.0f;
    }
    if (S_in) {
        for (int b0 = 0; b0 < dk; b0 += 32) {
            for (int r = ty; r < 32; r += 8) {
                /* sM[x][y] = op(M)[a0 + x][b0 + y] */
                if (!transpose_M) {
                    const int a = a0 + r, b = b0 + tx;
                    sM[r][tx] = (a < dk && b < dk) ? Mh[(int64_t)a * dk + b] : 0.0f;
                } else {
                    const int b = b0 + r, a = a0 + tx;
                    sM[tx][r] = (a < dk && b < dk) ? Mh[(int64_t)b * dk + a] : 0.0f;
                }
                const int b = b0 + r, cc = c0 + tx;
                sS[r][tx] = (b < dk && cc < dv) ? S_in[so + (int64_t)b * dv + cc] : 0.0f;
            }
            __syncthreads();
#pragma unroll 8
            for (int bb = 0; bb < 32; bb++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[i] = fmaf(sM[ty + 8 * i][bb], sS[bb][tx], acc[i]);
            __syncthreads();
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int a = a0 + ty + 8 * i, cc = c0 + tx;
        if (a < dk && cc < dv) S_out[so + (int64_t)a * dv + cc] = acc[i];
    }
}

