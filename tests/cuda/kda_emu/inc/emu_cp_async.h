/*
 * emu_cp_async.h (kda_emu) — cp.async of kernels/cuda/cuda_ptx.h (ptx_cp_async16 / 4, _commit, _wait) on the host,
 * for the emulation's cuda_gdn_mma.h beside it (the KDA and GDN kernels) and tests/cuda/gdn_emu/inc/cuda_ptx.h: a
 * copy lands only when a wait retires its group (below). emu_mma_fault stops the program on a use the hardware
 * would not allow (a misaligned address, ...).
 */
#ifndef RS_EMU_CP_ASYNC_H
#define RS_EMU_CP_ASYNC_H
#include "cuda_common.h"

static inline void emu_mma_fault(const char *what) {
    fprintf(stderr, "emu gdn_warp_mma: %s\n", what);
    abort();
}

/* cp.async (cuda_ptx.h's ptx_cp_async16 / 4 / _commit / _wait) with the hardware's freedom made visible: a copy is
 * queued in the thread's open group and lands only when a ptx_cp_async_wait<N> retires its group (all but the N
 * most recent committed groups), so a tile read before its wait holds the previous chunk's bytes (or the
 * launch's garbage) and fails the comparison; an invalid copy writes zeros. Addresses must be aligned to the
 * copy's size, as on the device. */
struct EmuCopy { unsigned char *dst; const unsigned char *src; bool ok; int n; };
struct EmuCpState { std::vector<std::vector<EmuCopy>> groups; std::vector<EmuCopy> open; };
/* each CUDA thread's copies, fresh for every block (emu_fiber_epoch changes with every block run) */
static inline EmuCpState &emu_cp(void) {
    static EmuCpState s[1024];
    static uint64_t epoch[1024];
    const int t = emu_tid();
    if (epoch[t] != emu_fiber_epoch()) {
        s[t] = EmuCpState();
        epoch[t] = emu_fiber_epoch();
    }
    return s[t];
}
static inline void ptx_cp_async16(void *smem, const void *gmem, bool valid) {
    if (((uintptr_t)smem & 15) != 0 || (valid && ((uintptr_t)gmem & 15) != 0))
        emu_mma_fault("cp.async16 address not 16-byte aligned");
    emu_cp().open.push_back(EmuCopy{(unsigned char *)smem, (const unsigned char *)gmem, valid, 16});
}
/* 4 bytes (cp.async.ca ... 4: the GDN kernels' gate rows), the same rules at 4-byte alignment */
static inline void ptx_cp_async4(void *smem, const void *gmem, bool valid) {
    if (((uintptr_t)smem & 3) != 0 || (valid && ((uintptr_t)gmem & 3) != 0))
        emu_mma_fault("cp.async4 address not 4-byte aligned");
    emu_cp().open.push_back(EmuCopy{(unsigned char *)smem, (const unsigned char *)gmem, valid, 4});
}
static inline void ptx_cp_async_commit(void) {
    EmuCpState &s = emu_cp();
    s.groups.push_back(std::move(s.open));
    s.open.clear();
}
template <int N> static inline void ptx_cp_async_wait(void) {
    EmuCpState &s = emu_cp();
    while (s.groups.size() > (size_t)N) {
        for (const EmuCopy &c : s.groups.front()) {
            if (c.ok) memcpy(c.dst, c.src, c.n);
            else memset(c.dst, 0, c.n);
        }
        s.groups.erase(s.groups.begin());
    }
}

#endif
