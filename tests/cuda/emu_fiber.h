/*
 * emu_fiber.h — the CUDA threads of one block, run by the host emulations (tests/cuda/kda_emu/, tests/cuda/glue_emu/)
 * as cooperative fibers on the calling thread: each CUDA thread has its own stack and runs until it waits at a
 * barrier (a __syncthreads, or a warp's shuffle / ballot / __syncwarp), then the next thread runs. A barrier releases
 * when all of its threads have arrived, as on the device; a block whose threads can no longer make progress (a
 * barrier reached by part of a warp or block, undefined on the device) stops the program with a message instead of
 * hanging. One OS thread and a switch of a few registers per wait: the emulation's cost is the kernels' arithmetic,
 * not the operating system's scheduler.
 *
 *   emu_fiber_run(n, enter, body, ctx)  runs body(ctx, i) for i in [0, n) as n fibers; enter(i) runs before fiber i
 *                                       is resumed (it sets the emulation's threadIdx and lane); returns when all end
 *   emu_barrier_init(&b, n)             a barrier of n fibers
 *   emu_barrier_wait(&b)                arrive, and wait until all n have arrived
 *   emu_fiber_epoch()                   a number that changes with every emu_fiber_run (per-block fiber state)
 *
 * x86-64 System V only (the switch saves the callee-saved registers and the stack pointer). Stacks are 1 MiB each
 * with a guard page below, mapped once and reused.
 */
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <vector>

#if !defined(__x86_64__)
#error "emu_fiber.h: the fiber switch is written for x86-64"
#endif

/* emu_ctx_switch(save, load): saves the callee-saved registers on the current stack and its pointer in *save, then
 * continues on the stack `load` (made by an earlier switch, or by emu_fiber_run for a fiber not yet started) */
extern "C" void emu_ctx_switch(void **save, void *load);
__asm__(".pushsection .text.emu_ctx_switch,\"axG\",@progbits,emu_ctx_switch,comdat\n"
        ".weak emu_ctx_switch\n"
        ".type emu_ctx_switch,@function\n"
        "emu_ctx_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_ctx_switch, .-emu_ctx_switch\n"
        ".popsection\n");

struct EmuBarrier { int n, arrived; uint64_t gen; };

struct EmuFiberRun {
    void *sched_sp;               /* the scheduler's stack while a fiber runs */
    std::vector<void *> sp;       /* [n] each fiber's saved stack pointer */
    std::vector<char> done;       /* [n] */
    int cur;                      /* the fiber running */
    uint64_t progress;            /* arrivals, releases and ends: a pass without any is a deadlock */
    void (*body)(void *, int);
    void *ctx;
};

inline EmuFiberRun *&emu_fiber_cur_run() { static EmuFiberRun *r; return r; }
inline uint64_t &emu_fiber_epoch_ref() { static uint64_t e; return e; }
inline uint64_t emu_fiber_epoch() { return emu_fiber_epoch_ref(); }

enum { EMU_FIBER_STACK = 1 << 20, EMU_FIBER_GUARD = 1 << 12 };
/* the stack of fiber i: [EMU_FIBER_GUARD bytes of guard | EMU_FIBER_STACK bytes], mapped on first use, kept */
inline char *emu_fiber_stack_top(int i) {
    static std::vector<char *> stacks;
    while ((int)stacks.size() <= i) {
        char *m = (char *)mmap(NULL, EMU_FIBER_GUARD + EMU_FIBER_STACK, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED || mprotect(m, EMU_FIBER_GUARD, PROT_NONE) != 0) {
            fprintf(stderr, "emu_fiber: cannot map the stack of fiber %zu\n", stacks.size());
            abort();
        }
        stacks.push_back(m);
    }
    return stacks[i] + EMU_FIBER_GUARD + EMU_FIBER_STACK;
}

/* back to the scheduler; the fiber continues here when it is resumed */
inline void emu_fiber_yield() {
    EmuFiberRun *r = emu_fiber_cur_run();
    emu_ctx_switch(&r->sp[r->cur], r->sched_sp);
}

/* a fiber's first frame: runs its body, then hands its stack back for good */
inline void emu_fiber_entry() {
    EmuFiberRun *r = emu_fiber_cur_run();
    r->body(r->ctx, r->cur);
    r = emu_fiber_cur_run();
    r->done[r->cur] = 1;
    r->progress++;
    void *dead;
    emu_ctx_switch(&dead, r->sched_sp);
    abort(); /* never resumed */
}

inline void emu_barrier_init(EmuBarrier *b, int n) { *b = EmuBarrier{n, 0, 0}; }
inline void emu_barrier_wait(EmuBarrier *b) {
    emu_fiber_cur_run()->progress++;
    if (++b->arrived == b->n) {
        b->arrived = 0;
        b->gen++;
        return;
    }
    const uint64_t g = b->gen;
    while (b->gen == g) emu_fiber_yield();
}

inline void emu_fiber_run(int n, void (*enter)(int), void (*body)(void *, int), void *ctx) {
    EmuFiberRun r;
    r.sp.resize(n);
    r.done.assign(n, 0);
    r.progress = 0;
    r.body = body;
    r.ctx = ctx;
    emu_fiber_epoch_ref()++;
    for (int i = 0; i < n; i++) {
        /* the frame emu_ctx_switch pops: six registers, then emu_fiber_entry as the return address, above it a zero
         * return address for emu_fiber_entry itself (so it starts with the stack aligned as after a call) */
        void **s = (void **)emu_fiber_stack_top(i);
        *--s = nullptr;
        *--s = (void *)&emu_fiber_entry;
        for (int k = 0; k < 6; k++) *--s = nullptr;
        r.sp[i] = s;
    }
    EmuFiberRun *outer = emu_fiber_cur_run();
    emu_fiber_cur_run() = &r;
    int live = n;
    while (live > 0) {
        const uint64_t before = r.progress;
        for (int i = 0; i < n; i++) {
            if (r.done[i]) continue;
            r.cur = i;
            enter(i);
            emu_ctx_switch(&r.sched_sp, r.sp[i]);
            live -= r.done[i];
        }
        if (live > 0 && r.progress == before) {
            fprintf(stderr, "emu_fiber: deadlock: %d of %d threads of the block wait at a barrier that the others do "
                            "not reach\n", live, n);
            abort();
        }
    }
    emu_fiber_cur_run() = outer;
}
