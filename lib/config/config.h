/*
 * config.h — the typed configuration of a ringscan run.
 *
 * A run is described by one YAML file (libyaml) plus `--set key.path=value`
 * overrides. The C structs below hold the result; the schema table in
 * config_schema.c (one row per key: path, type, default, range or enum, unit,
 * one-line doc, owning module) is the single source that drives parsing,
 * validation, `--help`, `ringscan config dump`, `ringscan config docs` and
 * the resolved-config table printed at start. Adding a key means adding a
 * struct field here and one row there; a compile-time check ties the two.
 *
 * Loading never exits: every problem is appended to a ConfigErrors list with
 * the place it came from (`file:line:col`, `--set ...`, or the two keys of a
 * cross-key rule), so the command line can print them all and exit 2, and the
 * fuzzer can drive the loader.
 *
 * Callers: cmd/ringscan.c (every subcommand that takes a config),
 * lib/plan/plan.c, the trainer; tests/fuzz/fuzz_config.c.
 */
#ifndef RS_CONFIG_H
#define RS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define CONFIG_LIST_MAX 1024 /* longest list value (model.layer_types) */
#define CONFIG_STR_MAX  4096 /* longest string value, bytes */
#define CONFIG_VALUE_MAX (4 * CONFIG_STR_MAX + 8) /* a value as YAML text (config_format_value), at most */

/* ---- enums, each with its names table (index = value) ------------------- */

typedef enum { DEVICE_KIND_CPU, DEVICE_KIND_CUDA, DEVICE_KIND_COUNT } DeviceKind;
/* device.attention_kernel: the block attention of the cuda backend (issue 19; cuda_attention_cudnn.h); auto:
 * cudnn where cuDNN loads, ringscan where it does not (kernels/cuda/runtime_cuda.c backend_attention_resolve) */
typedef enum {
    ATTN_KERNEL_RINGSCAN, ATTN_KERNEL_CUDNN, ATTN_KERNEL_CUDNN_DET, ATTN_KERNEL_AUTO, ATTN_KERNEL_COUNT
} AttnKernel;
typedef enum { ACT_POLICY_NONE, ACT_POLICY_FULL, ACT_POLICY_REMAT, ACT_POLICY_COUNT } ActPolicy;
typedef enum { LR_SCHEDULE_COSINE, LR_SCHEDULE_WSD, LR_SCHEDULE_CONSTANT, LR_SCHEDULE_COUNT } LrSchedule;
typedef enum { DATA_FORMAT_FLAT, DATA_FORMAT_MEGATRON, DATA_FORMAT_COUNT } DataFormat;
typedef enum { LAYER_KIND_LINEAR, LAYER_KIND_FULL, LAYER_KIND_COUNT } LayerKind;
typedef enum { HIDDEN_ACT_SILU, HIDDEN_ACT_COUNT } HiddenAct;
/* model.linear_attention: the mixer of every linear_attention layer (docs/design/kda.md for kda) */
typedef enum { LINEAR_ATTN_GDN, LINEAR_ATTN_KDA, LINEAR_ATTN_COUNT } LinearAttn;
typedef enum { SLURM_LAUNCHER_SRUN, SLURM_LAUNCHER_MPIRUN, SLURM_LAUNCHER_COUNT } SlurmLauncher;
typedef enum { GDN_KEEP_NONE, GDN_KEEP_WY, GDN_KEEP_STATES, GDN_KEEP_COUNT } GdnKeep;
typedef enum { OFFLOAD_NONE, OFFLOAD_HOST, OFFLOAD_COUNT } Offload;
/* checkpoint.input_rows: what a recomputed layer's input side (ln1, the in_proj output) holds from its recompute to
 * its backward; auto: plan_resolve (lib/plan) picks chunk or whole */
typedef enum { INPUT_ROWS_AUTO, INPUT_ROWS_CHUNK, INPUT_ROWS_WHOLE, INPUT_ROWS_COUNT } InputRows;
/* checkpoint.mlp_act: whether a layer that keeps its activations (none, keep_layers) keeps the MLP's act too, or its
 * backward writes act again from gate_up (lib/model/model_block.c); auto: plan_resolve picks */
typedef enum { MLP_ACT_AUTO, MLP_ACT_KEPT, MLP_ACT_REWRITTEN, MLP_ACT_COUNT } MlpAct;
/* parallel.shard: which training state is cut over the world's ranks (docs/design/sharding.md) */
typedef enum { SHARD_NONE, SHARD_OPTIMIZER, SHARD_GRADIENTS, SHARD_WEIGHTS, SHARD_COUNT } Shard;
/* parallel.ring_calls: how lib/cp/cp_ring.c calls a ring step's attention (its header says why) */
typedef enum {
    RING_CALLS_AUTO,  /* one call over the step's bounding box where the backend runs it fast (Backend
                         attention_fast) or runs less than half of the rule's calls' work fast; else the rule's */
    RING_CALLS_PAIRS, /* the zigzag rule's diagonals and trimmed rectangles, one call each */
    RING_CALLS_STEPS, /* one call over the bounding box, whatever the backend runs fast */
    RING_CALLS_COUNT
} RingCalls;

extern const char *const device_kind_names[DEVICE_KIND_COUNT + 1];
extern const char *const attn_kernel_names[ATTN_KERNEL_COUNT + 1];
extern const char *const act_policy_names[ACT_POLICY_COUNT + 1];
extern const char *const gdn_keep_names[GDN_KEEP_COUNT + 1];
extern const char *const offload_names[OFFLOAD_COUNT + 1];
extern const char *const input_rows_names[INPUT_ROWS_COUNT + 1];
extern const char *const mlp_act_names[MLP_ACT_COUNT + 1];
extern const char *const shard_names[SHARD_COUNT + 1];
extern const char *const ring_calls_names[RING_CALLS_COUNT + 1];

/* the index of s in a NULL-terminated name table (the *_names above), -1 if it is not there */
int config_enum_index(const char *const *names, const char *s);
extern const char *const lr_schedule_names[LR_SCHEDULE_COUNT + 1];
extern const char *const data_format_names[DATA_FORMAT_COUNT + 1];
extern const char *const layer_kind_names[LAYER_KIND_COUNT + 1];
extern const char *const hidden_act_names[HIDDEN_ACT_COUNT + 1];
extern const char *const linear_attention_names[LINEAR_ATTN_COUNT + 1];
extern const char *const slurm_launcher_names[SLURM_LAUNCHER_COUNT + 1];

/* A list of enum values (e.g. model.layer_types); n == 0 means "not given". */
typedef struct {
    int32_t n;
    uint8_t v[CONFIG_LIST_MAX];
} ConfigEnumList;

/* ---- sections ----------------------------------------------------------- */

typedef struct {
    char   *name;            /* job name, also the Slurm job name by default */
    char   *out_dir;         /* run directory: config, logs, metrics, checkpoints */
    int64_t seed;            /* one seed for init, data shuffle and dropout-free RNG */
    int64_t stop_after_step; /* 0: run to train.steps; N: checkpoint after step N and stop */
    int64_t log_every;       /* steps between log lines */
} RunConfig;

/* Hugging Face Qwen3NextConfig names (docs/design/model.md). */
typedef struct {
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;
    int64_t head_dim;
    int64_t linear_num_key_heads;
    int64_t linear_num_value_heads;
    int64_t linear_key_head_dim;
    int64_t linear_value_head_dim;
    int64_t linear_conv_kernel_dim;
    int32_t linear_attention; /* LinearAttn: Gated DeltaNet or Kimi Delta Attention in every linear layer */
    int64_t full_attention_interval;
    ConfigEnumList layer_types; /* LayerKind per layer; empty: derived from the interval */
    int64_t max_position_embeddings; /* 0: data.seq_len */
    double  rms_norm_eps;
    double  rope_theta;
    double  partial_rotary_factor;
    double  initializer_range;
    bool    tie_word_embeddings;
    bool    attention_bias;
    int32_t hidden_act; /* HiddenAct */
    char   *init_from;  /* "" or a Hugging Face folder / ringscan run or checkpoint directory (lib/io/hf.h) */
} ModelConfig;

typedef struct {
    int32_t format;      /* DataFormat */
    char   *path;        /* flat token file, or Megatron prefix (PATH.bin + PATH.idx) */
    int64_t seq_len;     /* tokens per sample (the whole context, before CP) */
    int64_t micro_batch; /* samples per data-parallel rank per micro-step */
    bool    shuffle;
    bool    accept_changed; /* resume, given with --set only: accept data whose fingerprint differs */
} DataConfig;

typedef struct {
    int64_t dp; /* data-parallel replicas */
    int64_t cp; /* context-parallel ranks per replica */
    bool    gdn_chain_staged; /* cp 2: the GDN chain's state passes apart from the outputs / gradients (cp_gdn.c) */
    int32_t ring_calls;   /* RingCalls */
    bool    ring_keep_kv; /* cp 2: the ring forward keeps the other rank's K|V for the backward (cp_ring.c) */
    bool    overlap_comm; /* false: every non-blocking transfer is waited at once (Comm.serial) */
    double  comm_timeout_s; /* a wait for other ranks longer than this ends the run (comm_watchdog.c); 0: off */
    double  startup_timeout_s; /* MPI_Init and the set-up longer than this end the run (comm_startup.c); 0: off */
    int32_t shard;        /* Shard: what is sharded over the world (lib/model/model_shard.c) */
} ParallelConfig;

typedef struct {
    int64_t steps;
    int64_t grad_accum;
    double  lr;
    double  min_lr;
    int64_t warmup_steps;
    int32_t schedule;    /* LrSchedule */
    int64_t decay_steps; /* wsd: length of the final decay */
    double  weight_decay;
    double  beta1, beta2, eps;
    double  grad_clip;   /* 0: no clipping */
    bool    decay_embeddings;
    bool    decay_norms;       /* zero-centred norms: decay toward scale 1 */
    bool    decay_norm_scales; /* plain-scale norms (linear_attn.norm): decay toward scale 0 */
    bool    decay_gdn_gates;
    bool    decay_conv;
} TrainConfig;

typedef struct {
    int32_t activations; /* ActPolicy */
    int32_t gdn_keep;    /* GdnKeep: what the delta rule's forward keeps for its backward */
    int64_t chunk_rows;  /* rows per chunk of a layer's per-token work; 0: model_acts.c chooses */
    int32_t offload;     /* Offload: where the kept activations wait for the backward */
    int64_t keep_layers; /* under full / remat: the last keep_layers layers keep their activations as under none;
                          * CONFIG_AUTO: plan's rule (plan_resolve) */
    int32_t input_rows;  /* InputRows: under full / remat, the recompute's ln1 and in_proj output, one chunk or
                          * every row; INPUT_ROWS_AUTO: plan's rule (plan_resolve) */
    int32_t mlp_act;     /* MlpAct: a kept layer's MLP act kept, or written again by its backward; MLP_ACT_AUTO:
                          * plan's rule (plan_resolve) */
    int64_t every;       /* steps between checkpoints; 0: only at the end and on stop */
    int64_t keep;        /* newest checkpoints kept */
} CheckpointConfig;

typedef struct {
    char   *partition;
    char   *account;
    char   *qos;
    int64_t nodes;
    int64_t gpus_per_node; /* tasks per node (GPUs, or cpu ranks) */
    char   *time;          /* [D-]HH:MM:SS or MM */
    int64_t signal_s;      /* seconds of warning before the time limit; 0: none */
    int64_t max_restarts;  /* requeues after exit 75 (SLURM_RESTART_COUNT bound) */
    int32_t launcher;      /* SlurmLauncher: how the job script starts the ranks */
    char   *srun_mpi;      /* srun --mpi=<plugin> */
    char   *site_env;      /* file the job script sources (NCCL/UCX settings); "" none */
} SlurmConfig;

typedef struct {
    int32_t kind;        /* DeviceKind */
    double  memory_gib;  /* usable memory per GPU (per rank on cpu) */
    double  host_memory_gib; /* usable host memory per node; 0: plan reads the node it runs on */
    double  peak_tflops; /* dense bf16 peak for MFU; 0: look the device up */
    int64_t threads;     /* cpu backend: BLAS threads per rank */
    bool    profile;     /* cuda: every Backend entry timed, the table printed at exit */
    int32_t attention_kernel; /* AttnKernel: ours, or cuDNN where it can take the call */
    char   *cudnn_library;    /* path of libcudnn.so.9 for attention_kernel cudnn*; "" search */
} DeviceConfig;

/* For tests only: one rank stops answering at a given point (comm_watchdog.c). */
typedef struct {
    int64_t stall_rank;  /* the world rank that stalls; -1: none */
    int64_t stall_step;  /* at this step ... */
    int64_t stall_layer; /* ... at this layer's first communication */
} DebugConfig;

/* Where a value came from, for messages and the resolved table. */
typedef enum { CONFIG_ORIGIN_DEFAULT, CONFIG_ORIGIN_FILE, CONFIG_ORIGIN_SET } ConfigOrigin;
typedef struct {
    uint8_t origin; /* ConfigOrigin */
    int32_t line, col;  /* 1-based, for CONFIG_ORIGIN_FILE */
    int32_t set_index;  /* which --set, for CONFIG_ORIGIN_SET */
} ConfigSource;

#define CONFIG_MAX_KEYS 128

typedef struct Config {
    RunConfig        run;
    ModelConfig      model;
    DataConfig       data;
    ParallelConfig   parallel;
    TrainConfig      train;
    CheckpointConfig checkpoint;
    SlurmConfig      slurm;
    DeviceConfig     device;
    DebugConfig      debug;
    /* provenance */
    char        *file;                 /* the YAML file, or NULL */
    ConfigSource source[CONFIG_MAX_KEYS]; /* indexed like the schema table */
} Config;

/* ---- the schema table (config_schema.c) --------------------------------- */

/* An INT key whose schema row names the word "auto" (INTA) stores it as CONFIG_AUTO. */
#define CONFIG_AUTO (-1)

typedef enum {
    CONFIG_TYPE_INT,
    CONFIG_TYPE_FLOAT,
    CONFIG_TYPE_BOOL,
    CONFIG_TYPE_STR,
    CONFIG_TYPE_ENUM,
    CONFIG_TYPE_ENUM_LIST,
} ConfigType;

/* Which characters a string value may hold. Values that reach shell scripts
 * (Slurm) use the strict sets; nothing is ever quoted "just in case". */
typedef enum {
    CONFIG_CHARSET_ANY,   /* any printable UTF-8, no control characters */
    CONFIG_CHARSET_NAME,  /* [A-Za-z0-9_.-] */
    CONFIG_CHARSET_NAMES, /* [A-Za-z0-9_.-] and ',' (Slurm partition lists) */
    CONFIG_CHARSET_PATH,  /* [A-Za-z0-9_.,/+=@:-] (no spaces, quotes, $, ;, ...) */
    CONFIG_CHARSET_TIME,  /* Slurm time: [D-]HH:MM:SS, HH:MM:SS, MM:SS or MM */
} ConfigCharset;

typedef struct {
    const char *path;      /* "model.hidden_size" */
    ConfigType  type;
    size_t      offset;    /* offsetof(Config, model.hidden_size) */
    const char *def;       /* default, as YAML text ("2048", "cosine", "[]") */
    double      min, max;  /* inclusive range for INT and FLOAT */
    const char *const *names; /* ENUM / ENUM_LIST value names */
    ConfigCharset charset; /* STR */
    const char *unit;      /* "tokens", "steps", "GiB", "" */
    const char *module;    /* owning module: "model", "data", "cp", ... */
    const char *doc;       /* one line */
} ConfigKey;

extern const ConfigKey config_schema[];
extern const int       config_schema_count;
extern const char *const config_sections[]; /* NULL-terminated, in file order */
extern const char *const config_section_docs[];

int config_find_key(const char *path); /* schema index or -1 */

/* ---- errors ------------------------------------------------------------- */

typedef struct {
    int    count;
    char  *text; /* one message per line */
    size_t len, cap;
} ConfigErrors;

void config_errors_add(ConfigErrors *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void config_errors_free(ConfigErrors *e);

/* ---- loading and using a config ----------------------------------------- */

/* Fills `cfg` with every default. */
void config_init_defaults(Config *cfg);
void config_free(Config *cfg);
/* Deep copy (strings duplicated); `dst` must not hold a config. */
void config_copy(Config *dst, const Config *src);

/* Reads YAML text (already in memory; `name` is used in messages). Returns the
 * number of errors added. */
int config_load_yaml(Config *cfg, const char *name, const char *text, size_t len, ConfigErrors *err);
/* Reads a file (at most 1 MiB). */
int config_load_file(Config *cfg, const char *path, ConfigErrors *err);
/* Applies one `key.path=value` override (value parsed as YAML). `index` is the
 * override's position, for messages. */
int config_apply_set(Config *cfg, const char *assignment, int index, ConfigErrors *err);
/* Cross-key rules (config_validate.c). Returns the number of errors added. */
int config_validate(const Config *cfg, ConfigErrors *err);
/* The world size as launched (MPI size, or Slurm's task count) against
 * parallel.dp × parallel.cp. */
int config_validate_world(const Config *cfg, int64_t world, const char *launcher, ConfigErrors *err);

/* Any string as one YAML double-quoted scalar, the only way ringscan puts a
 * string into YAML text (written configs, eval's data.path, imported names):
 * '"' and '\\' escaped, control characters, DEL and the Unicode line breaks
 * (U+0085, U+2028, U+2029) as escapes, so the scalar reads back to exactly `s`.
 * 0, or -1 when it does not fit in cap bytes or `s` is not UTF-8 (YAML text
 * cannot hold it; out is then ""). */
int config_yaml_quote(char *out, size_t cap, const char *s);

/* A value as YAML text ("2048", "[linear_attention, full_attention]"). */
void config_format_value(const Config *cfg, int key, char *buf, size_t n);
/* "file:line:col", "--set #2", or "default". */
void config_format_source(const Config *cfg, int key, char *buf, size_t n);

/* Output generated from the schema. */
void config_print_table(const Config *cfg, FILE *f);           /* resolved, boxed */
void config_write_yaml(const Config *cfg, FILE *f, bool docs); /* loadable YAML */
void config_write_markdown(FILE *f);                           /* docs/config.md */
void config_print_help(FILE *f);                               /* `--help` key list */

/* Keys whose values differ between a and b, restricted to keys whose path
 * starts with one of `prefixes` (NULL-terminated, e.g. {"model.", NULL}):
 * one line per key, "  key: A -> B", appended to `out`. Returns the count. */
int config_diff(const Config *a, const Config *b, const char *const *prefixes, char *out, size_t n);

/* Derived model facts used everywhere. */
LayerKind config_layer_kind(const Config *cfg, int layer);
int64_t   config_rotary_dim(const Config *cfg);
int64_t   config_world(const Config *cfg);
/* Ranks per node of the Slurm job: slurm.gpus_per_node, or dp x cp / slurm.nodes when it is 0 (plan and the
 * job script both read it). */
int64_t   config_tasks_per_node(const Config *cfg);

#endif
