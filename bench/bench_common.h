/*
 * bench_common.h — the bench tool's shared types and helpers. `ringscan bench
 * attn|gdn|kda|step|all`: our kernels and our training
 * step timed on the GPU, optionally beside the peers of bench/peer (PyTorch
 * SDPA, flash-linear-attention, transformers) run on the same GPU in the same
 * call, printed as one table with the ratios; `ringscan bench cp` under
 * mpirun: context parallelism over P GPUs, beside torch's and FLA's CP.
 *
 * The code lives in bench/, a tool beside cmd/ above lib/ and kernels/: it
 * drives the Backend table and the model exactly as lib/run/train.c does, and it
 * also times the cuda kernels directly (kernels/cuda/cuda_bench.h, the tune and
 * profile switches), which lib/ never includes.
 * Files, one topic each:
 *   bench.c       options (strict: a bad value names the option, exit 2), the
 *                 order of the work, the floors, the tables, bench.json (bench.h)
 *   bench_common.c  the request and its cases, FLOPs and bytes, table helpers
 *   bench_ops.c   attention, Gated DeltaNet and KDA kernels: random inputs, CUDA
 *                 events, warm-up then the median of the repetitions
 *   bench_step.c  one training step of a config on one GPU: tokens/s, MFU,
 *                 peak memory
 *   bench_cp.c    `bench cp` (bench_cp.h): ring attention, the GDN and KDA layers through lib/cp*.c
 *                 on P ranks, their one-GPU time, the serial schedule, per step
 *                 compute and communication, the CP peers; its own table
 *   bench_peer.c  the request file, running a peer script under a time limit
 *                 (under torchrun for the CP peers), reading its result file
 *                 (bench/peer/README.md: the contract)
 *
 * Every side, ours and each peer, reports the same JSON shape (a "result"
 * object: bench/peer/README.md); bench.c computes FLOPs, floors and ratios
 * from the case definitions, never from what a peer says.
 *
 * Callers: every file of bench/.
 */
#ifndef RS_BENCH_COMMON_H
#define RS_BENCH_COMMON_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdnoreturn.h>

#include "config/config.h"

#define BENCH_MAX_LIST 16
#define BENCH_MAX_SETS 64
#define BENCH_GDN_TUNE_N 11 /* the fields of kernels/cuda/cuda_gdn_tune.h's CudaGdnTune */
#define BENCH_ATTN_TUNE_N 2 /* the fields of kernels/cuda/cuda_attention_tune.h's CudaAttnTune */

typedef enum { BENCH_ATTN, BENCH_GDN, BENCH_STEP, BENCH_KDA, BENCH_KIND_COUNT } BenchKind;
extern const char *const bench_kind_names[BENCH_KIND_COUNT];
extern const char *const bench_gdn_tune_names[BENCH_GDN_TUNE_N];
extern const char *const bench_attn_tune_names[BENCH_ATTN_TUNE_N];

enum { BENCH_CP_ATTN = 1, BENCH_CP_GDN = 2, BENCH_CP_KDA = 4 };

typedef struct {
    int     kinds[BENCH_KIND_COUNT];        /* which benchmarks run (all: every one) */
    int     cp;                             /* `bench cp` (then no kind is set) */
    int     cp_parts;                       /* cp: BENCH_CP_ATTN | BENCH_CP_GDN | BENCH_CP_KDA */
    int     cp_cpu;                         /* cp: the cpu backend (--device cpu) */
    int64_t gdn_T[BENCH_MAX_LIST];          /* cp: the GDN and KDA layers' sequence lengths */
    int     n_gdn_T;
    int64_t T[BENCH_MAX_LIST];              /* attn, gdn: sequence lengths; cp: the ring's */
    int     nT;
    int     attn[BENCH_MAX_LIST][3];        /* attn: nh, nkv, hd */
    int     n_attn;
    int     heads[BENCH_MAX_LIST];          /* gdn, kda: H (key heads = value heads) */
    int     n_heads;
    int     dim;                            /* gdn, kda: K = V */
    int     gdn_keep;                       /* gdn, kda: GdnKeep, what the forward keeps (checkpoint.gdn_keep) */
    int     attn_tune[BENCH_ATTN_TUNE_N];   /* attn, cp: --attn-tune, the fields of CudaAttnTune in
                                               bench_attn_tune_names' order (0: the built-in choice) */
    int     gdn_tune[BENCH_GDN_TUNE_N];     /* gdn: --gdn-tune, the fields of CudaGdnTune in bench_gdn_tune_names'
                                               order (0: the built-in choice) */
    int     profile;                        /* --profile: 0 off; 1 step: every Backend entry timed, gdn: every
                                               kernel of each entry timed; 2: gdn also the cycles per phase */
    int64_t doc_len[BENCH_MAX_LIST];        /* gdn, kda, attn, step: mean document length; 0 = one document */
    int     n_doc_len;
    int     attn_docs;                      /* attn, step: --doc-len given (else one document per case) */
    const char *config;                     /* step */
    const char *sets[BENCH_MAX_SETS];
    int     n_sets;
    int64_t tokens;                         /* step: tokens per sample (= per step, one GPU) */
    int     warmup, reps;
    double  max_s;
    double  peak_tflops, hbm_tbps;          /* 0: from the device's name */
    int     peer;
    int     write_requests;                 /* only write the request files (no GPU needed) */
    const char *peer_dir, *python, *out_dir;
    double  peer_timeout;
    uint64_t seed;
    int     attn_impl;                      /* attn: AttnKernel (--attn-impl; issue 19) */
    const char *cudnn_lib;                  /* attn: --cudnn-lib, path of libcudnn.so.9 ("" search) */
    int     gdn_chain_staged;               /* cp: parallel.gdn_chain_staged (--gdn-chain) */
    int     gdn_cp;                         /* cp: the GDN core's CpGdnMethod at P > 1 (--gdn-cp), -1: cp_gdn_method's */
    int     ring_calls;                     /* cp: RingCalls, as parallel.ring_calls (--ring-calls) */
    int     ring_keep_kv;                   /* cp: parallel.ring_keep_kv (--ring-kv kept | passed) */
} BenchOptions;

/* What a measurement needs from the machine (filled by bench.c before any case runs). */
typedef struct {
    char   name[256];
    int    sms;
    double mem_gib;
    double peak_tflops; /* dense bf16, for MFU and the compute floors */
    double hbm_tbps;    /* for the byte floors */
    const char *peak_source, *hbm_source;
} BenchDevice;

/* ---- bench_common.c: shared by bench.c and bench_cp.c ---- */
/* {names[f]: vals[f]}: --gdn-tune / --attn-tune as set (0: the built-in choice) */
json_t *bench_tune_json(const char *const *names, const int *vals, int n);
#ifdef RS_WITH_CUDA
/* --attn-tune into our attention backward (kernels/cuda/cuda_attention_tune.h) */
void bench_attn_tune_apply(const BenchOptions *o);
#endif
/* {"schema", "kind", "warmup", "reps", "max_s", "seed", "cases": []} */
json_t *bench_request(const BenchOptions *o, const char *kind);
/* appends the attention cases (o->T x o->attn) / the GDN cases (o->T x o->heads x o->doc_len; KDA's are the
 * same cases) */
void    bench_attn_cases(const BenchOptions *o, json_t *cases);
void    bench_gdn_cases(const BenchOptions *o, json_t *cases);
/* Document boundaries [0, ..., T] of a sample of T tokens with mean length L (0: one document): lengths
 * drawn uniformly in [L/2, 3L/2), the last document takes what is left; the same for a seed everywhere
 * (attn, gdn, step cases and the peers). */
json_t *bench_cu_seqlens(int64_t T, int64_t L, uint64_t seed);
/* doc_pos (T) of a case's cu_seqlens (absent: one document of T) */
void    bench_case_doc_pos(int32_t *doc_pos, const json_t *c, int64_t T);
/* the share of causal attention's work a document mask leaves: sum(L^2) / T^2 over cu_seqlens (NULL: 1) */
double  bench_doc_attn_fraction(const json_t *cu, int64_t T);
typedef struct {
    double flops_fwd, flops_fb, bytes_fwd, bytes_fb;
} BenchWork;
/* FLOPs and minimum bytes of a case of kind BENCH_ATTN, BENCH_GDN or BENCH_KDA (bench.c's conventions) */
BenchWork bench_work(BenchKind kind, const json_t *c);
struct Backend;
struct BackendSizes;
/* The Kimi Delta Attention entries `bench kda` calls (backend.h: kda_gates_forward, which draws g, kda_chunk_forward,
 * kda_chunk_backward, kda_kept_bytes), and with sz (`bench cp --parts kda`) also the CP schedules' (the other
 * kda_chunk_* entries, kda_dkept_bytes) and sz's kda_kept_bytes and kda_dkept_bytes: the number that are NULL,
 * their names in `why` ("kda_chunk_forward, ...") */
int     bench_kda_missing(const struct Backend *be, const struct BackendSizes *sz, char *why, size_t n);
/* KDA's gate parameters as every side draws them (bench/peer/README.md), host fp32: A_log (nv) = log U[1, 16);
 * dt_bias (nv*dk) = log(expm1(dt)), the inverse softplus of dt = exp(U[log 0.001, log 0.1)) */
void    bench_kda_gate_params(float *A_log, float *dt_bias, int nv, int dk, uint64_t seed);
double  bench_num(const json_t *r, const char *key);     /* NAN when absent */
/* the first row of `results` with this case and impl (impl NULL: any) */
const json_t *bench_find(const json_t *results, const char *cname, const char *impl);
void    bench_fmt(char *buf, size_t n, const char *fmt, double v); /* "-" when not finite */
/* a row carrying "error": printed and appended to `table` as such; 1 when it was one */
int     bench_error_row(FILE *f, json_t *table, const char *cname, const char *impl, const json_t *r, int wcase,
                        int wimpl);
void    bench_print_notes(FILE *f, const json_t *peer);
double  bench_clock(void);                               /* CLOCK_MONOTONIC seconds */

/* bench_ops.c: one case of the request (bench/peer/README.md) on our kernels; returns a result row
 * {"case", "impl": "ringscan", "ms_fwd", "ms_fwdbwd", "reps"}. */
json_t *bench_attn_case(const json_t *c, const BenchOptions *o);
json_t *bench_gdn_case(const json_t *c, const BenchOptions *o);
json_t *bench_kda_case(const json_t *c, const BenchOptions *o);
#ifdef RS_WITH_CUDA
/* bench_ops.c: base, or for impl (AttnKernel) cudnn | cudnn_det base with its attention entries routing each call
 * to cuDNN or ours (kernels/cuda/cuda_attention_cudnn.h; cuDNN loaded from lib, "" = search, on the first call;
 * exit 2 when it cannot load). bench attn (--attn-impl), bench cp's ring (--attn-impl), bench step
 * (device.attention_kernel). */
const struct Backend *bench_attn_backend(const struct Backend *base, int impl, const char *lib);
#endif

/* bench_step.c: the training step of `cfg` (already validated, cp = dp = 1, device cuda) on the case's
 * documents (cu_seqlens; absent: one); returns
 * {"case", "impl": "ringscan", "ms_step", "tokens_per_s", "peak_alloc_bytes", "device_used_bytes",
 * "reps", "loss"}. */
json_t *bench_step_case(const json_t *c, const Config *cfg, const BenchOptions *o);

/* bench_peer.c: writes `request` to OUT/request_NAME.json, runs PYTHON PEER_DIR/SCRIPT --request
 * ... --out OUT/peer_NAME.json under peer_timeout (its output to OUT/peer_NAME.log) and returns
 * the parsed result object; on any failure a result object with "error" saying what happened.
 * nproc > 0: under PYTHON -m torch.distributed.run --standalone --nproc_per_node NPROC. */
json_t *bench_peer_run(const BenchOptions *o, const char *name, const char *script, int nproc,
                       const json_t *request);
/* writes `j` to `path` (pretty JSON); exits 1 naming the path when it cannot */
void    bench_write_json(const json_t *j, const char *path);

#endif
