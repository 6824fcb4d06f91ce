/*
 * train.c — the training loop of `train` and `resume` (train.h).
 *
 * One optimizer step: read this rank's samples of every micro-batch (global
 * sample g = consumed + (micro_step x dp + dp_rank) x micro_batch + j) and
 * all-reduce the count of predicted tokens, so the loss is the global mean
 * whatever the layout; forward + backward of each micro-batch, gradients
 * adding up; all-reduce the gradients over dp x cp (parallel.shard: model_shard.c); global gradient norm,
 * clipping and AdamW; a log line and a metrics.jsonl object (rank 0); a
 * checkpoint when checkpoint.every, the last step, run.stop_after_step or an
 * agreed stop signal asks (then exit 75 for SIGUSR1/SIGTERM, 128 + signal for
 * SIGINT/SIGHUP).
 *
 * The data position is the number of global samples consumed, independent of
 * dp, cp and the micro-batch split; resume restores weights, AdamW state, the
 * step and that position (train_ckpt.c), and on the cpu backend reproduces
 * the uninterrupted run's losses bitwise. The run directory (lock, checks,
 * config.resolved.yaml, log.txt) is rundir.c's.
 *
 * On cuda each rank drives one GPU; communication is NCCL on streams of its
 * own (kernels/cuda/comm_nccl.c). Rows are read on the host into page-locked
 * buffers and each micro-batch's metadata is queued for upload behind the
 * work before it. Inside a step the host never waits for the GPU: it reads the
 * loss and then the gradient norm once at the step's end, so a step's host
 * rows are free only after it. Peak memory is reported after the first step
 * beside the plan's estimate.
 *
 * Callers: cmd/ringscan.c (train_run).
 */
#include "train.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/runtime.h"
#include "io/ckpt.h"
#include "data/data.h"
#include "core/error.h"
#include "io/hf.h"
#include "model/model.h"
#include "plan/plan.h"
#include "train_ckpt.h"
#include "train_state.h"

/* The stop request: the first signal caught (SIGUSR1, SIGTERM: preemption; SIGINT, SIGHUP: the user
 * or the terminal), answered after the current step. A second SIGINT ends the process at once
 * (exit 130, no checkpoint: the last one on disk is intact, checkpoints are atomic).
 *
 * Under Open MPI's mpirun each rank is in a process group of its own, so the terminal's Ctrl-C
 * (SIGINT to the foreground group) reaches mpirun only, and mpirun answers SIGINT, SIGTERM and
 * SIGHUP alike: SIGCONT to every rank, SIGTERM odls_base_sigkill_timeout seconds later, SIGKILL
 * as long again after that, and it exits 1 whatever the ranks return (SIGUSR1 and SIGTSTP it
 * forwards, the latter as SIGSTOP, and resumes with SIGCONT: so SIGCONT tells nothing). Two things
 * make the ranks see the signal the user sent: each rank started by mpirun on its own host keeps a
 * small relay process in mpirun's process group (train_relay_group_signals), which passes a SIGINT,
 * SIGHUP or SIGTERM sent to that group (Ctrl-C, a closed terminal, `kill -- -PGID`) on to its rank
 * at once, and the ranks agree on the request in an all-reduce; and a SIGTERM from the launcher
 * itself (this rank's parent, mpirun or orted: a signal sent to mpirun's pid alone) is a request of
 * its own kind, named so in the log, exit 75, which any signal sent to the ranks outranks.
 * docs/running.md: Stopping. */
enum { TRAIN_STOP_LAUNCHER = 1, TRAIN_STOP_USER = 2, TRAIN_STOP_PREEMPT = 3 }; /* ranks of a stop request */
static volatile sig_atomic_t train_signal_seen = 0; /* the signal of the request kept */
static volatile sig_atomic_t train_signal_rank = 0; /* its TRAIN_STOP_* */
static pid_t train_launcher_pid = 0;                /* mpirun (or orted) when it started this rank; 0: none */

static void train_on_signal(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    if (sig == SIGINT && train_signal_seen && train_signal_rank != TRAIN_STOP_LAUNCHER) {
        static const char msg[] = "\nringscan: second interrupt: exiting now, without a checkpoint\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(128 + SIGINT);
    }
    int from_launcher = sig == SIGTERM && train_launcher_pid > 0 && si && si->si_code == SI_USER &&
                        si->si_pid == train_launcher_pid;
    int rank = from_launcher ? TRAIN_STOP_LAUNCHER
               : sig == SIGUSR1 || sig == SIGTERM ? TRAIN_STOP_PREEMPT
                                                   : TRAIN_STOP_USER;
    if (!train_signal_seen || rank > train_signal_rank) {
        train_signal_seen = sig;
        train_signal_rank = rank;
    }
}

/* The relay (see above): a child of the rank in mpirun's process group that passes the group's
 * SIGINT, SIGHUP and SIGTERM on to the rank, and dies with it (PR_SET_PDEATHSIG). It holds no file
 * of the rank's (stdout/stderr are mpirun's pipes, which must close when the rank ends) and ignores
 * the terminal's job-control signals. Only where it can join that group: mpirun's host, the same
 * session; a rank under orted is on another host, where no terminal signal comes from. */
static pid_t train_relay_rank = 0; /* in the relay: its rank */
static void train_relay_on_signal(int sig) {
    if (getppid() == train_relay_rank) kill(train_relay_rank, sig); /* never to whoever adopted an orphan */
}

static void train_relay_group_signals(pid_t launcher) {
    pid_t group = getpgid(launcher);
    if (group <= 0 || group == getpgrp() || getsid(launcher) != getsid(0)) return;
    train_relay_rank = getpid();
    pid_t child = fork();
    if (child != 0) return; /* the rank (or a failed fork: no relay, mpirun's SIGTERM still stops the run) */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != train_relay_rank) _exit(0);
    long fds = sysconf(_SC_OPEN_MAX);
    for (long fd = 0; fd < (fds > 0 && fds < 65536 ? fds : 65536); fd++) close((int)fd);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = SIG_IGN;
    static const int quiet[] = {SIGTSTP, SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2, SIGCONT, SIGQUIT, SIGPIPE};
    for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++) sigaction(quiet[i], &sa, NULL);
    sa.sa_handler = train_relay_on_signal;
    static const int relayed[] = {SIGINT, SIGHUP, SIGTERM};
    for (size_t i = 0; i < sizeof relayed / sizeof relayed[0]; i++) sigaction(relayed[i], &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (setpgid(0, group) != 0) _exit(0);
    for (;;) pause();
}

void train_catch_stop_signals(void) {
    static const int sigs[] = {SIGUSR1, SIGTERM, SIGINT, SIGHUP};
    const int n = (int)(sizeof sigs / sizeof sigs[0]);
    /* mpirun and orted start each rank themselves and put OMPI_COMM_WORLD_SIZE in its environment; read
     * at the first call only, in main before MPI_Init (which sets it in a singleton and under srun too) */
    static int launcher_known = 0;
    if (!launcher_known) {
        train_launcher_pid = getenv("OMPI_COMM_WORLD_SIZE") ? getppid() : 0;
        if (train_launcher_pid > 1) train_relay_group_signals(train_launcher_pid);
    }
    launcher_known = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = train_on_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < n; i++) sigaddset(&sa.sa_mask, sigs[i]); /* one handler at a time */
    for (int i = 0; i < n; i++) {
        /* `nohup` starts the process with SIGHUP ignored: the user asked that a closed terminal not stop the
         * run, so an ignored SIGHUP stays ignored (read at the first call, before this function set it) */
        static int hup_ignored = -1;
        if (sigs[i] == SIGHUP && hup_ignored < 0) {
            struct sigaction old;
            hup_ignored = sigaction(SIGHUP, NULL, &old) == 0 && old.sa_handler == SIG_IGN;
        }
        if (sigs[i] == SIGHUP && hup_ignored) continue;
        sigaction(sigs[i], &sa, NULL);
    }
}

int train_stop_exit_code(int sig) {
    return sig == SIGUSR1 || sig == SIGTERM ? RS_EXIT_PREEMPTED : 128 + sig;
}

/* The stop request every rank agrees on, in one all-reduce: the highest TRAIN_STOP_* wins (a
 * preemption over an interrupt, so a job that Slurm preempts while someone presses Ctrl-C is still
 * requeued; either over mpirun's SIGTERM, which some ranks may see first). Returns the signal (0:
 * none); *launcher: whether it was mpirun's SIGTERM. */
static int train_agreed_signal(Trainer *t, int *launcher) {
    int s = train_signal_seen, r = train_signal_rank;
    int v = comm_allreduce_max_int(t->comm, t->comm->world, s ? 256 * r + s : 0);
    if (launcher) *launcher = v >> 8 == TRAIN_STOP_LAUNCHER;
    return v & 255;
}

/* What stopped the run, for the log: "signal 2 (Interrupt)", or mpirun's SIGTERM. */
static void train_stop_cause(char *buf, size_t n, int sig, int launcher) {
    if (launcher)
        snprintf(buf, n, "SIGTERM from mpirun (what it sends the ranks for a SIGINT, SIGTERM or SIGHUP it receives, "
                         "Ctrl-C included; mpirun itself then exits 1)");
    else
        snprintf(buf, n, "signal %d (%s)", sig, strsignal(sig));
}

static double train_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double train_lr(const Config *cfg, int64_t step) {
    const TrainConfig *tc = &cfg->train;
    if (tc->warmup_steps > 0 && step <= tc->warmup_steps) return tc->lr * (double)step / (double)tc->warmup_steps;
    switch (tc->schedule) {
    case LR_SCHEDULE_CONSTANT: return tc->lr;
    case LR_SCHEDULE_WSD: {
        int64_t decay = tc->decay_steps > 0 ? tc->decay_steps : tc->steps / 5;
        int64_t start = tc->steps - decay;
        if (step <= start || decay == 0) return tc->lr;
        double f = (double)(step - start) / (double)decay;
        return tc->lr + (tc->min_lr - tc->lr) * f;
    }
    case LR_SCHEDULE_COSINE:
    default: {
        int64_t span = tc->steps - tc->warmup_steps;
        double f = span > 0 ? (double)(step - tc->warmup_steps) / (double)span : 1.0;
        if (f > 1) f = 1;
        return tc->min_lr + 0.5 * (tc->lr - tc->min_lr) * (1.0 + cos(M_PI * f));
    }
    }
}

static void train_fmt_duration(double s, char *buf, size_t n) {
    if (s < 0 || !isfinite(s)) snprintf(buf, n, "?");
    else if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else if (s < 86400) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else snprintf(buf, n, "%dd%02dh", (int)(s / 86400), (int)(s / 3600) % 24);
}

static void train_fmt_count(double v, char *buf, size_t n) {
    if (v >= 1e9) snprintf(buf, n, "%.2fG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, n, "%.2fM", v / 1e6);
    else if (v >= 1e4) snprintf(buf, n, "%.1fk", v / 1e3);
    else snprintf(buf, n, "%.0f", v);
}

/* ---- the step's samples ---------------------------------------------------- */

/* Reads micro-step `a`'s samples of this rank into the step buffers: each sample's fragments of
 * the CP layout (cp.h), so a rank reads only its own tokens. */
static void train_read_micro(Trainer *t, int64_t a) {
    const Config *cfg = t->cfg;
    int64_t mb = cfg->data.micro_batch, Tl = t->T_local, rows = mb * Tl;
    DataSpanReader r = {.data = t->data};
    for (int64_t j = 0; j < mb; j++) {
        int64_t g = t->samples + (a * t->comm->dp + t->comm->dp_rank) * mb + j;
        int64_t o = a * rows + j * Tl;
        if (cp_read_sample(&t->model.cp.L, data_span_read, &r, g, t->tokens + o, t->targets + o, t->pos + o,
                           t->doc_pos + o) != 0)
            data_fail(r.err);
    }
}

static void train_open_metrics(Trainer *t) {
    if (t->comm->rank != 0) return;
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->run_dir);
    t->metrics = fopen(path, "a");
    if (!t->metrics) RS_FATAL("cannot open %s: %s", path, strerror(errno));
}

/* One whole line of metrics.jsonl, or none (a failed write is cut off; train_check_writes stops the run). */
static void train_write_metrics(Trainer *t, json_t *o) {
    if (!t->metrics) return;
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    size_t n = strlen(s);
    s = RS_REALLOC(s, n + 2);
    memcpy(s + n, "\n", 2);
    train_append(t, t->metrics, "metrics.jsonl", s);
    free(s);
}

/* ---- the loop ------------------------------------------------------------------ */

/* The step's work counters in metrics.jsonl: per layer (arrays of num_hidden_layers), summed
 * over the step's micro-batches (`micro_batches` of them), so the checkpoint policies can be
 * checked: remat runs attention, the ring and the scan all-gather once per layer and
 * micro-batch, full twice, and neither reruns a halo exchange beyond its own; none reruns
 * no block and no row chunk (block_recomputes, chunk_recomputes 0). */
static void train_metrics_counters(Trainer *t, json_t *o) {
    json_t *c = cp_counters_json(&t->model.cp);
    json_object_set_new(c, "micro_batches", json_integer(t->cfg->train.grad_accum));
    json_object_set_new(c, "block_recomputes", json_integer(t->model.count.block_recomputes));
    json_object_set_new(c, "chunk_recomputes", json_integer(t->model.count.chunk_recomputes));
    json_object_set_new(c, "offload_bytes_to_host", json_integer(t->model.count.offload_bytes_to_host));
    json_object_set_new(c, "offload_bytes_to_device", json_integer(t->model.count.offload_bytes_to_device));
    json_object_set_new(o, "counters", c);
}

/* Micro-batch k's metadata where the backend's kernels read it: the step's host rows on cpu; on
 * cuda, its slot of t->batch_dev, the upload queued behind the work before it (no host wait). */
static Batch train_batch(Trainer *t, int64_t k) {
    int64_t mb = t->cfg->data.micro_batch, rows = mb * t->T_local;
    int32_t *const host[4] = {t->tokens + k * rows, t->targets + k * rows, t->pos + k * rows, t->doc_pos + k * rows};
    Batch b = {rows, (int32_t)mb, t->T_local, host[0], host[1], host[2], host[3], host[2], host[3], (int)k};
    if (!t->batch_dev) return b;
    int32_t *dev = t->batch_dev + k * 4 * rows;
    for (int i = 0; i < 4; i++) t->be->to_device_async(dev + i * rows, host[i], (size_t)rows * sizeof(int32_t));
    b.tokens = dev;
    b.targets = dev + rows;
    b.pos = dev + 2 * rows;
    b.doc_pos = dev + 3 * rows;
    return b;
}

/* The most memory this rank's backend has held, in bytes; -1 where it is not measured (cpu). */
static int64_t train_peak_bytes(const Trainer *t) {
    if (t->cfg->device.kind != DEVICE_KIND_CUDA) return -1; /* the cpu backend tracks nothing */
    BackendMemStats s;
    t->be->memory_stats(&s);
    return s.peak_allocated + s.internal;
}

static void train_report_memory(Trainer *t) {
    if (t->cfg->device.kind != DEVICE_KIND_CUDA) return;
    BackendMemStats s;
    t->be->memory_stats(&s);
    const double G = (double)(1 << 30);
    train_say(t, "memory (rank 0, step %lld): peak %.2f GiB = %.2f GiB allocated + %.2f GiB cuBLASLt workspace and "
                 "kernel scratch; device %.2f of %.2f GiB in use (CUDA context included) | plan %.2f GiB "
                 "(context and slack included)\n",
              (long long)t->step, (double)(s.peak_allocated + s.internal) / G, (double)s.peak_allocated / G,
              (double)s.internal / G, (double)s.device_used / G, (double)s.device_total / G,
              (double)t->plan.total[t->cfg->checkpoint.activations] / G);
}

static int train_loop(Trainer *t) {
    Config *cfg = t->cfg;
    Comm *comm = t->comm;
    Model *m = &t->model;
    int64_t accum = cfg->train.grad_accum, mb = cfg->data.micro_batch, Tl = t->T_local, rows = mb * Tl;
    double ema_step = 0;
    int ema_n = 0;
    char a[32], b[32], c[32];

    while (t->step < cfg->train.steps) {
        double t0 = train_now();
        t->step++;
        comm_set_step(comm, t->step);
        double lr = train_lr(cfg, t->step);
        model_zero_grads(m);
        memset(&m->count, 0, sizeof m->count);
        cp_counters_reset(&m->cp);

        /* [0] the tokens with a next-token target (the loss's mean), [1] the (query, key) pairs attention
         * computes under the causal and document masks: min(pos, doc_pos) + 1 keys per token (for MFU, so
         * that packed short documents are not counted as full causal attention) */
        double counts[2] = {0, 0};
        for (int64_t k = 0; k < accum; k++) train_read_micro(t, k);
        for (int64_t i = 0; i < accum * rows; i++) {
            counts[0] += t->targets[i] >= 0;
            counts[1] += (double)(t->pos[i] < t->doc_pos[i] ? t->pos[i] : t->doc_pos[i]) + 1;
        }
        comm_set_context(comm, -1, "token count");
        comm_allreduce_sum_f64(comm, comm->world, counts, 2);
        const double n_global = counts[0], attn_pairs = counts[1];
        if (n_global < 1) RS_FATAL("step %lld has no token with a next-token target", (long long)t->step);
        float grad_scale = (float)(1.0 / n_global);

        for (int64_t k = 0; k < accum; k++) {
            Batch bt = train_batch(t, k);
            model_forward_backward(m, &bt, grad_scale, k == accum - 1);
        }
        /* the step's host synchronisations: the loss read waits for the GPU, then the gradient norm; on
         * cuda the watchdog times the first, where a stuck NCCL operation shows up */
        comm_set_context(comm, -1, "step-end loss read");
        comm_watch_begin(comm, "loss read", COMM_WORLD);
        double local_loss = model_loss_sum(m, (int)accum);
        comm_watch_end(comm);
        comm_set_context(comm, -1, "loss all-reduce");
        double loss = comm_allreduce_sum_scalar(comm, comm->world, local_loss) / n_global;
        double gnorm = sqrt(model_grad_sum_squares(m));
        if (!isfinite(gnorm) || !isfinite(loss))
            RS_FATAL("non-finite loss %g or gradient norm %g at step %lld; the weights were not updated (the last "
                     "checkpoint is intact)",
                     loss, gnorm, (long long)t->step);
        float clip = cfg->train.grad_clip > 0 && gnorm > cfg->train.grad_clip ? (float)(cfg->train.grad_clip / gnorm)
                                                                                 : 1.0f;
        model_optimizer_step(m, lr, clip, (int)t->step);
        t->samples += t->samples_per_step;

        double dt = train_now() - t0;
        double tok_s = (double)t->tokens_per_step / dt;
        if (t->step > t->start_step + 1) {
            ema_step = ema_n ? 0.9 * ema_step + 0.1 * dt : dt;
            ema_n++;
        }
        train_fmt_count(tok_s, a, sizeof a);
        train_fmt_count(tok_s / comm->world_size, b, sizeof b);
        train_fmt_duration((double)(cfg->train.steps - t->step) * (ema_n ? ema_step : dt), c, sizeof c);
        /* the step's model FLOPs: plan's per token, attention by the pairs the masks keep */
        const double step_flops = (t->plan.flops_model - t->plan.flops_attn_causal) * (double)t->tokens_per_step +
                                  t->plan.flops_attn_full / (double)cfg->data.seq_len * attn_pairs;
        const double mfu_frac = step_flops / dt / (comm->world_size * cfg->device.peak_tflops * 1e12);
        char mfu[48] = "";
        if (cfg->device.peak_tflops > 0) snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100.0 * mfu_frac);
        if (t->step % cfg->run.log_every == 0 || t->step == cfg->train.steps || t->step == t->start_step + 1)
            train_say(t, "step %*lld/%lld | loss %.6f | lr %.3e | gnorm %.4f | %.0f ms | %s tok/s (%s/rank)%s | ETA %s\n",
                      t->step_width, (long long)t->step, (long long)cfg->train.steps, loss, lr, gnorm, dt * 1e3, a,
                      b, mfu, c);
        if (t->step == t->start_step + 1) train_report_memory(t);

        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer(t->step));
        json_object_set_new(o, "loss", json_real(loss));
        json_object_set_new(o, "lr", json_real(lr));
        json_object_set_new(o, "grad_norm", json_real(gnorm));
        json_object_set_new(o, "tokens", json_integer(t->samples * cfg->data.seq_len));
        json_object_set_new(o, "tokens_per_s", json_real(tok_s));
        json_object_set_new(o, "ms", json_real(dt * 1e3));
        json_object_set_new(o, "predicted_tokens", json_integer((json_int_t)n_global));
        json_object_set_new(o, "attention_pairs", json_integer((json_int_t)attn_pairs));
        json_object_set_new(o, "model_flops", json_real(step_flops));
        if (cfg->device.peak_tflops > 0) json_object_set_new(o, "mfu", json_real(mfu_frac));
        train_metrics_counters(t, o);
        json_object_set_new(o, "activation_bytes_kept", json_integer(m->bytes_kept));
        if (train_peak_bytes(t) >= 0) json_object_set_new(o, "peak_mem_bytes", json_integer(train_peak_bytes(t)));
        json_object_set_new(o, "activation_bytes_planned",
                            json_integer(t->plan.acts.kept[cfg->checkpoint.activations]));
        train_write_metrics(t, o);
        json_decref(o);
        train_check_writes(t, RS_EXIT_FAIL); /* a failed write to log.txt or metrics.jsonl: every rank stops */

        comm_set_context(comm, -1, "stop-signal all-reduce");
        int stop_launcher = 0;
        int stop_signal = train_agreed_signal(t, &stop_launcher);
        int at_end = t->step == cfg->train.steps;
        int stop_asked = cfg->run.stop_after_step > 0 && t->step == cfg->run.stop_after_step;
        int due = cfg->checkpoint.every > 0 && t->step % cfg->checkpoint.every == 0;
        comm_set_context(comm, -1, "checkpoint save");
        if (due || at_end || stop_asked || stop_signal) train_ckpt_save(t);
        if (stop_signal) {
            int code = train_stop_exit_code(stop_signal);
            char cause[256];
            train_stop_cause(cause, sizeof cause, stop_signal, stop_launcher);
            train_say(t, "stopped by %s after step %lld, checkpoint written; exit %d (%s)\n", cause, (long long)t->step,
                      code,
                      code == RS_EXIT_PREEMPTED ? "requeue and resume" : "continue with `ringscan resume`");
            return code;
        }
        if (stop_asked && !at_end) {
            train_say(t, "stopped after step %lld as run.stop_after_step asked; continue with `ringscan resume %s`\n",
                      (long long)t->step, t->run_dir);
            return RS_EXIT_OK;
        }
    }
    train_say(t, "done: %lld steps\n", (long long)t->step);
    return RS_EXIT_OK;
}

/* plan's fit verdict, before anything is allocated or written (exit 2 with plan's numbers). The
 * capacity is device.memory_gib per GPU on cuda; on cpu the ranks share the host's memory, so it is
 * the smaller of device.memory_gib (per rank, as plan reads it) and this host's physical memory over
 * the ranks on it. Builds t->plan. */
static void train_check_fit(Trainer *t) {
    const Config *cfg = t->cfg;
    plan_build(&t->plan, cfg);
    ActPolicy pol = (ActPolicy)cfg->checkpoint.activations;
    const double G = (double)(1 << 30);
    double need = (double)t->plan.total[pol] / G;
    if (!plan_fits(&t->plan, pol)) {
        int64_t stage_need[SHARD_COUNT];
        int st = plan_shard_fit(cfg, pol, stage_need);
        char shard_hint[256] = "";
        if (st > (int)t->plan.shard)
            snprintf(shard_hint, sizeof shard_hint, "\n  hint: parallel.shard=%s fits (%.2f GiB per rank)",
                     shard_names[st], (double)stage_need[st] / G);
        train_fail(t, RS_EXIT_USAGE, "the run does not fit: plan needs %.2f GiB per %s with checkpoint.activations = "
                                     "%s, device.memory_gib = %g; nothing was written%s\n"
                                     "  hint: `ringscan plan` shows the memory by category and which policy, shard "
                                     "stage (and ring settings) fit",
                   need, cfg->device.kind == DEVICE_KIND_CUDA ? "GPU" : "rank", act_policy_names[pol],
                   cfg->device.memory_gib, shard_hint);
    }
    if (cfg->device.kind != DEVICE_KIND_CPU) return;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double host = pages > 0 && page > 0 ? (double)pages * (double)page / G : 1e30;
    double share = host / (t->comm->local_size > 0 ? t->comm->local_size : 1);
    /* hosts may differ: every rank learns whether any is short, so all leave together (rank 0 reports) */
    if (comm_allreduce_max_int(t->comm, t->comm->world, need > share))
        train_fail(t, RS_EXIT_USAGE, "the run does not fit this host: plan needs %.2f GiB per rank with "
                                     "checkpoint.activations = %s, and %s has %.2f GiB of memory for %d rank%s "
                                     "(%.2f GiB each); nothing was written\n"
                                     "  hint: set device.memory_gib to the memory a rank may use, and `ringscan plan` "
                                     "shows what fits",
                   need, act_policy_names[pol], t->comm->host, host, t->comm->local_size,
                   t->comm->local_size == 1 ? "" : "s", share);
}

int train_run(Config *cfg, Comm *comm, const char *resume_dir, unsigned flags) {
    Trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    t.comm = comm;
    t.lock_fd = -1;
    t.last_ckpt = -1;
    t.allow_batch_change = (flags & TRAIN_ALLOW_BATCH_CHANGE) != 0;
    int dry_run = (flags & TRAIN_DRY_RUN) != 0;
    snprintf(t.run_dir, sizeof t.run_dir, "%s", resume_dir ? resume_dir : cfg->run.out_dir);
    char backend_line[4096] = ""; /* which attention the cuda backend runs: said once log.txt is open */
    t.be = runtime_open(cfg, comm, backend_line, sizeof backend_line); /* groups, GPU + NCCL, backend, threads */
    if (!t.be) train_fail(&t, RS_EXIT_USAGE, "%s", backend_line);

    /* everything that can be wrong with the input is checked before anything is written */
    char err[4096];
    if (data_open(&t.data, &cfg->data, cfg->model.vocab_size, (uint64_t)cfg->run.seed, err, sizeof err) != 0)
        train_fail(&t, RS_EXIT_USAGE, "%s", err);
    train_check_fit(&t);
    float *init = NULL; /* model.init_from's weights (lib/io/hf.h), read and checked before anything is written */
    char init_note[1024] = ""; /* which tensors of the source the import left aside */
    if (!resume_dir && cfg->model.init_from[0]) {
        ParamTable tab;
        model_params_build(&tab, cfg);
        init = RS_CALLOC((size_t)tab.buffer_numel, sizeof(float));
        int rc = hf_import(init, &tab, cfg, cfg->model.init_from, "model.init_from", init_note, sizeof init_note, err,
                           sizeof err);
        model_params_free(&tab);
        if (rc) train_fail(&t, rc, "%s\n  hint: nothing was written", err);
    }
    run_dir_claim(&t, resume_dir != NULL, dry_run); /* exits 2 when another run holds it, or on train when
                                                            it holds what a new run must not overwrite */
    TrainResume res;
    if (resume_dir) train_ckpt_load(&t, &res); /* exits 2 on a bad or mismatched checkpoint or option */
    if (dry_run) {
        train_say(&t, "resume %s: would continue from %s (step %lld of %lld, %lld samples consumed); nothing was "
                      "run or written\n",
                  t.run_dir, res.dir, (long long)res.step, (long long)cfg->train.steps, (long long)res.samples);
        ckpt_close(&res.ck);
        data_close(t.data);
        plan_free(&t.plan);
        return RS_EXIT_OK;
    }

    t.T_local = cfg->data.seq_len / cfg->parallel.cp;
    t.samples_per_step = cfg->parallel.dp * cfg->data.micro_batch * cfg->train.grad_accum;
    t.tokens_per_step = t.samples_per_step * cfg->data.seq_len;
    int64_t rows = cfg->train.grad_accum * cfg->data.micro_batch * t.T_local; /* the step's rows */
    t.tokens = t.be->host_alloc((size_t)rows * sizeof(int32_t));
    t.targets = t.be->host_alloc((size_t)rows * sizeof(int32_t));
    t.pos = t.be->host_alloc((size_t)rows * sizeof(int32_t));
    t.doc_pos = t.be->host_alloc((size_t)rows * sizeof(int32_t));
    for (int64_t s = cfg->train.steps; s > 0; s /= 10) t.step_width++;
    if (cfg->device.kind == DEVICE_KIND_CUDA) t.batch_dev = t.be->alloc((size_t)(4 * rows) * sizeof(int32_t));

    run_dir_open(&t);
    model_init(&t.model, cfg, t.be, comm, cfg->data.micro_batch * t.T_local);
    if (init) {
        model_set_full(&t.model, 0, init);
        free(init);
        train_say(&t, "init: weights from %s (model.init_from); optimizer state fresh\n", cfg->model.init_from);
        if (init_note[0]) train_say(&t, "init: %s\n", init_note);
    }
    if (resume_dir) {
        train_ckpt_restore(&t, &res);
        if (comm->rank == 0) run_dir_trim_metrics(&t, t.step);
    }
    t.start_step = t.step;
    train_open_metrics(&t);

    char a[64];
    if (comm->rank == 0) {
        config_print_table(cfg, stdout);
        char *table = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&table, &len);
        RS_CHECK(mem != NULL, "open_memstream: %s", strerror(errno));
        config_print_table(cfg, mem);
        fclose(mem);
        train_append(&t, t.log, "log.txt", table);
        free(table);
    }
    train_say(&t, "ringscan %s | run %s -> %s | backend %s | world %d = dp %d x cp %d | %s\n", RS_VERSION,
              cfg->run.name, t.run_dir, t.be->name, comm->world_size, comm->dp, comm->cp, comm->host);
    if (backend_line[0]) train_say(&t, "%s\n", backend_line);
    snprintf(a, sizeof a, "%.2f GiB", (double)t.plan.total[cfg->checkpoint.activations] / (1 << 30));
    train_say(&t, "model: %lld parameters, %d linear_attention + %d full_attention layers | plan: %s per rank "
                  "(activations kept %.1f MiB, allocated %.1f MiB)\n",
              (long long)t.model.ptab.count, t.plan.n_linear, t.plan.n_full, a,
              (double)t.plan.acts.kept[cfg->checkpoint.activations] / (1 << 20), (double)t.model.bytes_kept / (1 << 20));
    if (cfg->parallel.shard != SHARD_NONE && t.model.shard == SHARD_NONE)
        train_say(&t, "shard: parallel.shard = %s in a world of one rank: nothing to cut, runs as none\n",
                  shard_names[cfg->parallel.shard]);
    else if (t.model.shard != SHARD_NONE)
        train_say(&t, "shard: %s over the world of %d ranks: master weights and AdamW moments %.1f MiB per rank (of "
                      "%.1f MiB; %lld elements of bucket padding)\n",
                  shard_names[t.model.shard], comm->world_size, 12.0 * (double)t.model.shard_numel / (1 << 20),
                  12.0 * (double)t.model.ptab.count / (1 << 20), (long long)t.model.ptab.shard_pad);
    const DataSource *src = data_source(t.data);
    train_say(&t, "data: %s: %lld tokens, %lld documents, %lld samples of %lld tokens per epoch | %lld tokens per "
                  "step\n",
              src->path, (long long)src->n_tokens, (long long)src->n_docs, (long long)data_samples_per_epoch(t.data),
              (long long)cfg->data.seq_len, (long long)t.tokens_per_step);
    if (resume_dir)
        train_say(&t, "resumed from %s: step %lld, %lld samples consumed\n", res.dir, (long long)t.step,
                  (long long)t.samples);
    if (resume_dir && res.batch_before != t.samples_per_step)
        train_say(&t, "global batch: %lld samples per step up to step %lld, %lld from step %lld on "
                      "(--allow-batch-change)\n",
                  (long long)res.batch_before, (long long)t.step, (long long)t.samples_per_step,
                  (long long)t.step + 1);
    if (cfg->device.peak_tflops <= 0)
        train_say(&t, "MFU: n/a (device.peak_tflops is not set; set it to report MFU)\n");
    /* mpirun passes --mca settings to the ranks as OMPI_MCA_*: without this one a Ctrl-C gives them 1 s */
    if (train_launcher_pid > 0 && !getenv("OMPI_MCA_odls_base_sigkill_timeout"))
        train_say(&t, "note: mpirun kills the ranks 1 s after its SIGTERM (Open MPI's default odls_base_sigkill_timeout, "
                      "not set on this mpirun's command line): a Ctrl-C may kill them before their checkpoint; launch "
                      "with `mpirun --mca odls_base_sigkill_timeout 30 ...` (docs/running.md: Stopping)\n");
    if (comm->rank == 0) { /* a save killed mid-write (mpirun's SIGKILL, a crash) left its temporary behind */
        char gone[1024];
        int lrc = ckpt_remove_leftovers(t.run_dir, gone, sizeof gone, err, sizeof err);
        if (lrc) train_fail(&t, lrc, "%s", err);
        if (gone[0])
            train_say(&t, "removed what an unfinished checkpoint save left in %s/ckpt: %s\n", t.run_dir, gone);
    }

    train_check_writes(&t, RS_EXIT_FAIL); /* the header lines reached log.txt */
    train_catch_stop_signals();
    comm_startup_guard_disarm(); /* the start-up is over: the watchdog times every wait from here */
    if (comm->world_size > 1) /* no wait for other ranks can hang a single rank */
        comm_watchdog_start(comm, &(CommWatchOptions){cfg->parallel.comm_timeout_s, t.run_dir, cfg->debug.stall_rank,
                                                      cfg->debug.stall_step, cfg->debug.stall_layer});
    /* a stop signal during the set-up: nothing was trained, so nothing new to checkpoint */
    int early_launcher = 0;
    int early = train_agreed_signal(&t, &early_launcher);
    int rc;
    if (early) {
        rc = train_stop_exit_code(early);
        char cause[256];
        train_stop_cause(cause, sizeof cause, early, early_launcher);
        train_say(&t, "stopped by %s before step %lld; nothing new to checkpoint; exit %d\n", cause,
                  (long long)t.step + 1, rc);
    } else {
        rc = train_loop(&t);
    }

    train_check_writes(&t, rc ? rc : RS_EXIT_FAIL); /* the last lines ("done", "stopped by signal") reached log.txt */
    if (t.metrics) fclose(t.metrics);
    if (t.log) fclose(t.log);
    model_free(&t.model);
    plan_free(&t.plan);
    data_close(t.data);
    t.be->host_free(t.tokens);
    t.be->host_free(t.targets);
    t.be->host_free(t.pos);
    t.be->host_free(t.doc_pos);
    if (t.batch_dev) t.be->free(t.batch_dev);
    return rc;
}
