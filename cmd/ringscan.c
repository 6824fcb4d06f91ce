/*
 * ringscan.c — the command line: `ringscan SUBCOMMAND ...`.
 *
 * One table of subcommands gives `--help` and dispatch. Subcommands that take
 * a config share one loader (cli_load_config): YAML file, then `--set`
 * overrides in order, then the cross-key rules; any problem prints every
 * message and exits 2 before anything is written. Subcommands that later
 * issues build say so and exit 2; they print nothing that looks like work.
 *
 * Include manifest (what each header gives this file):
 *   config.h     config_init_defaults, config_load_file, config_apply_set,
 *                config_validate, config_print_table, config_write_yaml,
 *                config_write_markdown, config_print_help
 *   plan.h       plan_build, plan_print, plan_print_json
 *   error.h      RS_EXIT_*, RS_USAGE
 *   build_info.h build_info_print (compiler, CUDA, cuBLAS, NCCL, MPI, libyaml)
 *   comm.h       comm_init, comm_finalize (MPI: ranks for train and resume)
 *   train.h      train_run (the training loop, fresh or resumed), train_catch_stop_signals
 *   submit.h     submit_run (`ringscan submit`: sbatch script, Slurm job)
 *   bench.h      bench_main (`ringscan bench attn|gdn|kda|step|all|cp`, with peers)
 *   hf.h         hf_export (`ringscan export`: a Hugging Face folder)
 *   cmd.h        cmd_data, cmd_eval, cmd_plot (`ringscan data ...`, `eval`, `plot`:
 *                cmd/data.c, cmd/eval.c, cmd/plot.c parse their arguments)
 *   rundir.h     run_dir_check_out_dir (run.out_dir can name a run directory)
 *   ckpt.h       ckpt_check_output (export's OUT_DIR checked before any work)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cmd.h"
#include "core/build_info.h"
#ifdef RS_WITH_CUDA
#include "cuda_info.h"
#endif
#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"
#include "io/ckpt.h"
#include "io/fsio.h"
#include "io/hf.h"
#include "plan/plan.h"
#include "run/rundir.h"
#include "submit.h"
#include "run/train.h"

#ifndef RS_VERSION
#define RS_VERSION "0.0.0"
#endif

typedef struct {
    const char *name;
    const char *args;
    const char *summary;
    int (*run)(int argc, char **argv);
    const char *built_by; /* NULL when built; else the issue that builds it */
} Command;

static const Command *cli_commands(void);

/* ---- shared option parsing ---------------------------------------------- */

typedef struct {
    const char *config;    /* the one positional argument, if any */
    const char *sets[256]; /* --set key=value, in order */
    int         n_sets;
    int         json;
    int         dry_run;
    int         allow_batch_change;
    int         help;
} CliArgs;

static void cli_usage_error(const char *cmd, const char *msg, const char *arg) {
    fprintf(stderr, "ringscan %s: %s%s%s\n  hint: `ringscan %s --help` shows the usage\n", cmd, msg,
            arg ? ": " : "", arg ? arg : "", cmd);
    exit(RS_EXIT_USAGE);
}

enum { CLI_JSON = 1, CLI_DRY_RUN = 2, CLI_BATCH_CHANGE = 4 }; /* options a subcommand accepts besides --set, --help */

static void cli_parse(CliArgs *a, const char *cmd, int argc, char **argv, int allow) {
    memset(a, 0, sizeof *a);
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) a->help = 1;
        else if (!strcmp(s, "--set")) {
            if (i + 1 >= argc) cli_usage_error(cmd, "--set needs key.path=value", NULL);
            if (a->n_sets == 256) cli_usage_error(cmd, "more than 256 --set options", NULL);
            a->sets[a->n_sets++] = argv[++i];
        } else if (!strncmp(s, "--set=", 6)) {
            if (a->n_sets == 256) cli_usage_error(cmd, "more than 256 --set options", NULL);
            a->sets[a->n_sets++] = s + 6;
        } else if ((allow & CLI_JSON) && !strcmp(s, "--json")) a->json = 1;
        else if ((allow & CLI_DRY_RUN) && !strcmp(s, "--dry-run")) a->dry_run = 1;
        else if ((allow & CLI_BATCH_CHANGE) && !strcmp(s, "--allow-batch-change")) a->allow_batch_change = 1;
        else if (s[0] == '-' && s[1]) cli_usage_error(cmd, "unknown option", s);
        else if (!a->config) a->config = s;
        else cli_usage_error(cmd, "unexpected argument", s);
    }
}

/* The rank the launcher gave this process (before MPI_Init), so that only
 * rank 0 prints problems every rank finds alike. */
static int cli_launcher_rank(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    for (int i = 0; vars[i]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

static const char *cli_launcher_name(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE")) return "mpirun";
    if (getenv("SLURM_STEP_ID") || getenv("PMIX_RANK")) return "srun";
    return "this single process (no mpirun)";
}

/* Loads, overrides and validates; on any error prints all (rank 0) and exits 2. */
static void cli_load_config(Config *cfg, const CliArgs *a, const char *cmd) {
    if (!a->config) cli_usage_error(cmd, "missing the config file", NULL);
    ConfigErrors err = {0};
    config_init_defaults(cfg);
    config_load_file(cfg, a->config, &err);
    for (int i = 0; i < a->n_sets; i++) config_apply_set(cfg, a->sets[i], i, &err);
    if (err.count == 0) config_validate(cfg, &err);
    char msg[3 * 4096 + 512];
    if (run_dir_check_out_dir(cfg->run.out_dir, msg, sizeof msg) != 0) config_errors_add(&err, "%s", msg);
    if (err.count && cli_launcher_rank() != 0) exit(RS_EXIT_USAGE);
    if (err.count) {
        fflush(stdout);
        for (char *line = err.text; line && *line;) {
            char *nl = strchr(line, '\n');
            int hint = !strncmp(line, "  hint: ", 8); /* a message's hint line is printed as it is */
            fprintf(stderr, "%s%s%s%.*s\n", hint ? "" : "ringscan ", hint ? "" : cmd, hint ? "" : ": error: ",
                    nl ? (int)(nl - line) : (int)strlen(line), line);
            line = nl ? nl + 1 : NULL;
        }
        fprintf(stderr, "ringscan %s: %d error%s in the config; nothing was run or written\n", cmd, err.count,
                err.count == 1 ? "" : "s");
        config_errors_free(&err);
        config_free(cfg);
        exit(RS_EXIT_USAGE);
    }
    config_errors_free(&err);
}

static void cli_print_command_help(const char *name, FILE *f, int with_keys) {
    for (const Command *c = cli_commands(); c->name; c++) {
        if (strcmp(c->name, name) != 0) continue;
        fprintf(f, "usage: ringscan %s %s\n\n%s\n", c->name, c->args, c->summary);
        if (c->built_by) fprintf(f, "\nNot built yet: %s.\n", c->built_by);
        if (with_keys) {
            fprintf(f, "\nOptions:\n  --set key.path=value   override one config key (repeatable; value is YAML)\n");
            if (strstr(c->args, "--dry-run")) fprintf(f, "  --dry-run              check and say what would happen; write nothing\n");
            if (strstr(c->args, "--allow-batch-change"))
                fprintf(f, "  --allow-batch-change   accept a changed global batch (parallel.dp x data.micro_batch x\n"
                           "                         train.grad_accum samples per step) from the next step on\n");
            fprintf(f, "  --help                 this text\n\n");
            config_print_help(f);
        }
    }
}

/* ---- subcommands -------------------------------------------------------- */

static int cmd_plan(int argc, char **argv) {
    CliArgs a;
    cli_parse(&a, "plan", argc, argv, CLI_JSON);
    if (a.help) { cli_print_command_help("plan", stdout, 1); return RS_EXIT_OK; }
    Config cfg;
    cli_load_config(&cfg, &a, "plan");
    Plan p;
    plan_build(&p, &cfg);
    int rc;
    if (a.json) {
        plan_print_json(&p, &cfg, stdout);
        rc = plan_fits(&p, (ActPolicy)cfg.checkpoint.activations) ? RS_EXIT_OK : RS_EXIT_FAIL;
    } else {
        printf("ringscan plan %s\n", a.config);
        config_print_table(&cfg, stdout);
        rc = plan_print(&p, &cfg, stdout);
    }
    plan_free(&p);
    config_free(&cfg);
    return rc;
}

static int cmd_config(int argc, char **argv) {
    const char *what = argc > 0 ? argv[0] : NULL;
    if (!what || !strcmp(what, "--help") || !strcmp(what, "-h")) {
        printf("usage: ringscan config dump | docs | show CONFIG [--set k=v]... | check CONFIG [--set k=v]...\n\n"
               "  dump    every key with its default and doc, as a YAML file you can edit and load\n"
               "  docs    the same as a Markdown reference (docs/config.md is this output)\n"
               "  show    the resolved config (file + overrides) as YAML\n"
               "  check   validate and print the resolved table; exit 2 on any error\n");
        return what ? RS_EXIT_OK : RS_EXIT_USAGE;
    }
    if (!strcmp(what, "dump") || !strcmp(what, "docs")) {
        if (argc > 1) cli_usage_error("config", "unexpected argument", argv[1]);
        if (!strcmp(what, "docs")) { config_write_markdown(stdout); return RS_EXIT_OK; }
        Config def;
        config_init_defaults(&def);
        printf("# ringscan %s: every config key with its default (`ringscan config dump`)\n", RS_VERSION);
        config_write_yaml(&def, stdout, 1);
        config_free(&def);
        return RS_EXIT_OK;
    }
    if (!strcmp(what, "show") || !strcmp(what, "check")) {
        CliArgs a;
        cli_parse(&a, "config", argc - 1, argv + 1, 0);
        Config cfg;
        cli_load_config(&cfg, &a, "config");
        if (!strcmp(what, "show")) config_write_yaml(&cfg, stdout, 0);
        else {
            config_print_table(&cfg, stdout);
            printf("%s: valid\n", a.config);
        }
        config_free(&cfg);
        return RS_EXIT_OK;
    }
    cli_usage_error("config", "unknown config action (dump, docs, show, check)", what);
    return RS_EXIT_USAGE;
}

static int cmd_version(int argc, char **argv) {
    (void)argv;
    if (argc > 0 && strcmp(argv[0], "--help") && strcmp(argv[0], "-h"))
        cli_usage_error("version", "unexpected argument", argv[0]);
    printf("ringscan %s\n", RS_VERSION);
    build_info_print(stdout);
#ifdef RS_WITH_CUDA
    cuda_info_print(stdout); /* CUDA runtime, driver, cuBLASLt, NCCL */
#endif
    return RS_EXIT_OK;
}

/* Starts MPI, checks the world against dp x cp, and trains. */
static int cli_run_training(Config *cfg, const char *resume_dir, unsigned flags, const char *cmd) {
    train_catch_stop_signals();
    const char *launcher = cli_launcher_name(); /* before MPI_Init, which sets PMIX_* even in a singleton */
    const int rank = cli_launcher_rank();
    comm_startup_guard_arm(cfg->parallel.startup_timeout_s, resume_dir ? resume_dir : cfg->run.out_dir, rank);
    if (cfg->debug.stall_step == 0 && cfg->debug.stall_rank == rank) comm_startup_stall();
    Comm comm;
    comm_init(&comm, NULL, NULL);
    ConfigErrors err = {0};
    if (config_validate_world(cfg, comm.world_size, launcher, &err)) {
        if (comm.rank == 0)
            fprintf(stderr,
                    "ringscan %s: error: %s  hint: launch with `mpirun -np %lld --mca odls_base_sigkill_timeout 30 "
                    "build/ringscan %s ...` (docs/running.md: Stopping)\n",
                    cmd, err.text, (long long)config_world(cfg), cmd);
        config_errors_free(&err);
        comm_finalize(&comm);
        return RS_EXIT_USAGE;
    }
    int rc = train_run(cfg, &comm, resume_dir, flags);
    comm_finalize(&comm);
    config_free(cfg);
    return rc;
}

static int cmd_train(int argc, char **argv) {
    CliArgs a;
    cli_parse(&a, "train", argc, argv, 0);
    if (a.help) { cli_print_command_help("train", stdout, 1); return RS_EXIT_OK; }
    Config cfg;
    cli_load_config(&cfg, &a, "train");
    return cli_run_training(&cfg, NULL, 0, "train");
}

static int cmd_resume(int argc, char **argv) {
    CliArgs a;
    cli_parse(&a, "resume", argc, argv, CLI_DRY_RUN | CLI_BATCH_CHANGE);
    if (a.help) { cli_print_command_help("resume", stdout, 1); return RS_EXIT_OK; }
    if (!a.config) cli_usage_error("resume", "missing the run directory", NULL);
    char run_dir[4096], path[4200];
    snprintf(run_dir, sizeof run_dir, "%s", a.config);
    for (size_t n = strlen(run_dir); n > 1 && run_dir[n - 1] == '/'; n--) run_dir[n - 1] = 0;
    snprintf(path, sizeof path, "%s/config.resolved.yaml", run_dir);
    char why[PATH_MAX + 160];
    int missing = 0;
    FILE *probe = fsio_fopen_regular(path, &missing, NULL, why, sizeof why); /* a FIFO is refused, not waited on */
    if (!probe) {
        if (cli_launcher_rank() == 0)
            fprintf(stderr, "ringscan resume: error: %s is not a run directory: %s%s\n"
                            "  hint: `ringscan train CONFIG` creates run directories (run.out_dir)\n", run_dir,
                    missing ? path : why, missing ? " is missing" : "");
        return RS_EXIT_USAGE;
    }
    fclose(probe);
    a.config = path;
    Config cfg;
    cli_load_config(&cfg, &a, "resume");
    /* run.stop_after_step is a one-shot instruction of the run that stopped; a
     * resume runs on unless the command line asks again */
    int stop = config_find_key("run.stop_after_step");
    if (cfg.source[stop].origin != CONFIG_ORIGIN_SET) cfg.run.stop_after_step = 0;
    return cli_run_training(&cfg, run_dir, (a.dry_run ? TRAIN_DRY_RUN : 0) | (a.allow_batch_change ? TRAIN_ALLOW_BATCH_CHANGE : 0),
                            "resume");
}
static int cmd_submit(int argc, char **argv) {
    CliArgs a;
    cli_parse(&a, "submit", argc, argv, CLI_DRY_RUN);
    if (a.help) { cli_print_command_help("submit", stdout, 1); return RS_EXIT_OK; }
    Config cfg;
    cli_load_config(&cfg, &a, "submit");
    int rc = submit_run(&cfg, a.config, a.dry_run);
    config_free(&cfg);
    return rc;
}
static int cmd_bench(int argc, char **argv) { return bench_main(argc, argv); }
/* `export SRC OUT [--format qwen3_next|qwen3_5] [--dtype bf16|fp32] [--shard-gib N]` (hf.h) */
static int cmd_export(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    HfExportOptions o = {.dtype = ST_DTYPE_F32, .format = HF_FORMAT_QWEN3_NEXT, .shard_gib = 5.0, .progress = stdout};
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            cli_print_command_help("export", stdout, 0);
            return RS_EXIT_OK;
        } else if (!strcmp(s, "--dtype")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(v, "fp32") || !strcmp(v, "float32")) o.dtype = ST_DTYPE_F32;
            else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) o.dtype = ST_DTYPE_BF16;
            else cli_usage_error("export", "--dtype takes bf16 or fp32, not", v);
        } else if (!strcmp(s, "--format")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(v, "qwen3_next")) o.format = HF_FORMAT_QWEN3_NEXT;
            else if (!strcmp(v, "qwen3_5")) o.format = HF_FORMAT_QWEN3_5;
            else cli_usage_error("export", "--format takes qwen3_next or qwen3_5, not", v);
        } else if (!strcmp(s, "--shard-gib")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            char *end;
            o.shard_gib = strtod(v, &end);
            if (!*v || *end || !(o.shard_gib > 0) || o.shard_gib > 1e6)
                cli_usage_error("export", "--shard-gib takes a size in GiB > 0 (e.g. 5 or 0.5), not", v);
        } else if (s[0] == '-' && s[1]) cli_usage_error("export", "unknown option", s);
        else if (npos < 2) pos[npos++] = s;
        else cli_usage_error("export", "unexpected argument", s);
    }
    if (npos < 2) cli_usage_error("export", "needs the source (RUN_DIR, RUN_DIR/ckpt/step_N or a Hugging Face folder) "
                                            "and the output folder", NULL);
    char err[8192];
    int rc = ckpt_check_output(pos[1], FSIO_OUT_DIR, "export OUT_DIR", err, sizeof err); /* before any work */
    if (!rc) rc = hf_export(pos[0], pos[1], &o, err, sizeof err);
    if (rc) fprintf(stderr, "ringscan export: error: %s\n", err);
    return rc;
}

static const Command commands[] = {
    {"train", "CONFIG [--set key.path=value]...",
     "Train a model in a new run directory (run.out_dir): `mpirun -np N --mca odls_base_sigkill_timeout 30\n"
     "build/ringscan train CONFIG`, N = parallel.dp x parallel.cp (the timeout leaves the ranks time to\n"
     "checkpoint on Ctrl-C: docs/running.md). Writes config.resolved.yaml, log.txt, metrics.jsonl, ckpt/.",
     cmd_train, NULL},
    {"resume", "RUN_DIR [--set key.path=value]... [--dry-run] [--allow-batch-change]",
     "Continue a run from its newest valid checkpoint (a corrupt newest one is skipped with a warning).\n"
     "Model and data keys must not change, nor run.out_dir (the run stays in RUN_DIR), nor the global batch\n"
     "(parallel.dp x data.micro_batch x train.grad_accum) unless --allow-batch-change; dp x cp may change\n"
     "at the same global batch (another number of ranks); others (train.steps, checkpoint.*, ...) may be\n"
     "overridden. --dry-run loads and checks the checkpoint and says what would happen, writing nothing.",
     cmd_resume, NULL},
    {"plan", "CONFIG [--set key.path=value]... [--json]",
     "Print the parallel layout, parameters, memory per GPU by category and checkpoint policy,\n"
     "FLOPs per token, communication per step, and a fit verdict against device.memory_gib.\n"
     "Exit 0 when it fits, 1 when it does not, 2 on a bad config.",
     cmd_plan, NULL},
    {"submit", "CONFIG [--set key.path=value]... [--dry-run]",
     "Submit the run to Slurm: check the config and the fit (as plan does), write RUN_DIR/job.sbatch and\n"
     "RUN_DIR/config.submitted.yaml, run `sbatch --parsable` and print the job id. The job trains, and on\n"
     "the warning signal checkpoints, requeues itself and resumes (slurm/README.md).\n"
     "--dry-run prints the job script and writes nothing.",
     cmd_submit, NULL},
    {"bench", "attn|gdn|kda|step|all|cp [options]",
     "Time attention, Gated DeltaNet and KDA kernels and the training step on the GPU, beside peers (--peer).\n"
     "`ringscan bench --help` lists the shapes, conventions and options.",
     cmd_bench, NULL},
    {"data", "synth|bytes ...", "Make training data: synthetic recall tasks, byte-level tokens.", cmd_data,
     NULL},
    {"export", "RUN_DIR|CKPT_DIR|HF_DIR OUT_DIR [--format qwen3_next|qwen3_5] [--dtype fp32|bf16] [--shard-gib N]",
     "Export the weights as a Hugging Face folder: Qwen3NextForCausalLM (--format qwen3_next, the default;\n"
     "every layer dense) or Qwen3.5's Qwen3_5ForCausalLM (--format qwen3_5, model_type qwen3_5_text):\n"
     "config.json and model.safetensors, sharded above --shard-gib (default 5) with\n"
     "model.safetensors.index.json; fp32 (default) or bf16. The source is a run directory (its newest verified\n"
     "checkpoint), one checkpoint directory (RUN_DIR/ckpt/step_N) or a Hugging Face folder (Qwen3-Next, or\n"
     "Qwen3.5 dense: text-only or the composite with its vision tower, which is left aside). OUT_DIR must be\n"
     "new or empty; it is written as OUT_DIR.tmp.<pid> and renamed at the end, so it is never half written.",
     cmd_export, NULL},
    {"eval", "RUN_DIR|CKPT_DIR --data PATH [--out FILE] [--tokens N] [--set key.path=value]...",
     "The checkpoint's held-out loss on PATH, and its loss by context length (log-spaced buckets), on cpu or\n"
     "cuda and under context parallelism (mpirun -np dp x cp), written to RUN_DIR/eval.json (or --out).\n"
     "`ringscan eval --help` says more.",
     cmd_eval, NULL},
    {"plot", "RUN_DIR [--out FILE]",
     "Draw RUN_DIR/plot.png (or FILE): loss, learning rate, gradient norm and tokens/s against step, and the\n"
     "held-out loss by context length when RUN_DIR/eval.json exists. Needs gnuplot (`make deps`).",
     cmd_plot, NULL},
    {"config", "dump | docs | show CONFIG | check CONFIG",
     "Print every key with its default and doc, the Markdown reference, or a resolved config.", cmd_config, NULL},
    {"version", "", "Print the version and what this binary was built with.", cmd_version, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static const Command *cli_commands(void) { return commands; }

static void cli_print_help(FILE *f) {
    fprintf(f, "ringscan %s: long-context training of hybrid Gated DeltaNet / attention models\n\n"
               "usage: ringscan SUBCOMMAND [ARGS]   (ringscan SUBCOMMAND --help for details)\n\n",
            RS_VERSION);
    for (const Command *c = commands; c->name; c++) {
        const char *nl = strchr(c->summary, '\n');
        fprintf(f, "  %-8s %.*s%s\n", c->name, nl ? (int)(nl - c->summary) : (int)strlen(c->summary), c->summary,
                c->built_by ? "  [not built yet]" : "");
    }
    fprintf(f, "\nConfigs are YAML; `ringscan config dump` lists every key. Exit codes: 0 ok, 1 failure or\n"
               "does not fit, 2 bad usage or config, 75 stopped for preemption (SIGUSR1, SIGTERM) after a\n"
               "checkpoint, 130/129 stopped by SIGINT/SIGHUP after a checkpoint (a second Ctrl-C: at once), 76 a\n"
               "rank waited for the others past parallel.comm_timeout_s (a hang; the report names where).\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        cli_print_help(stderr);
        return RS_EXIT_USAGE;
    }
    const char *sub = argv[1];
    /* a file grown past RLIMIT_FSIZE (`ulimit -f`) fails its write with EFBIG, which every writer checks and
     * names (run directory, checkpoints, exports), instead of SIGXFSZ killing the process without a word */
    signal(SIGXFSZ, SIG_IGN);
    /* before anything else: a stop signal that arrives while a run starts is kept, not fatal */
    if (!strcmp(sub, "train") || !strcmp(sub, "resume")) train_catch_stop_signals();
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        cli_print_help(stdout);
        return RS_EXIT_OK;
    }
    if (!strcmp(sub, "--version")) return cmd_version(0, NULL);
    for (const Command *c = commands; c->name; c++) {
        if (strcmp(c->name, sub) != 0) continue;
        if (c->built_by && argc > 2 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
            cli_print_command_help(c->name, stdout, 0);
            return RS_EXIT_OK;
        }
        return c->run(argc - 2, argv + 2);
    }
    fprintf(stderr, "ringscan: unknown subcommand '%s'\n  hint: `ringscan --help` lists the subcommands\n", sub);
    return RS_EXIT_USAGE;
}
