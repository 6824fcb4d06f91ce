/*
 * cuda_profile.h — an opt-in timer of the cuda backend's entries, for finding
 * where a training step's time goes. Information only: nothing reads its
 * numbers but a person.
 *
 * Off unless cuda_profile_enable(1) ran before the first use (`ringscan bench
 * --profile 1`, `ringscan train` with train.cuda_profile: true). Then the
 * table `backend_cuda_profiled` (cuda_backend_table.c) wraps every Backend entry in
 * cuda_profile_begin/cuda_profile_end: two CUDA events on the compute stream
 * (the entry's GPU time, launch gaps inside it included) and the host clock
 * (the time the caller waited: large where an entry synchronises). Off, the
 * plain table `backend_cuda` runs and nothing here is called. On the cuDNN
 * route (cuda_backend_with_cudnn_attention over the profiled table) the two
 * attention entries are timed as attention_cudnn_forward/backward, the calls
 * the route hands to our kernel inside them.
 *
 * cuda_backend_table() picks the table; cuda_profile_reset() forgets what was
 * counted so far (the bench calls it after its warm-up steps);
 * cuda_profile_print(f, steps, step_ms) prints a table sorted by GPU time, per step
 * when steps > 0, with the residue against a measured step when step_ms > 0. When on, the table is also printed to stderr at exit unless
 * cuda_profile_print ran after the last reset.
 *
 * Used by `ringscan bench step` (bench/bench_step.c: per step, after the
 * warm-up) and `ringscan train` (lib/run/train.c: the whole run, printed at exit).
 *
 * Plain C types only, so lib/ can include it without CUDA headers.
 */
#ifndef RS_CUDA_PROFILE_H
#define RS_CUDA_PROFILE_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct Backend;

/* on (1) or off (0, the built-in state); call before the first cuda_backend_table() */
void cuda_profile_enable(int on);
/* 1 when enabled */
int  cuda_profile_on(void);
/* backend_cuda_profiled when the profile is on, else backend_cuda */
const struct Backend *cuda_backend_table(void);
/* starts timing entry `name` (a string literal: its address identifies the entry); returns a token for
 * cuda_profile_end */
int  cuda_profile_begin(const char *name);
void cuda_profile_end(int token);
void cuda_profile_reset(void);
/* synchronises the compute stream, then prints: entry, calls, GPU ms, host ms, share; then the entries'
 * sum. With step_ms > 0 (the measured mean step, host clock, over the same `steps`) the shares are of
 * the step and two more rows follow: "unaccounted (launch gaps, host)" = step_ms - the sum (the time
 * the GPU ran no entry: gaps between launches, host work, waits), and the measured step itself; the
 * rows then add up to the step. step_ms <= 0: shares of the entries' sum. */
void cuda_profile_print(FILE *f, int steps, double step_ms);

#ifdef __cplusplus
}
#endif

#endif
