/*
 * runtime_cuda.c — the cuda device runtime (lib/backend/runtime.h DeviceRuntime), registered before main
 * in every binary built with the cuda backend: open binds the rank's GPU and NCCL (comm_cuda_init,
 * comm_nccl.c); backend picks the Backend table for a config: the cuda table (cuda_backend_table.c), its
 * entry timer on with device.profile (cuda_profile.h), and with device.attention_kernel cudnn /
 * cudnn_det cuDNN's fused attention loaded (dlopen) and put in the attention entries for the calls it
 * can take (cuda_attention_cudnn.h). With auto: cuDNN where it loads, our kernel where it does not,
 * said in the line the run prints (backend_attention_resolve, which `ringscan bench step` shares), and
 * the same on every rank: where cuDNN loads on some ranks only, ours everywhere, said with the first
 * lacking rank's reason (one run, one kernel, one line that speaks for all).
 *
 * Callers: lib/backend/runtime.c (through the table); bench/bench_step.c (backend_attention_resolve).
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/runtime.h"
#include "comm/comm.h"
#include "comm_nccl.h"
#include "config/config.h"
#include "core/error.h"
#include "attention/cudnn_graph.h"
#include "cuda_attention_cudnn.h"
#include "cuda_kernels.h"
#include "cuda_setup.h"
#include "cuda_profile.h"

int backend_attention_resolve(int kernel, const char *cudnn_library, char *why, size_t nwhy) {
    if (nwhy) why[0] = '\0';
    if (kernel != ATTN_KERNEL_AUTO) return kernel;
    char err[4096];
    /* cuDNN's nondeterministic backward: its deterministic one keeps a rows x rows x heads matrix (32 GiB at 32k
     * rows, 16 heads), so it fits short calls only; ours is the deterministic choice */
    if (cuda_attention_cudnn_load(cudnn_library, err, sizeof err) == 0) return ATTN_KERNEL_CUDNN;
    snprintf(why, nwhy, "attention: ours, not cuDNN's (device.attention_kernel = auto): %s", err);
    return ATTN_KERNEL_RINGSCAN;
}

/* device.attention_kernel auto across the ranks of comm: k, this rank's resolution, becomes ringscan on every
 * rank when some rank could not load cuDNN (one all-gather of each rank's choice, host and reason), msg then
 * naming how many and the first; otherwise k stays and msg is untouched. */
static int backend_attention_agree(Comm *comm, int k, char *msg, size_t nmsg) {
    typedef struct {
        int32_t ours;
        char    host[64], why[440];
    } Said;
    Said mine = {k == ATTN_KERNEL_RINGSCAN, "", ""}, *all = RS_MALLOC((size_t)comm->world_size * sizeof(Said));
    snprintf(mine.host, sizeof mine.host, "%s", comm->host);
    if (mine.ours) snprintf(mine.why, sizeof mine.why, "%s", msg);
    comm_allgather(comm, comm->world, &mine, all, (int64_t)sizeof(Said));
    int ours = 0, first = -1;
    for (int r = 0; r < comm->world_size; r++)
        if (all[r].ours && ours++ == 0) first = r;
    if (ours > 0 && ours < comm->world_size) {
        snprintf(msg, nmsg, "attention: ours on every rank (device.attention_kernel = auto: one kernel for the "
                 "run), cuDNN did not load on %d of %d ranks; rank %d on %s says: %s", ours, comm->world_size,
                 first, all[first].host, all[first].why);
        k = ATTN_KERNEL_RINGSCAN;
    }
    free(all);
    return k;
}

static const Backend *runtime_cuda_backend(const Config *cfg, Comm *comm, char *msg, size_t nmsg) {
    if (nmsg) msg[0] = '\0';
    cuda_profile_enable(cfg->device.profile);
    const Backend *be = cuda_backend_table();
    const int asked = cfg->device.attention_kernel;
    int k = backend_attention_resolve(asked, cfg->device.cudnn_library, msg, nmsg); /* auto: why not */
    if (asked == ATTN_KERNEL_AUTO && comm && comm->world_size > 1) k = backend_attention_agree(comm, k, msg, nmsg);
    if (k != ATTN_KERNEL_RINGSCAN) {
        char err[4096];
        if (cuda_attention_cudnn_load(cfg->device.cudnn_library, err, sizeof err)) {
            snprintf(msg, nmsg, "device.attention_kernel = %s: %s", attn_kernel_names[asked], err);
            return NULL;
        }
        cuda_attention_cudnn_set_deterministic(k == ATTN_KERNEL_CUDNN_DET);
        be = cuda_backend_with_cudnn_attention(be);
        snprintf(msg, nmsg, "attention: %s where it can take the call, ours elsewhere (device.attention_kernel = %s%s)",
                 cuda_attention_cudnn_describe(), attn_kernel_names[asked],
                 asked == ATTN_KERNEL_AUTO ? ": cudnn, cuDNN loaded" : "");
    }
    return be;
}

static void runtime_cuda_open(Comm *comm) {
    if (comm) comm_cuda_init(comm);
    else cuda_backend_init(0);
}

/* cuDNN's route beside ours (cudnn, cudnn_det; auto counts cudnn's: what it runs where cuDNN loads, which a
 * plan cannot know of the machine that will run the job): cdg_workspace's layout for a backward of rows x
 * rows, the larger of one sequence's and variable length's (packed documents, not cudnn_det, where
 * cdg_varlen_rows_ok and cdg_varlen_backward_ok let the backward through; at the most sequences
 * cdg_varlen_shape does), and for cudnn_det the rows x rows x heads matrix of its deterministic engines
 * (what makes it fit short calls only). cuDNN's own plan workspace is known once its plan is built, and printed
 * then. */
static size_t runtime_cuda_attention_workspace(int kernel, int64_t rows, int nh, int nkv, int hd) {
    if (kernel == ATTN_KERNEL_RINGSCAN || rows <= 0) return 0;
    const int det = kernel == ATTN_KERNEL_CUDNN_DET;
    CdgWorkspace w, v;
    cdg_workspace(&w, rows, rows, nh, nkv, hd, nh * hd, 2 * nkv * hd, 1, det, 0);
    int64_t bytes = w.bytes;
    if (!det && cdg_varlen_rows_ok(rows, nh, nkv) && cdg_varlen_backward_ok(hd)) {
        const int64_t most = 16 * (rows > 4096 ? rows : 4096) / 64; /* batch x smax bound, smax >= 64 */
        /* the model's rows (lib/model/model_block.c): q of nh hd, k and v interleaved in rows of 2 nkv hd */
        cdg_workspace(&v, rows, rows, nh, nkv, hd, nh * hd, 2 * nkv * hd, 1, 0,
                      (int)(most < INT32_MAX ? most : INT32_MAX));
        if (v.bytes > bytes) bytes = v.bytes;
    }
    return (size_t)(bytes + (det ? cdg_det_plan_bytes(rows, rows, nh) : 0));
}

static const BackendSizes runtime_cuda_sizes = {
    .gdn_kept_bytes = cuda_gdn_kept_bytes,
    .gdn_dkept_bytes = cuda_gdn_dkept_bytes,
    .gdn_workspace_bytes = cuda_gdn_workspace_bytes,
    .kda_kept_bytes = cuda_kda_kept_bytes,
    .kda_dkept_bytes = cuda_kda_dkept_bytes,
    .kda_workspace_bytes = cuda_kda_workspace_bytes,
    .attention_workspace_bytes = runtime_cuda_attention_workspace,
};

static const DeviceRuntime runtime_cuda = {
    .name = "cuda", .open = runtime_cuda_open, .backend = runtime_cuda_backend, .sizes = &runtime_cuda_sizes};

__attribute__((constructor)) static void runtime_cuda_register(void) { runtime_register_device(&runtime_cuda); }
