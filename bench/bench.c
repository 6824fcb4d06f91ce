/*
 * bench.c — `ringscan bench attn|gdn|kda|step|all|cp [options]` (bench.h):
 * the options, the order of the work, the FLOP and byte counts, the floors,
 * the tables and OUT/bench.json. `bench cp` (ranks under mpirun) shares the
 * options and the cases and runs in bench_cp.c.
 *
 * Order: options are parsed and checked first (a bad value names its option,
 * exit 2), then the device (no usable GPU: exit 2 naming the device), then for
 * kda the cuda backend's KDA entries (any NULL: exit 2 naming them), then,
 * with --peer, every peer script runs while this process has created no CUDA
 * context yet (the peers find the GPU empty), then our cases: the step first
 * (so its memory reading is not inflated by the kernels' grown workspaces),
 * then attention, then GDN, then KDA. Then one table per benchmark, ours and
 * the peers' rows side by side.
 *
 * Conventions (printed above each table):
 *   attention  forward FLOPs 4 * T^2/2 * hd * nh (causal: half the T x T pairs, 2 FLOPs
 *              per multiply-add; with documents, --doc-len, the sum over documents of
 *              L^2/2 in place of T^2/2); backward 2.5x the forward; fwd+bwd 3.5x.
 *   GDN        plan_gdn_chunk_flops per chunk of 64 and head (FLA's kernel split,
 *              docs/design/gdn-kernels.md, "FLOPs counted"), chunks counted whole per document.
 *   KDA        GDN's count (plan counts a KDA chunk as GDN's: docs/design/kda.md; the
 *              per-channel decays are elementwise work); g and dg are K wide in the bytes.
 *   floors     max(FLOPs / peak, minimum bytes / bandwidth): every input read once, every
 *              output written once, bf16 activations, fp32 gates and statistics.
 *   step       MFU = model FLOPs per token x tokens/s / peak: plan's (attention causal, one
 *              document); with documents (--doc-len) plan's attention term times
 *              sum(L^2) / T^2, the share the document mask leaves (GDN and dense as plan).
 *   ratio      peer time / ringscan time (> 1: ringscan is faster).
 *
 * Callers: cmd/ringscan.c (bench_main).
 */
#include "bench.h"
#include "bench_common.h"
#include "bench_cp.h"
#include "core/build_info.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/error.h"
#include "cp/cp.h"
#include "io/fsio.h"
#include "model/model_acts.h"
#include "plan/plan.h"
#include "core/rng.h"
#ifdef RS_WITH_CUDA
#include "cuda_attention_tune.h"
#include "cuda_setup.h"
#include "cuda_bench.h"
#include "cuda_gdn_tune.h"
#include "cuda_profile.h"
#endif

static const int bench_gdn_tune_max[BENCH_GDN_TUNE_N] = {64, 3, 64, 64, 4, 3, 2, 2, 128, 1 << 24, 128};
static const int bench_attn_tune_max[BENCH_ATTN_TUNE_N] = {1, 1};

static const char bench_usage[] =
    "usage: ringscan bench attn|gdn|kda|step|all [options]\n"
    "       mpirun -np P ringscan bench cp [options]\n"
    "\n"
    "Times our attention, Gated DeltaNet and Kimi Delta Attention kernels (forward, forward+backward) and one\n"
    "training step on the GPU with CUDA events (warm-up, then the median of the repetitions), on random inputs,\n"
    "and prints shape, ms, TFLOP/s and time over the floor; with --peer, runs the peer scripts of bench/peer on\n"
    "the same GPU first (PyTorch SDPA flash and cuDNN, flash-linear-attention, transformers Qwen3Next) and\n"
    "adds their rows and the ratio peer time / ringscan time (> 1: ringscan faster). Needs a GPU.\n"
    "\n"
    "  attn: causal, bf16, one document (--doc-len: several); FLOPs 4*sum(L^2)/2*hd*nh forward over the\n"
    "        documents' lengths L, backward 2.5x forward.\n"
    "  gdn:  K = V, bf16 q/k/v, fp32 gates; FLOPs per chunk of 64 from plan (docs/design/gdn-kernels.md).\n"
    "  kda:  Kimi Delta Attention's chunk (kda_chunk_forward/backward, docs/design/kda.md): as gdn, with g\n"
    "        (T, H, K) fp32, a log decay per key channel (kimi_linear's gate of random f); FLOPs as gdn's (plan);\n"
    "        --peer: FLA's chunk_kda. Refused (exit 2, naming them) where the cuda backend's kda entries are NULL.\n"
    "  step: one optimizer step of --config at --tokens tokens on one GPU (cp 1, dp 1, one sample):\n"
    "        tokens/s, MFU (plan's model FLOPs, attention causal, over --peak-tflops), peak memory;\n"
    "        --doc-len: a case per mean length (documents packed in the sample, no prediction across a\n"
    "        document end), attention FLOPs within documents (plan's term x sum(L^2)/T^2).\n"
    "  cp:   context parallelism over the P ranks of mpirun (one per GPU), one document, with the CP code\n"
    "        the model runs (lib/cp/cp_ring.c, lib/cp/cp_gdn.c): ring attention and the GDN layer (conv halo,\n"
    "        conv, L2 norm, scan, chunk), fwd and fwd+bwd at the global T; the same shapes on one GPU\n"
    "        (every rank at once, rank 0 reported) for CP efficiency = one-GPU ms / (P x CP ms); the ring\n"
    "        with its exchanges waited at once (serial) beside the production overlap, per step compute\n"
    "        and communication, each exchange alone; --peer: torch context_parallel (cuDNN SDPA) and\n"
    "        flash-linear-attention's CP on the same P GPUs; --parts kda: the KDA layer (the same conv halo,\n"
    "        conv, L2 norm, and the core with the per-channel transition, CpGdnCore.kda) beside FLA's KDA CP.\n"
    "  all:  attn, gdn and step (not kda, not cp).\n"
    "\n"
    "Options (LIST: comma-separated):\n"
    "  --T LIST            attn, gdn, kda: sequence lengths, multiples of 64 (default 32768,131072);\n"
    "                      cp: of the ring, multiples of 128 x P (default 131072,262144,524288)\n"
    "  --attn-shapes LIST  attn: NH/NKV/HD heads, kv heads, head dim (default 16/16/128,16/2/128,16/16/256,16/2/256;\n"
    "                      cp: 16/16/128,16/2/128)\n"
    "  --attn-impl K       attn, cp: ringscan (ours), cudnn or cudnn_det: cuDNN's fused attention where it takes\n"
    "                      the call, as device.attention_kernel (rows keep impl ringscan, with attn_impl and the\n"
    "                      calls routed to each side; cp: the ring's calls; default ringscan)\n"
    "  --ring-calls C      cp: pairs (the zigzag rule's diagonals and rectangles, one call each), steps (one call\n"
    "                      per ring step and sample) or auto (steps where the kernel runs a step's call fast or\n"
    "                      none of the pairs: what training runs; lib/cp/cp_ring.c) (default auto)\n"
    "  --ring-kv K         cp: kept (at cp 2 the forward keeps the received K|V for the backward, which exchanges\n"
    "                      none and sends its dK|dV home during its own block) or passed (the backward passes K|V\n"
    "                      again), as parallel.ring_keep_kv (default kept)\n"
    "  --gdn-chain C       cp: staged (the cp 2 chain's hand-offs after state passes alone) or whole (each\n"
    "                      fragment's pass whole), as parallel.gdn_chain_staged (staged needs --gdn-keep states);\n"
    "                      default staged\n"
    "  --gdn-cp M          cp: the GDN layer's state passing at cp > 1: auto (what training runs: cp_gdn_method,\n"
    "                      docs/design/gdn-cp.md), chain, hybrid or scan (chain and hybrid need --gdn-keep states\n"
    "                      and --gdn-chain staged above cp 2) (default auto)\n"
    "  --cudnn-lib PATH    attn, cp: libcudnn.so.9 for --attn-impl cudnn* (default: search, as\n"
    "                      device.cudnn_library)\n"
    "  --gdn-T LIST        cp: sequence lengths of the GDN and KDA layers, multiples of 128 x P (default\n"
    "                      65536,131072)\n"
    "  --parts LIST        cp: attn, gdn, kda (default attn,gdn)\n"
    "  --device D          cp: cuda or cpu (the cpu backend over MPI, for tests; default cuda when built with it)\n"
    "  --heads LIST        gdn, kda, cp: heads H, key heads = value heads (default 16,64)\n"
    "  --dim N             gdn, kda, cp: K = V, 64 or 128 (default 128)\n"
    "  --gdn-keep K        gdn, kda, cp: what the forward keeps for the backward, as checkpoint.gdn_keep: none, wy\n"
    "                      (W, U, gate cumsum) or states (also the chunk states h, vn) (default states)\n"
    "  --gdn-tune LIST     gdn: the state passes' configuration instead of the built-in choice, KEY=N items of\n"
    "                      kernels/cuda/cuda_gdn_tune.h (split, nst, bv, dseg, dual, state_fwd_wgmma,\n"
    "                      state_bwd_wgmma, dual_wgmma, state_fwd_wgmma_cols, state_bwd_wgmma_cols; the same\n"
    "                      bits either way within one pass) or piece (rows per piece of a call, backend.h\n"
    "                      GDN_PIECE_ROWS), e.g.\n"
    "                      state_fwd_wgmma=1,state_bwd_wgmma=1 (default: every choice built in)\n"
    "  --attn-tune LIST    attn, cp (cuda): our attention backward's measurement choices instead of the built-in\n"
    "                      ones, KEY=0|1 items of kernels/cuda/cuda_attention_tune.h: dq_atomic (dQ added by plain\n"
    "                      atomics, not in key-block order: not reproducible), throttle (hd 256's throttled\n"
    "                      instance at every size) (default: the built-in choices, what training runs)\n"
    "  --profile N         1: step: the GPU and host ms per step of every Backend entry (after the timed steps);\n"
    "                      gdn, kda: the time of every kernel of each entry (the kernels that report to the GDN\n"
    "                      profile, kernels/cuda/gdn/gdn_profile.cu); 2: also the state passes' cycles per\n"
    "                      phase (block 0), and step: every GDN / KDA call's kernels; information only: the\n"
    "                      timed rows are slower (default 0)\n"
    "  --doc-len LIST      gdn, kda, attn, step: mean document length in tokens, lengths drawn in [L/2, 3L/2);\n"
    "                      0 = one document per sample (default gdn, kda 0,2048; attn, step one document, no\n"
    "                      list; attn, step with it: each case per length, causal within documents, FLOPs per\n"
    "                      document; step refuses it with --peer, whose step reads no boundaries)\n"
    "  --config FILE       step: the config (default configs/hybrid-1b-256k-h200x4.yaml)\n"
    "  --set key=value     step: config override (repeatable; the keys bench fixes are refused)\n"
    "  --tokens N          step: tokens of the one sample (default 32768)\n"
    "  --warmup N          untimed runs before the timed ones (default 1)\n"
    "  --reps N            timed runs, median reported (default 5)\n"
    "  --max-s S           stop repeating a case after 3 timed runs once they took S seconds (default 8)\n"
    "  --peak-tflops X     dense bf16 peak for MFU and floors (default: 989 for H100 SXM and H200)\n"
    "  --hbm-tbps X        memory bandwidth for the floors (default: 3.35 for H100 SXM, 4.8 for H200)\n"
    "  --peer              run the peer scripts too (bench/peer/README.md: requirements, JSON contract)\n"
    "  --peer-dir DIR      where the peer scripts are (default bench/peer)\n"
    "  --python EXE        the Python that runs them (default python3)\n"
    "  --peer-timeout S    seconds each peer script may run (default 300)\n"
    "  --out DIR           requests, results, peer logs and bench.json (default runs/bench)\n"
    "  --seed N            seed of the random inputs (default 1)\n"
    "  --write-requests    only write OUT/request_KIND.json (the peers' input) and stop; needs no GPU\n"
    "                      (cp: request_cp_attn.json, request_cp_gdn.json, request_cp_kda.json, for P = the\n"
    "                      number of ranks)\n"
    "  --help              this text\n";

/* ---- options ------------------------------------------------------------------ */

/* Prints "ringscan bench: OPT VAL: WHAT" and the hint, exit 2. */
static noreturn void bench_bad(const char *opt, const char *val, const char *what) {
    fprintf(stderr, "ringscan bench: %s %s: %s\n  hint: `ringscan bench --help` shows the options\n", opt,
            val ? val : "", what);
    exit(RS_EXIT_USAGE);
}

static int64_t bench_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno) bench_bad(opt, s, "not an integer");
    if (v < lo || v > hi) {
        char msg[128];
        snprintf(msg, sizeof msg, "out of range [%lld, %lld]", (long long)lo, (long long)hi);
        bench_bad(opt, s, msg);
    }
    return v;
}

static double bench_parse_double(const char *opt, const char *s, double lo, double hi) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v)) bench_bad(opt, s, "not a number");
    if (v < lo || v > hi) {
        char msg[128];
        snprintf(msg, sizeof msg, "out of range [%g, %g]", lo, hi);
        bench_bad(opt, s, msg);
    }
    return v;
}

/* Splits a comma list into at most BENCH_MAX_LIST items (each copied into items[i], 64 bytes). */
static int bench_split(const char *opt, const char *s, char items[BENCH_MAX_LIST][64]) {
    int n = 0;
    const char *p = s;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0) bench_bad(opt, s, "empty item in the list");
        if (len >= 64) bench_bad(opt, s, "item too long");
        if (n == BENCH_MAX_LIST) bench_bad(opt, s, "more than 16 items");
        memcpy(items[n], p, len);
        items[n][len] = 0;
        n++;
        if (!c) break;
        p = c + 1;
    }
    return n;
}

/* --gdn-tune / --attn-tune: KEY=N items of a tune struct's fields (names[n], each in [0, max[f]]) into out[n] */
static void bench_parse_tune(const char *opt, const char *v, const char *const *names, const int *max, int n,
                             int *out) {
    char items[BENCH_MAX_LIST][64];
    const int m = bench_split(opt, v, items);
    for (int j = 0; j < m; j++) {
        char *eq = strchr(items[j], '=');
        if (!eq) bench_bad(opt, items[j], "expected KEY=N");
        *eq = 0;
        int f = 0;
        while (f < n && strcmp(items[j], names[f])) f++;
        if (f == n) { /* "unknown key (name, name, ...)" */
            char why[256];
            size_t w = (size_t)snprintf(why, sizeof why, "unknown key (");
            for (int k = 0; k < n && w < sizeof why; k++)
                w += (size_t)snprintf(why + w, sizeof why - w, "%s%s", k ? ", " : "", names[k]);
            if (w < sizeof why) snprintf(why + w, sizeof why - w, ")");
            bench_bad(opt, items[j], why);
        }
        out[f] = (int)bench_parse_int(opt, eq + 1, 0, max[f]);
    }
}

static const char *bench_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) bench_bad(argv[*i], NULL, "needs a value");
    return argv[++*i];
}

/* The keys `bench step` sets itself (one GPU, one sample); --set may not change them. */
static const char *const bench_fixed_keys[] = {"parallel.dp",     "parallel.cp",  "train.grad_accum",
                                               "data.micro_batch", "data.seq_len", "device.kind",
                                               "slurm.nodes",      "slurm.gpus_per_node", NULL};

/* Options that only `bench cp` takes, and the ones it does not. */
static const char *const bench_cp_only[] = {"--gdn-T",     "--parts",     "--device", "--ring-calls",
                                             "--ring-kv",   "--gdn-chain", "--gdn-cp", NULL};
static const char *const bench_cp_refused[] = {"--doc-len", "--config", "--set", "--tokens", "--peak-tflops",
                                               "--hbm-tbps", NULL};

static int bench_listed(const char *const *list, const char *a) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], a)) return 1;
    return 0;
}

static void bench_parse(BenchOptions *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->T[0] = 32768, o->T[1] = 131072, o->nT = 2;
    static const int shapes[4][3] = {{16, 16, 128}, {16, 2, 128}, {16, 16, 256}, {16, 2, 256}};
    memcpy(o->attn, shapes, sizeof shapes);
    o->n_attn = 4;
    o->heads[0] = 16, o->heads[1] = 64, o->n_heads = 2;
    o->dim = 128;
    o->gdn_keep = GDN_KEEP_STATES; /* checkpoint.gdn_keep's default */
    o->doc_len[0] = 0, o->doc_len[1] = 2048, o->n_doc_len = 2;
    o->config = "configs/hybrid-1b-256k-h200x4.yaml";
    o->tokens = 32768;
    o->warmup = 1, o->reps = 5, o->max_s = 8;
    o->peer_dir = "bench/peer", o->python = "python3", o->out_dir = "runs/bench";
    o->peer_timeout = 300;
    o->seed = 1;
    o->ring_calls = RING_CALLS_AUTO; /* parallel.ring_calls' default */
    o->ring_keep_kv = 1;             /* parallel.ring_keep_kv's */
    o->gdn_chain_staged = 1; /* parallel.gdn_chain_staged's default */
    o->gdn_cp = -1;          /* cp_gdn_method's choice */
    o->cudnn_lib = "";
    o->gdn_T[0] = 65536, o->gdn_T[1] = 131072, o->n_gdn_T = 2;
    o->cp_parts = BENCH_CP_ATTN | BENCH_CP_GDN;
#ifdef RS_WITH_CUDA
    o->cp_cpu = 0;
#else
    o->cp_cpu = 1;
#endif
    if (argc < 1) bench_bad("benchmark", NULL, "missing: attn, gdn, kda, step, all or cp");
    const char *what = argv[0];
    if (!strcmp(what, "all")) o->kinds[BENCH_ATTN] = o->kinds[BENCH_GDN] = o->kinds[BENCH_STEP] = 1; /* not kda */
    else if (!strcmp(what, "cp")) {
        o->cp = 1;
        static const int64_t cp_T[3] = {131072, 262144, 524288};
        memcpy(o->T, cp_T, sizeof cp_T);
        o->nT = 3;
        o->n_attn = 2; /* 16/16/128, 16/2/128 */
    } else {
        int found = 0;
        for (int k = 0; k < BENCH_KIND_COUNT; k++)
            if (!strcmp(what, bench_kind_names[k])) o->kinds[k] = found = 1;
        if (!found) bench_bad("benchmark", what, "unknown (attn, gdn, kda, step, all, cp)");
    }
    char items[BENCH_MAX_LIST][64];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (o->cp && bench_listed(bench_cp_refused, a)) bench_bad(a, NULL, "not an option of bench cp");
        if (!o->cp && bench_listed(bench_cp_only, a)) bench_bad(a, NULL, "an option of bench cp only");
        if (!strcmp(a, "--T") || !strcmp(a, "--gdn-T")) {
            const char *v = bench_value(argc, argv, &i);
            int64_t *T = a[2] == 'T' ? o->T : o->gdn_T;
            int n = bench_split(a, v, items);
            for (int j = 0; j < n; j++) {
                T[j] = bench_parse_int(a, items[j], 64, (int64_t)1 << 22);
                if (T[j] % 64) bench_bad(a, items[j], "must be a multiple of 64");
            }
            *(a[2] == 'T' ? &o->nT : &o->n_gdn_T) = n;
        } else if (!strcmp(a, "--parts")) {
            const char *v = bench_value(argc, argv, &i);
            int n = bench_split(a, v, items);
            o->cp_parts = 0;
            for (int j = 0; j < n; j++) {
                if (!strcmp(items[j], "attn")) o->cp_parts |= BENCH_CP_ATTN;
                else if (!strcmp(items[j], "gdn")) o->cp_parts |= BENCH_CP_GDN;
                else if (!strcmp(items[j], "kda")) o->cp_parts |= BENCH_CP_KDA;
                else bench_bad(a, items[j], "expected attn, gdn or kda");
            }
        } else if (!strcmp(a, "--device")) {
            const char *v = bench_value(argc, argv, &i);
            if (!strcmp(v, "cpu")) o->cp_cpu = 1;
            else if (!strcmp(v, "cuda")) o->cp_cpu = 0;
            else bench_bad(a, v, "expected cuda or cpu");
        } else if (!strcmp(a, "--attn-shapes")) {
            const char *v = bench_value(argc, argv, &i);
            o->n_attn = bench_split(a, v, items);
            for (int j = 0; j < o->n_attn; j++) {
                int nh, nkv, hd, used = 0;
                if (sscanf(items[j], "%d/%d/%d%n", &nh, &nkv, &hd, &used) != 3 || items[j][used])
                    bench_bad(a, items[j], "expected NH/NKV/HD, e.g. 16/2/128");
                if (nh < 1 || nh > 256 || nkv < 1 || nh % nkv) bench_bad(a, items[j], "NH must be a multiple of NKV, 1..256");
                if (hd != 64 && hd != 128 && hd != 256) bench_bad(a, items[j], "HD must be 64, 128 or 256");
                o->attn[j][0] = nh, o->attn[j][1] = nkv, o->attn[j][2] = hd;
            }
        } else if (!strcmp(a, "--attn-impl")) {
            const char *v = bench_value(argc, argv, &i);
            o->attn_impl = config_enum_index(attn_kernel_names, v);
            if (o->attn_impl < 0 || o->attn_impl == ATTN_KERNEL_AUTO)  /* a bench names the kernel it times */
                bench_bad(a, v, "expected ringscan, cudnn or cudnn_det");
        } else if (!strcmp(a, "--ring-calls")) {
            const char *v = bench_value(argc, argv, &i);
            o->ring_calls = config_enum_index(ring_calls_names, v);
            if (o->ring_calls < 0) bench_bad(a, v, "expected auto, pairs or steps");
        } else if (!strcmp(a, "--ring-kv")) {
            const char *v = bench_value(argc, argv, &i);
            if (strcmp(v, "kept") && strcmp(v, "passed")) bench_bad(a, v, "expected kept or passed");
            o->ring_keep_kv = !strcmp(v, "kept");
        } else if (!strcmp(a, "--gdn-chain")) {
            const char *v = bench_value(argc, argv, &i);
            if (strcmp(v, "staged") && strcmp(v, "whole")) bench_bad(a, v, "expected staged or whole");
            o->gdn_chain_staged = !strcmp(v, "staged");
        } else if (!strcmp(a, "--gdn-cp")) {
            const char *v = bench_value(argc, argv, &i);
            o->gdn_cp = strcmp(v, "auto") ? config_enum_index(cp_gdn_method_names, v) : -1;
            if (o->gdn_cp == CP_GDN_LOCAL || (o->gdn_cp < 0 && strcmp(v, "auto")))
                bench_bad(a, v, "expected auto, chain, hybrid or scan");
        } else if (!strcmp(a, "--cudnn-lib")) {
            o->cudnn_lib = bench_value(argc, argv, &i);
        } else if (!strcmp(a, "--heads")) {
            const char *v = bench_value(argc, argv, &i);
            o->n_heads = bench_split(a, v, items);
            for (int j = 0; j < o->n_heads; j++) o->heads[j] = (int)bench_parse_int(a, items[j], 1, 256);
        } else if (!strcmp(a, "--dim")) {
            const char *v = bench_value(argc, argv, &i);
            o->dim = (int)bench_parse_int(a, v, 64, 128);
            if (o->dim != 64 && o->dim != 128) bench_bad(a, v, "must be 64 or 128");
        } else if (!strcmp(a, "--gdn-keep")) {
            const char *v = bench_value(argc, argv, &i);
            o->gdn_keep = config_enum_index(gdn_keep_names, v);
            if (o->gdn_keep < 0) bench_bad(a, v, "expected none, wy or states");
        } else if (!strcmp(a, "--gdn-tune")) {
            bench_parse_tune(a, bench_value(argc, argv, &i), bench_gdn_tune_names, bench_gdn_tune_max,
                             BENCH_GDN_TUNE_N, o->gdn_tune);
        } else if (!strcmp(a, "--attn-tune")) {
            bench_parse_tune(a, bench_value(argc, argv, &i), bench_attn_tune_names, bench_attn_tune_max,
                             BENCH_ATTN_TUNE_N, o->attn_tune);
        } else if (!strcmp(a, "--profile")) {
            o->profile = (int)bench_parse_int(a, bench_value(argc, argv, &i), 0, 2);
        } else if (!strcmp(a, "--doc-len")) {
            const char *v = bench_value(argc, argv, &i);
            o->attn_docs = 1;
            o->n_doc_len = bench_split(a, v, items);
            for (int j = 0; j < o->n_doc_len; j++) {
                o->doc_len[j] = bench_parse_int(a, items[j], 0, (int64_t)1 << 22);
                if (o->doc_len[j] == 1) bench_bad(a, items[j], "must be 0 (one document) or at least 2");
            }
        } else if (!strcmp(a, "--config")) o->config = bench_value(argc, argv, &i);
        else if (!strcmp(a, "--set")) {
            const char *v = bench_value(argc, argv, &i);
            if (o->n_sets == BENCH_MAX_SETS) bench_bad(a, v, "more than 64 --set options");
            for (int k = 0; bench_fixed_keys[k]; k++) {
                size_t n = strlen(bench_fixed_keys[k]);
                if (!strncmp(v, bench_fixed_keys[k], n) && v[n] == '=')
                    bench_bad(a, v, "bench step fixes this key (one GPU, one sample; --tokens sets the length)");
            }
            if (!strchr(v, '=')) bench_bad(a, v, "expected key.path=value");
            o->sets[o->n_sets++] = v;
        } else if (!strcmp(a, "--tokens")) {
            const char *v = bench_value(argc, argv, &i);
            o->tokens = bench_parse_int(a, v, 128, (int64_t)1 << 22);
            if (o->tokens % 128) bench_bad(a, v, "must be a multiple of 128");
        } else if (!strcmp(a, "--warmup")) o->warmup = (int)bench_parse_int(a, bench_value(argc, argv, &i), 0, 100);
        else if (!strcmp(a, "--reps")) o->reps = (int)bench_parse_int(a, bench_value(argc, argv, &i), 1, 1000);
        else if (!strcmp(a, "--max-s")) o->max_s = bench_parse_double(a, bench_value(argc, argv, &i), 0, 3600);
        else if (!strcmp(a, "--peak-tflops"))
            o->peak_tflops = bench_parse_double(a, bench_value(argc, argv, &i), 1, 1e5);
        else if (!strcmp(a, "--hbm-tbps")) o->hbm_tbps = bench_parse_double(a, bench_value(argc, argv, &i), 0.01, 1e3);
        else if (!strcmp(a, "--peer")) o->peer = 1;
        else if (!strcmp(a, "--write-requests")) o->write_requests = 1;
        else if (!strcmp(a, "--peer-dir")) o->peer_dir = bench_value(argc, argv, &i);
        else if (!strcmp(a, "--python")) o->python = bench_value(argc, argv, &i);
        else if (!strcmp(a, "--peer-timeout"))
            o->peer_timeout = bench_parse_double(a, bench_value(argc, argv, &i), 1, 86400);
        else if (!strcmp(a, "--out")) o->out_dir = bench_value(argc, argv, &i);
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)bench_parse_int(a, bench_value(argc, argv, &i), 0, INT64_MAX);
        else bench_bad(a, NULL, a[0] == '-' ? "unknown option" : "unexpected argument");
    }
}

/* ---- the cases ---------------------------------------------------------------- */

/* Loads --config with --set, then the keys bench fixes; any error: printed, exit 2. */
static void bench_load_config(Config *cfg, const BenchOptions *o) {
    ConfigErrors err = {0};
    config_init_defaults(cfg);
    config_load_file(cfg, o->config, &err);
    int k = 0;
    for (int i = 0; i < o->n_sets; i++) config_apply_set(cfg, o->sets[i], k++, &err);
    char fixed[8][64];
    snprintf(fixed[0], 64, "data.seq_len=%lld", (long long)o->tokens);
    const char *rest[] = {"parallel.dp=1", "parallel.cp=1", "train.grad_accum=1", "data.micro_batch=1",
                          "device.kind=cuda", "slurm.nodes=1", "slurm.gpus_per_node=1"};
    for (int i = 0; i < 7; i++) snprintf(fixed[i + 1], 64, "%s", rest[i]);
    for (int i = 0; i < 8; i++) config_apply_set(cfg, fixed[i], k++, &err);
    if (err.count == 0) config_validate(cfg, &err);
    if (err.count) {
        for (char *line = err.text; line && *line;) {
            char *nl = strchr(line, '\n');
            fprintf(stderr, "ringscan bench: --config %s: error: %.*s\n", o->config,
                    nl ? (int)(nl - line) : (int)strlen(line), line);
            line = nl ? nl + 1 : NULL;
        }
        exit(RS_EXIT_USAGE);
    }
    config_errors_free(&err);
}

static json_t *bench_step_request_case(const Config *cfg, const Plan *p, const BenchOptions *o, int d) {
    const ModelConfig *m = &cfg->model;
    char name[160];
    const char *base = strrchr(o->config, '/');
    base = base ? base + 1 : o->config;
    int len = (int)strlen(base);
    if (len > 5 && !strcmp(base + len - 5, ".yaml")) len -= 5;
    snprintf(name, sizeof name, "%.*s_T%lld", len > 100 ? 100 : len, base, (long long)cfg->data.seq_len);
    json_t *types = json_array();
    for (int l = 0; l < m->num_hidden_layers; l++)
        json_array_append_new(types, json_string(layer_kind_names[config_layer_kind(cfg, l)]));
    json_t *model = json_pack(
        "{sI sI sI sI so sI sI sI sf sf sI sI sI sI sI sf sb ss sf sI}", "vocab_size", (json_int_t)m->vocab_size,
        "hidden_size", (json_int_t)m->hidden_size, "intermediate_size", (json_int_t)m->intermediate_size,
        "num_hidden_layers", (json_int_t)m->num_hidden_layers, "layer_types", types, "num_attention_heads",
        (json_int_t)m->num_attention_heads, "num_key_value_heads", (json_int_t)m->num_key_value_heads, "head_dim",
        (json_int_t)m->head_dim, "partial_rotary_factor", m->partial_rotary_factor, "rope_theta", m->rope_theta,
        "linear_num_key_heads", (json_int_t)m->linear_num_key_heads, "linear_num_value_heads",
        (json_int_t)m->linear_num_value_heads, "linear_key_head_dim", (json_int_t)m->linear_key_head_dim,
        "linear_value_head_dim", (json_int_t)m->linear_value_head_dim, "linear_conv_kernel_dim",
        (json_int_t)m->linear_conv_kernel_dim, "rms_norm_eps", m->rms_norm_eps, "tie_word_embeddings",
        m->tie_word_embeddings, "hidden_act", hidden_act_names[m->hidden_act], "initializer_range",
        m->initializer_range, "max_position_embeddings", (json_int_t)cfg->data.seq_len);
    json_t *train = json_pack("{sf sf sf sf sf sf}", "lr", cfg->train.lr, "weight_decay", cfg->train.weight_decay,
                              "beta1", cfg->train.beta1, "beta2", cfg->train.beta2, "eps", cfg->train.eps,
                              "grad_clip", cfg->train.grad_clip);
    json_t *c = json_pack("{ss sI so so}", "name", name, "T", (json_int_t)cfg->data.seq_len, "model", model, "train",
                          train);
    /* documents (--doc-len): their boundaries, named _docsN as the attn cases; the FLOPs per token with the mask */
    double frac = 1.0;
    if (o->attn_docs) {
        json_t *cu = bench_cu_seqlens(cfg->data.seq_len, o->doc_len[d], o->seed);
        frac = bench_doc_attn_fraction(cu, cfg->data.seq_len);
        char more[200];
        snprintf(more, sizeof more, "%s_docs%zu", name, json_array_size(cu) - 1);
        json_object_set_new(c, "name", json_string(more));
        json_object_set_new(c, "cu_seqlens", cu);
    }
    json_object_set_new(c, "attn_doc_fraction", json_real(frac));
    json_object_set_new(c, "flops_per_token", json_real(p->flops_model - p->flops_attn_causal * (1.0 - frac)));
    return c;
}

/* ---- FLOPs, bytes, floors ------------------------------------------------------- */

static double bench_floor_ms(double flops, double bytes, const BenchDevice *d) {
    double c = flops / (d->peak_tflops * 1e12), b = bytes / (d->hbm_tbps * 1e12);
    return 1e3 * (c > b ? c : b);
}

/* ---- tables ---------------------------------------------------------------------- */

/* One row of the kernel table; `ours` is the ringscan row of the case (NULL for ours). Adds the
 * computed numbers to `row` for bench.json. */
static void bench_kernel_row(FILE *f, const char *cname, const json_t *r, const json_t *ours, const BenchWork *w,
                             const BenchDevice *d, json_t *table) {
    const char *impl = json_string_value(json_object_get(r, "impl"));
    if (bench_error_row(f, table, cname, impl, r, 28, 16)) return;
    double mf = bench_num(r, "ms_fwd"), mfb = bench_num(r, "ms_fwdbwd");
    double floor_fb = bench_floor_ms(w->flops_fb, w->bytes_fb, d);
    double tf = w->flops_fwd / (mf * 1e9), tfb = w->flops_fb / (mfb * 1e9);
    double rf = ours ? mf / bench_num(ours, "ms_fwd") : NAN, rfb = ours ? mfb / bench_num(ours, "ms_fwdbwd") : NAN;
    char s[8][32];
    bench_fmt(s[0], 32, "%.3f", mf);
    bench_fmt(s[1], 32, "%.3f", mfb);
    bench_fmt(s[2], 32, "%.1f", tf);
    bench_fmt(s[3], 32, "%.1f", tfb);
    bench_fmt(s[4], 32, "%.3f", floor_fb);
    bench_fmt(s[5], 32, "%.1f", mfb / floor_fb);
    bench_fmt(s[6], 32, "%.2f", rf);
    bench_fmt(s[7], 32, "%.2f", rfb);
    fprintf(f, "%-28s %-16s %10s %10s %8s %8s %9s %7s %7s %7s\n", cname, impl ? impl : "?", s[0], s[1], s[2], s[3],
            s[4], s[5], s[6], s[7]);
    json_t *row = json_pack("{ss ss sf sf sf sf sf sf}", "case", cname, "impl", impl ? impl : "?", "ms_fwd", mf,
                            "ms_fwdbwd", mfb, "tflops_fwd", tf, "tflops_fwdbwd", tfb, "floor_ms_fwdbwd", floor_fb,
                            "x_floor_fwdbwd", mfb / floor_fb);
    if (ours) {
        json_object_set_new(row, "ratio_fwd", json_real(rf));
        json_object_set_new(row, "ratio_fwdbwd", json_real(rfb));
    }
    json_t *note = json_object_get(r, "note");
    if (note && json_is_string(note)) json_object_set(row, "note", note);
    json_array_append_new(table, row);
}

static void bench_print_kernels(FILE *f, const BenchOptions *o, BenchKind kind, const json_t *req, const json_t *ours,
                                const json_t *peer, const BenchDevice *d, json_t *table) {
    if (kind == BENCH_ATTN)
        fprintf(f, "\nattention: causal, bf16, %s; FLOPs 4*T^2/2*hd*nh forward (causal = half the T x T "
                   "pairs,\n  2 per multiply-add; per document with documents), backward 2.5x forward (fwd+bwd "
                   "3.5x)\n", o->attn_docs ? "documents of --doc-len (cases _docsN)" : "one document");
    else if (kind == BENCH_KDA)
        fprintf(f, "\nKimi Delta Attention chunked delta rule: H key = value heads, bf16 q/k/v, fp32 beta and g (T, H, K) "
                   "(a log decay\n  per key channel: kimi_linear's gate of random f, FLA's layer init of A_log and dt_bias); "
                   "the chunk alone, gates outside;\n  FLOPs per chunk of 64 and head as GDN's (plan; docs/design/kda.md), "
                   "whole chunks per document;\n  ringscan's forward keeps %s for its backward (--gdn-keep %s)\n",
                o->gdn_keep == GDN_KEEP_NONE ? "nothing"
                : o->gdn_keep == GDN_KEEP_WY ? "its WY prep"
                                             : "its WY prep and the chunk states",
                gdn_keep_names[o->gdn_keep]);
    else
        fprintf(f, "\nGated DeltaNet chunked delta rule: H key = value heads, bf16 q/k/v, fp32 gates; FLOPs per chunk "
                   "of 64\n  and head from plan (FLA's kernel split, docs/design/gdn-kernels.md), whole chunks per document;\n"
                   "  ringscan's forward keeps %s for its backward (--gdn-keep %s)\n",
                o->gdn_keep == GDN_KEEP_NONE ? "nothing"
                : o->gdn_keep == GDN_KEEP_WY ? "W, U, the gate cumsum"
                                             : "W, U, the gate cumsum and the chunk states h, vn",
                gdn_keep_names[o->gdn_keep]);
    fprintf(f, "  floor = max(FLOPs / %.0f TFLOP/s, minimum bytes / %.2f TB/s); ratio = peer ms / ringscan ms (> 1: "
               "ringscan faster)\n\n",
            d->peak_tflops, d->hbm_tbps);
    fprintf(f, "%-28s %-16s %10s %10s %8s %8s %9s %7s %7s %7s\n", "case", "impl", "ms fwd", "ms f+b", "TF/s fwd",
            "TF/s f+b", "floor f+b", "x floor", "ratio f", "ratio fb");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(req, "cases"), i, c) {
        const char *cname = json_string_value(json_object_get(c, "name"));
        BenchWork w = bench_work(kind, c);
        const json_t *mine = bench_find(ours, cname, "ringscan");
        if (mine) bench_kernel_row(f, cname, mine, NULL, &w, d, table);
        if (!peer) continue;
        size_t j;
        json_t *r;
        json_array_foreach(json_object_get(peer, "results"), j, r) {
            const char *rc = json_string_value(json_object_get(r, "case"));
            if (rc && !strcmp(rc, cname)) bench_kernel_row(f, cname, r, mine, &w, d, table);
        }
    }
    bench_print_notes(f, peer);
}

static void bench_step_row(FILE *f, const json_t *r, const json_t *ours, double flops_tok, const BenchDevice *d,
                           json_t *table) {
    const char *cname = json_string_value(json_object_get(r, "case")), *impl = json_string_value(json_object_get(r, "impl"));
    if (bench_error_row(f, table, cname, impl, r, 30, 18)) return;
    double ms = bench_num(r, "ms_step"), tok = bench_num(r, "tokens_per_s");
    double mfu = 100.0 * flops_tok * tok / (d->peak_tflops * 1e12);
    double peak = bench_num(r, "peak_alloc_bytes") / (1 << 30), used = bench_num(r, "device_used_bytes") / (1 << 30);
    double ratio = ours ? ms / bench_num(ours, "ms_step") : NAN;
    char s[6][32];
    bench_fmt(s[0], 32, "%.1f", ms);
    bench_fmt(s[1], 32, "%.0f", tok);
    bench_fmt(s[2], 32, "%.1f%%", mfu);
    bench_fmt(s[3], 32, "%.2f", peak);
    bench_fmt(s[4], 32, "%.2f", used);
    bench_fmt(s[5], 32, "%.2f", ratio);
    fprintf(f, "%-30s %-18s %9s %9s %7s %10s %10s %7s\n", cname ? cname : "?", impl ? impl : "?", s[0], s[1], s[2],
            s[3], s[4], s[5]);
    json_t *row = json_pack("{ss ss sf sf sf sf sf}", "case", cname ? cname : "?", "impl", impl ? impl : "?", "ms_step",
                            ms, "tokens_per_s", tok, "mfu_percent", mfu, "peak_alloc_gib", peak, "device_used_gib", used);
    if (ours) json_object_set_new(row, "ratio", json_real(ratio));
    json_array_append_new(table, row);
}

static void bench_print_step(FILE *f, const json_t *req, const json_t *ours, const json_t *peer, const Plan *p,
                             const BenchDevice *d, json_t *table) {
    fprintf(f, "\ntraining step: one sample of random tokens = one document (attention over the whole causal T x T), "
               "or\n  documents packed (cases _docsN: their attention within each document), one GPU, AdamW, grad "
               "clipping;\n  MFU = %.3f GFLOP per token (plan's model FLOPs, attention causal; with documents plan's "
               "attention term x sum(L^2)/T^2) x tokens/s / %.0f TFLOP/s;\n  ratio = peer ms / ringscan ms (> 1: ringscan faster)\n  peak alloc: ringscan = backend's peak of live allocations + its workspaces; peers "
               "= torch.cuda.max_memory_allocated\n  device used: cudaMemGetInfo (context and pools included); peers "
               "= torch.cuda.max_memory_reserved\n\n",
            p->flops_model / 1e9, d->peak_tflops);
    fprintf(f, "%-30s %-18s %9s %9s %7s %10s %10s %7s\n", "case", "impl", "ms/step", "tokens/s", "MFU", "peak GiB",
            "used GiB", "ratio");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(req, "cases"), i, c) {
        const char *cname = json_string_value(json_object_get(c, "name"));
        const json_t *mine = bench_find(ours, cname, "ringscan");
        const double flops_tok = json_real_value(json_object_get(c, "flops_per_token"));
        if (mine) {
            bench_step_row(f, mine, NULL, flops_tok, d, table);
            if (json_object_get(c, "cu_seqlens"))
                fprintf(f, "%-30s %.3f GFLOP per token (%zu documents, attention share of one document's %.4f)\n", "",
                        flops_tok / 1e9, json_array_size(json_object_get(c, "cu_seqlens")) - 1,
                        json_real_value(json_object_get(c, "attn_doc_fraction")));
        }
        if (!peer) continue;
        size_t j;
        json_t *r;
        json_array_foreach(json_object_get(peer, "results"), j, r) {
            const char *rc = json_string_value(json_object_get(r, "case"));
            if (rc && !strcmp(rc, cname)) bench_step_row(f, r, mine, flops_tok, d, table);
        }
    }
    bench_print_notes(f, peer);
}

/* ---- the device ------------------------------------------------------------------ */

static void bench_device(BenchDevice *d, const BenchOptions *o) {
    memset(d, 0, sizeof *d);
#ifdef RS_WITH_CUDA
    char why[512];
    if (cuda_backend_probe(why, sizeof why) == 0) {
        fprintf(stderr, "ringscan bench: device: no usable GPU: %s; bench times GPU kernels and needs one\n", why);
        exit(RS_EXIT_USAGE);
    }
    if (cuda_bench_device(d->name, sizeof d->name, &d->sms, &d->mem_gib) != 0) {
        fprintf(stderr, "ringscan bench: device: cannot read device 0: %s\n", d->name);
        exit(RS_EXIT_USAGE);
    }
#else
    (void)o;
    fprintf(stderr, "ringscan bench: device: this ringscan was built without the cuda backend (nvcc was not found "
                    "at build time; `ringscan version` says what was built); bench needs a GPU\n");
    exit(RS_EXIT_USAGE);
#endif
    /* datasheet figures of the SXM parts (dense bf16, HBM); others must be given */
    int h100 = strstr(d->name, "H100") && !strstr(d->name, "PCIe") && !strstr(d->name, "NVL");
    int h200 = strstr(d->name, "H200") != NULL;
    d->peak_tflops = o->peak_tflops > 0 ? o->peak_tflops : (h100 || h200) ? 989.0 : 0;
    d->hbm_tbps = o->hbm_tbps > 0 ? o->hbm_tbps : h200 ? 4.8 : h100 ? 3.35 : 0;
    d->peak_source = o->peak_tflops > 0 ? "--peak-tflops" : "datasheet, dense bf16";
    d->hbm_source = o->hbm_tbps > 0 ? "--hbm-tbps" : "datasheet";
    if (d->peak_tflops <= 0 || d->hbm_tbps <= 0) {
        fprintf(stderr, "ringscan bench: device: %s is not in bench's table of peaks; give --peak-tflops and "
                        "--hbm-tbps\n", d->name);
        exit(RS_EXIT_USAGE);
    }
}

/* ---- main ------------------------------------------------------------------------- */

int bench_main(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(bench_usage, stdout);
            return RS_EXIT_OK;
        }
    BenchOptions o;
    bench_parse(&o, argc, argv);
    if (o.cp) return bench_cp_main(&o);
    Config cfg;
    Plan plan;
    int have_cfg = o.kinds[BENCH_STEP];
    if (have_cfg) {
        bench_load_config(&cfg, &o);
        plan_build(&plan, &cfg);
    }
    BenchDevice dev;
    if (!o.write_requests) bench_device(&dev, &o);
#ifdef RS_WITH_CUDA
    char missing[512];
    if (o.kinds[BENCH_KDA] && !o.write_requests && bench_kda_missing(&backend_cuda, NULL, missing, sizeof missing)) {
        fprintf(stderr, "ringscan bench: kda: this ringscan's cuda backend lacks the Kimi Delta Attention entries bench "
                        "kda calls (NULL in backend_cuda: %s; kernels/cuda/kda/ registers them)\n",
                missing);
        exit(RS_EXIT_USAGE);
    }
#endif
    if (fsio_mkdirs(o.out_dir) != 0) {
        fprintf(stderr, "ringscan bench: --out %s: cannot create: %s\n", o.out_dir, strerror(errno));
        return RS_EXIT_USAGE;
    }

    json_t *req[BENCH_KIND_COUNT] = {0}, *peer[BENCH_KIND_COUNT] = {0}, *ours[BENCH_KIND_COUNT] = {0};
    for (int k = 0; k < BENCH_KIND_COUNT; k++) {
        if (!o.kinds[k]) continue;
        req[k] = bench_request(&o, bench_kind_names[k]);
        json_t *cases = json_object_get(req[k], "cases");
        if (k == BENCH_ATTN) bench_attn_cases(&o, cases);
        else if (k == BENCH_GDN || k == BENCH_KDA) bench_gdn_cases(&o, cases);
        else
            for (int d = 0; d < (o.attn_docs ? o.n_doc_len : 1); d++)
                json_array_append_new(cases, bench_step_request_case(&cfg, &plan, &o, d));
        ours[k] = json_array();
    }
    if (o.write_requests) {
        for (int k = 0; k < BENCH_KIND_COUNT; k++) {
            if (!o.kinds[k]) continue;
            char path[4200];
            snprintf(path, sizeof path, "%s/request_%s.json", o.out_dir, bench_kind_names[k]);
            bench_write_json(req[k], path);
            printf("wrote %s (%zu cases)\n", path, json_array_size(json_object_get(req[k], "cases")));
            json_decref(req[k]);
            json_decref(ours[k]);
        }
        if (have_cfg) {
            plan_free(&plan);
            config_free(&cfg);
        }
        return RS_EXIT_OK;
    }
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    printf("ringscan bench | %s | %s, %d SMs, %.1f GiB | peak %.0f TFLOP/s (%s), %.2f TB/s (%s) | commit %s\n", date,
           dev.name, dev.sms, dev.mem_gib, dev.peak_tflops, dev.peak_source, dev.hbm_tbps, dev.hbm_source, build_info_git_sha());
    printf("timing: CUDA events on the compute stream, %d warm-up run(s), median of up to %d runs (at least 3 once "
           "%.0f s are spent)\n", o.warmup, o.reps, o.max_s);
    fflush(stdout);

    int failed = 0;
    if (o.peer)
        for (int k = 0; k < BENCH_KIND_COUNT; k++) {
            if (!o.kinds[k]) continue;
            static const char *const scripts[BENCH_KIND_COUNT] = {"attn_sdpa.py", "gdn_fla.py", "step_hf.py",
                                                                  "kda_fla.py"};
            printf("peer %s: %s/%s ...\n", bench_kind_names[k], o.peer_dir, scripts[k]);
            fflush(stdout);
            double t0 = bench_clock();
            peer[k] = bench_peer_run(&o, bench_kind_names[k], scripts[k], 0, req[k]);
            printf("peer %s: %.1f s\n", bench_kind_names[k], bench_clock() - t0);
            if (json_object_get(peer[k], "error")) {
                failed = 1;
                printf("peer %s failed: %s\n", bench_kind_names[k],
                       json_string_value(json_object_get(peer[k], "error")));
            }
        }

#ifdef RS_WITH_CUDA
    cuda_backend_init(0);
    cuda_profile_enable(o.profile > 0); /* the step's entries (bench_step.c) */
    const CudaGdnTune gt = {o.gdn_tune[0], o.gdn_tune[1], o.gdn_tune[2], o.gdn_tune[3], o.gdn_tune[4],
                            o.gdn_tune[5], o.gdn_tune[6], o.gdn_tune[7], o.gdn_tune[8], o.gdn_tune[9],
                            o.gdn_tune[10]};
    cuda_gdn_tune_set(&gt);
    bench_attn_tune_apply(&o);
    static const int order[BENCH_KIND_COUNT] = {BENCH_STEP, BENCH_ATTN, BENCH_GDN, BENCH_KDA};
    for (int oi = 0; oi < BENCH_KIND_COUNT; oi++) {
        int k = order[oi];
        if (!o.kinds[k]) continue;
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(req[k], "cases"), i, c) {
            printf("ringscan %s %s ...", bench_kind_names[k], json_string_value(json_object_get(c, "name")));
            fflush(stdout);
            double t0 = bench_clock();
            /* the step at --profile 2: every GDN / KDA call's kernels too (level 1: no cycle counts) */
            cuda_gdn_profile(k == BENCH_GDN || k == BENCH_KDA ? o.profile : k == BENCH_STEP && o.profile > 1);
            json_t *r = k == BENCH_ATTN ? bench_attn_case(c, &o)
                      : k == BENCH_GDN  ? bench_gdn_case(c, &o)
                      : k == BENCH_KDA  ? bench_kda_case(c, &o)
                                        : bench_step_case(c, &cfg, &o);
            printf(" %.1f s\n", bench_clock() - t0);
            json_array_append_new(ours[k], r);
        }
    }
#endif

    json_t *all = json_pack("{ss ss ss si sf sf}", "schema", "ringscan-bench/1", "date", date, "commit", build_info_git_sha(),
                            "sms", dev.sms, "peak_tflops", dev.peak_tflops, "hbm_tbps", dev.hbm_tbps);
    json_object_set_new(all, "device", json_string(dev.name));
    for (int k = 0; k < BENCH_KIND_COUNT; k++) {
        if (!o.kinds[k]) continue;
        json_t *table = json_array();
        if (k == BENCH_STEP) bench_print_step(stdout, req[k], ours[k], peer[k], &plan, &dev, table);
        else bench_print_kernels(stdout, &o, (BenchKind)k, req[k], ours[k], peer[k], &dev, table);
        json_t *part = json_pack("{sO sO so}", "request", req[k], "ringscan", ours[k], "table", table);
        if (peer[k]) json_object_set(part, "peer", peer[k]);
        if (k == BENCH_ATTN)
            json_object_set_new(part, "attn_tune",
                                bench_tune_json(bench_attn_tune_names, o.attn_tune, BENCH_ATTN_TUNE_N));
        if (k == BENCH_KDA) json_object_set_new(part, "gdn_keep", json_string(gdn_keep_names[o.gdn_keep]));
        if (k == BENCH_GDN) {
            json_object_set_new(part, "gdn_keep", json_string(gdn_keep_names[o.gdn_keep]));
            json_object_set_new(part, "gdn_tune", bench_tune_json(bench_gdn_tune_names, o.gdn_tune, BENCH_GDN_TUNE_N));
        }
        json_object_set_new(all, bench_kind_names[k], part);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/bench.json", o.out_dir);
    bench_write_json(all, path);
    printf("\nresults: %s\n", path);
    json_decref(all);
    for (int k = 0; k < BENCH_KIND_COUNT; k++) {
        json_decref(req[k]);
        json_decref(peer[k]);
        json_decref(ours[k]);
    }
    if (have_cfg) {
        plan_free(&plan);
        config_free(&cfg);
    }
    if (failed) fprintf(stderr, "ringscan bench: a peer failed (its rows say why); exit 1\n");
    return failed ? RS_EXIT_FAIL : RS_EXIT_OK;
}
