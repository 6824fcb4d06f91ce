/*
 * cuda_ptx.h — the one set of inline-PTX wrappers of the cuda kernels (sm_90a), for the attention and
 * the Gated DeltaNet families alike: mma.sync m16n8k16 with ldmatrix and cp.async (the GDN per-chunk
 * kernels and mma.sync state passes), wgmma.mma_async with its shared-memory descriptors, fence /
 * commit / wait (the attention kernels, the GDN wgmma state passes), mbarriers, TMA tile loads, stores
 * and reduce-adds with their bulk async-groups, proxy fences, acquire / release semaphores, ex2.approx
 * and setmaxnreg. Each wrapper is one instruction (or one spin loop); names say the instruction.
 * Included by kernels/cuda/attention/attention.cuh, gdn/gdn.cu (for its .cuh files) and cuda_gdn_mma.h.
 *
 * The wgmma wrappers with their long operand lists were written out by a throwaway script (one function
 * per shape, not kept: edit them by hand); each accumulator is a named array element with a constant
 * index, so the arrays stay in registers.
 *
 * Accumulator layout of wgmma m64nNk16 (fp32): warp w of the warpgroup owns rows 16w..16w+15; in it,
 * lane l = 4g + t holds, for each 8-column block i, d[4i+0], d[4i+1] at (row g, cols 8i+2t, 8i+2t+1)
 * and d[4i+2], d[4i+3] at (row g+8, same cols) - the mma.sync m16n8 C fragment repeated N/8 times.
 * The A fragment in registers (m64k16 bf16) is the mma.sync m16n8k16 A fragment of the warp's 16 rows,
 * so an S accumulator becomes the A operand of the next product by packing pairs (no shuffles).
 */
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

/* ---- mma.sync, ldmatrix, cp.async ---- */

static __device__ __forceinline__ uint32_t ptx_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i */
static __device__ __forceinline__ void ptx_ldmatrix_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(ptx_smem_addr(p)));
}

/* the same, each 8x8 matrix transposed on the way */
static __device__ __forceinline__ void ptx_ldmatrix_x4_trans(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(ptx_smem_addr(p)));
}

/* four 8x8 b16 matrices to shared memory, each transposed on the way: lane 4g + t gives element pair (g, 2t),
 * (g, 2t + 1) of matrix i in r[i]; lanes 8i..8i+7 give the addresses of the stored rows of matrix i (row j:
 * the matrix's column j) */
static __device__ __forceinline__ void ptx_stmatrix_x4_trans(uint32_t saddr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(saddr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

/* c += a b: bf16 operands, fp32 accumulation */
static __device__ __forceinline__ void ptx_mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared, asynchronously; valid == false writes 16 zero bytes (src is not read) */
static __device__ __forceinline__ void ptx_cp_async16(void *smem, const void *gmem, bool valid) {
    const unsigned n = valid ? 16u : 0u;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ptx_smem_addr(smem)), "l"(gmem), "r"(n));
}

/* 4 bytes global -> shared, asynchronously; valid == false writes zero */
static __device__ __forceinline__ void ptx_cp_async4(void *smem, const void *gmem, bool valid) {
    const unsigned n = valid ? 4u : 0u;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(ptx_smem_addr(smem)), "l"(gmem), "r"(n));
}

static __device__ __forceinline__ void ptx_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }

/* wait until at most N of this thread's committed groups are still in flight */
template <int N> static __device__ __forceinline__ void ptx_cp_async_wait(void) { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* two floats -> one bf16x2 register, `lo` in the low half (the lower column of a fragment) */
static __device__ __forceinline__ uint32_t ptx_pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* ---- wgmma ---- */


/* shared-memory matrix descriptor: start address, leading and stride byte offsets (16-byte units),
 * swizzle mode 1 = 128-byte swizzle (the tile must sit at a 1024-byte aligned address; an offset of
 * 32 * k bytes inside the first 128-byte row selects the k-th 16-element slice of a K-major tile) */
static __device__ __forceinline__ uint64_t ptx_gdesc(uint32_t saddr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    uint64_t d = 0;
    d |= (uint64_t)((saddr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

static __device__ __forceinline__ void ptx_wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void ptx_wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void ptx_wg_wait(void) { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

/* keeps the compiler from moving accesses of an accumulator across the async wgmma region */
static __device__ __forceinline__ void ptx_reg_fence(float &x) { asm volatile("" : "+f"(x)::"memory"); }
/* the same for a register A operand: its value is made before the wgmma region begins (else ptxas injects a
 * warpgroup.arrive before the product that reads it) */
static __device__ __forceinline__ void ptx_reg_fence(uint32_t &x) { asm volatile("" : "+r"(x)::"memory"); }

/* d (64 x N) (+)= A (64 x 16) * B (16 x N), both from shared-memory descriptors, for N = 64, 128, 32;
 * scale_d = 0 overwrites d. TA = 0: A stored K-major (row = m), 1: M-major (transposed: row = k);
 * TB = 0: B stored K-major (row = n, i.e. the product is A B^T of the stored tile), 1: N-major
 * (transposed: row = k). Uses: attention S = Q K^T and dP = dO V^T (0, 0); the fused backward's dQ = dS K
 * (1, 1: dS^T and K both stored row = key); the hd 256 QS backward's dV, dK (0, 1); the GDN wgmma forward
 * state pass (gdn/state_forward_wgmma.cuh: W h (0, 1), K^T vn (1, 1)). */
template <int TA = 0, int TB = 0>
static __device__ __forceinline__ void ptx_wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
}

template <int TA = 0, int TB = 0>
static __device__ __forceinline__ void ptx_wgmma_ss_n128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
}

template <int TA = 0, int TB = 0>
static __device__ __forceinline__ void ptx_wgmma_ss_n32(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, %19, %20;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
}

/* d (64 x N) (+)= A (64 x 16, registers: the m16n8k16 A fragment of each warp's 16 rows) * B (16 x N, smem),
 * N = 64, 128, 256: TB = 1: B N-major (transposed: row = k), 0: K-major (row = n); scale_d = 0 overwrites d.
 * Uses: attention O += P V (1), its backward's dV, dK (1); the GDN forward state pass with the state in
 * registers (gdn/state_forward_regs.cuh: S^T W^T (0), S^T += vn^T K (1)). */
template <int TB = 1>
static __device__ __forceinline__ void ptx_wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                                         int scale_d = 1) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB));
}

template <int TB = 1>
static __device__ __forceinline__ void ptx_wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                                         int scale_d = 1) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB));
}

template <int TB = 1>
static __device__ __forceinline__ void ptx_wgmma_rs_n256(float (&d)[128], const uint32_t (&a)[4], uint64_t db,
                                                         int scale_d = 1) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB));
}

/* ---- mbarriers, TMA, register reallocation ---- */

/* make the initialised mbarriers visible to the async proxy (one thread, after ptx_mbar_init) */
static __device__ __forceinline__ void ptx_mbar_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

static __device__ __forceinline__ void ptx_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void ptx_mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void ptx_mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void ptx_mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* a 2-d box of a tensor map (coordinates: c0 = column, c1 = row) -> shared memory, completing on bar */
static __device__ __forceinline__ void ptx_tma_load_2d(uint32_t dst, const void *tmap, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(tmap), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* named barrier `id` (1..15) over `n` threads (a multiple of 32) */
static __device__ __forceinline__ void ptx_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

/* generic-proxy shared-memory writes -> visible to later wgmma (async proxy) reads */
static __device__ __forceinline__ void ptx_fence_proxy_async(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* a 2-d box of shared memory added (fp32 +=) into a tensor map's global tensor by the TMA unit, as one
 * bulk async-group op of this thread (coordinates: c0 = column, c1 = row; rows past the end are dropped) */
static __device__ __forceinline__ void ptx_tma_reduce_add_2d(const void *tmap, int c0, int c1, uint32_t src) {
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n"
                 ::"l"(tmap), "r"(c0), "r"(c1), "r"(src)
                 : "memory");
}
/* a 2-d box of shared memory -> a tensor map's global tensor by the TMA unit (c0 = column, c1 = row; rows
 * past the end are dropped), one bulk async-group op of this thread */
static __device__ __forceinline__ void ptx_tma_store_2d(const void *tmap, int c0, int c1, uint32_t src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(tmap), "r"(c0),
                 "r"(c1), "r"(src)
                 : "memory");
}
static __device__ __forceinline__ void ptx_bulk_commit(void) { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* this thread's bulk async-groups but N: their shared-memory sources read (.read) / their writes done */
template <int N>
static __device__ __forceinline__ void ptx_bulk_wait_read(void) { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
template <int N>
static __device__ __forceinline__ void ptx_bulk_wait(void) { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }
/* orders this thread's generic-proxy global accesses with its async-proxy (TMA) ones */
static __device__ __forceinline__ void ptx_fence_proxy_async_global(void) { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

/* gpu-scope acquire load / release store of a global semaphore word */
static __device__ __forceinline__ uint32_t ptx_ld_acquire(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void ptx_st_release(uint32_t *p, uint32_t v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

/* fire-and-forget fp32 adds of two adjacent floats (8-byte aligned) in L2 */
static __device__ __forceinline__ void ptx_red_add2(float *p, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}

/* 2^x, flushing subnormal results to 0 (one MUFU.EX2) */
static __device__ __forceinline__ float ptx_ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

template <int R>
static __device__ __forceinline__ void ptx_setmaxnreg_inc(void) { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
static __device__ __forceinline__ void ptx_setmaxnreg_dec(void) { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
