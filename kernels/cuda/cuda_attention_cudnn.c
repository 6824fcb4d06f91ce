/*
 * cuda_attention_cudnn.c — the block attention entries through cuDNN's fused
 * attention (cuda_attention_cudnn.h says when and at what cost): cuDNN loaded
 * with dlopen, kernels/cuda/attention/cudnn_graph.c's graphs lowered into cuDNN backend
 * descriptors (one tensor descriptor per graph tensor, one operation per graph
 * operation, an operation graph, heuristics, the first engine configuration
 * that finalizes), the execution plans kept per graph key, and the per-call
 * route between cuDNN and our kernel (cuda_attention.cu).
 *
 * Every cuDNN call is checked; a failure stops the process with the call, the
 * graph (direction, shape, mask), cuDNN's status and its last error message,
 * so the first run on a GPU says exactly which operation or attribute cuDNN
 * refused.
 */
#include "cuda_attention_cudnn.h"

#include <dlfcn.h>
#include <glob.h>
#include <stdlib.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "attention/cudnn_graph.h"
#include "cuda_cudnn_abi.h"
#include "cuda_kernels.h"
#include "cuda_stream.h"
#include "core/error.h"

static CudnnApi cd;
static void *cd_lib, *cd_handle;
static char cd_desc[1400] = "cuDNN not loaded";
static int cd_det, cd_varlen_bwd_any;
static int64_t cd_counts[4], cd_varlen_counts[2];
static char cd_ctx[256]; /* the graph being built or run, for messages */

/* ---- loading ---- */

static void cd_append(char *log, size_t n, const char *fmt, const char *a, const char *b) {
    size_t used = strlen(log);
    if (used < n) snprintf(log + used, n - used, fmt, a, b);
}

/* the other cuDNN 9 libraries (and NVRTC, for its runtime-compiled engines) from the directory of the one
 * loaded, so that its own loads by name find them there; best effort: returns how many loaded */
static int cd_preload_siblings(const char *lib_path) {
    static const char *const subs[] = {"libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_heuristic.so.9",
                                       "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9",
                                       "libcudnn_adv.so.9", "libcudnn_cnn.so.9"};
    char dir[1024], p[1200];
    snprintf(dir, sizeof dir, "%s", lib_path);
    char *slash = strrchr(dir, '/');
    if (!slash) return 0;
    *slash = 0;
    int ok = 0;
    snprintf(p, sizeof p, "%s/../../cuda_nvrtc/lib/libnvrtc.so*", dir); /* PyTorch's wheel layout */
    glob_t gl;
    if (glob(p, 0, NULL, &gl) == 0) {
        for (size_t i = 0; i < gl.gl_pathc; i++) ok += dlopen(gl.gl_pathv[i], RTLD_NOW | RTLD_GLOBAL) != NULL;
        globfree(&gl);
    }
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
        ok += dlopen(p, RTLD_NOW | RTLD_GLOBAL) != NULL;
    }
    return ok;
}

/* 0 and cd filled, or -1 with the reason appended to log */
static int cd_try(const char *path, char *log, size_t n) {
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        const char *e = dlerror();
        cd_append(log, n, "  %s: %s\n", path, e ? e : "dlopen failed");
        return -1;
    }
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"cudnnGetVersion", (void **)&cd.GetVersion},
        {"cudnnGetErrorString", (void **)&cd.GetErrorString},
        {"cudnnGetLastErrorString", (void **)&cd.GetLastErrorString},
        {"cudnnCreate", (void **)&cd.Create},
        {"cudnnSetStream", (void **)&cd.SetStream},
        {"cudnnBackendCreateDescriptor", (void **)&cd.BackendCreateDescriptor},
        {"cudnnBackendDestroyDescriptor", (void **)&cd.BackendDestroyDescriptor},
        {"cudnnBackendFinalize", (void **)&cd.BackendFinalize},
        {"cudnnBackendSetAttribute", (void **)&cd.BackendSetAttribute},
        {"cudnnBackendGetAttribute", (void **)&cd.BackendGetAttribute},
        {"cudnnBackendExecute", (void **)&cd.BackendExecute},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot) {
            cd_append(log, n, "  %s: no symbol %s (not cuDNN 9?)\n", path, syms[i].name);
            dlclose(h);
            memset(&cd, 0, sizeof cd);
            return -1;
        }
    }
    size_t v = cd.GetVersion();
    if (v / 10000 != 9) {
        char vs[32];
        snprintf(vs, sizeof vs, "%zu", v);
        cd_append(log, n, "  %s: cuDNN version %s, want 9.x\n", path, vs);
        dlclose(h);
        memset(&cd, 0, sizeof cd);
        return -1;
    }
    Dl_info info;
    const char *where = dladdr((void *)cd.GetVersion, &info) && info.dli_fname ? info.dli_fname : path;
    int pre = cd_preload_siblings(where);
    snprintf(cd_desc, sizeof cd_desc, "cuDNN %zu.%zu.%zu (%s; %d sibling libraries preloaded)", v / 10000,
             (v / 100) % 100, v % 100, where, pre);
    cd_lib = h;
    return 0;
}

int cuda_attention_cudnn_load(const char *path, char *err, size_t n) {
    if (cd_lib) return 0;
    char log[4096] = "";
    if (path && path[0]) {
        if (cd_try(path, log, sizeof log) == 0) return 0;
        snprintf(err, n, "cuDNN could not be loaded from the configured path:\n%s", log);
        return -1;
    }
    if (cd_try("libcudnn.so.9", log, sizeof log) == 0) return 0;
    static const char *const globs[] = {
        "/opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/local/lib/python3*/dist-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/local/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/lib/python3/dist-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/local/cuda/lib64/libcudnn.so.9",
    };
    for (size_t i = 0; i < sizeof globs / sizeof globs[0]; i++) {
        glob_t gl;
        if (glob(globs[i], 0, NULL, &gl) != 0) {
            cd_append(log, sizeof log, "  %s: no such file%s\n", globs[i], "");
            continue;
        }
        for (size_t j = 0; j < gl.gl_pathc; j++)
            if (cd_try(gl.gl_pathv[j], log, sizeof log) == 0) {
                globfree(&gl);
                return 0;
            }
        globfree(&gl);
    }
    snprintf(err, n,
             "cuDNN 9 could not be loaded; tried:\n%s  hint: set device.cudnn_library (bench: --cudnn-lib) to the "
             "path of libcudnn.so.9, e.g. PyTorch's .../site-packages/nvidia/cudnn/lib/libcudnn.so.9",
             log);
    return -1;
}

const char *cuda_attention_cudnn_describe(void) { return cd_desc; }

void cuda_attention_cudnn_set_deterministic(int on) { cd_det = on != 0; }

void cuda_attention_cudnn_probe_varlen_backward(int on) { cd_varlen_bwd_any = on != 0; }

void cuda_attention_cudnn_counts(int64_t counts[4]) { memcpy(counts, cd_counts, sizeof cd_counts); }

void cuda_attention_cudnn_varlen_counts(int64_t counts[2]) {
    memcpy(counts, cd_varlen_counts, sizeof cd_varlen_counts);
}

/* ---- checked calls ---- */

static noreturn void cd_fail(int st, const char *what) {
    char last[2048] = "";
    cd.GetLastErrorString(last, sizeof last);
    RS_FATAL("cuDNN: %s failed: %s (status %d)\n  graph: %s%s%s", what, cd.GetErrorString(st), st, cd_ctx,
             last[0] ? "\n  cuDNN says: " : "", last);
}

#define CD(call, what)                                    \
    do {                                                  \
        int st_ = (call);                                 \
        if (st_ != CDA_STATUS_SUCCESS) cd_fail(st_, what); \
    } while (0)

/* ---- plans ---- */

enum { CD_MAX_DESCS = CDG_MAX_TENSORS + 3 * CDG_MAX_OPS + 160, CD_MAX_CFGS = 64 };

typedef struct {
    CdgKey key;
    void *plan;
    int64_t ws;     /* the plan's workspace bytes */
    void *descs[CD_MAX_DESCS]; /* every descriptor of the plan, kept alive with it */
    int ndesc;
} CdPlan;

static CdPlan **cd_plans;
static int cd_nplans;

static void *cd_new(CdPlan *p, int type, const char *what) {
    void *d = NULL;
    CD(cd.BackendCreateDescriptor(type, &d), what);
    RS_CHECK(p->ndesc < CD_MAX_DESCS, "cuDNN plan: more than %d descriptors", CD_MAX_DESCS);
    p->descs[p->ndesc++] = d;
    return d;
}

static void cd_set(void *d, int name, int type, int64_t count, const void *v, const char *what) {
    CD(cd.BackendSetAttribute(d, name, type, count, v), what);
}

/* tensor i of g; its ragged offsets (variable length) name a tensor lowered before it, in tens */
static void *cd_lower_tensor(CdPlan *p, const CdgGraph *g, int i, void *const *tens) {
    const CdgTensor *t = &g->t[i];
    char what[160];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    void *d = cd_new(p, CDA_BACKEND_TENSOR_DESCRIPTOR, what);
    int32_t dtype = t->dtype;
    int64_t align = 16, uid = t->uid;
    bool yes = true;
    cd_set(d, CDA_ATTR_TENSOR_DATA_TYPE, CDA_TYPE_DATA_TYPE, 1, &dtype, what);
    cd_set(d, CDA_ATTR_TENSOR_DIMENSIONS, CDA_TYPE_INT64, 4, t->dim, what);
    cd_set(d, CDA_ATTR_TENSOR_STRIDES, CDA_TYPE_INT64, 4, t->stride, what);
    cd_set(d, CDA_ATTR_TENSOR_UNIQUE_ID, CDA_TYPE_INT64, 1, &uid, what);
    cd_set(d, CDA_ATTR_TENSOR_BYTE_ALIGNMENT, CDA_TYPE_INT64, 1, &align, what);
    if (t->is_virtual) cd_set(d, CDA_ATTR_TENSOR_IS_VIRTUAL, CDA_TYPE_BOOLEAN, 1, &yes, what);
    if (t->by_value) cd_set(d, CDA_ATTR_TENSOR_IS_BY_VALUE, CDA_TYPE_BOOLEAN, 1, &yes, what);
    if (t->ragged_uid) {
        const int r = cdg_find(g, t->ragged_uid);
        RS_CHECK(r >= 0 && r < i, "cuDNN attention graph: tensor '%s' before its ragged offsets", t->name);
        cd_set(d, CDA_ATTR_TENSOR_RAGGED_OFFSET_DESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[r], what);
    }
    CD(cd.BackendFinalize(d), what);
    return d;
}

static void *cd_lower_op(CdPlan *p, const CdgOp *o, void *const *tens) {
    char what[160];
    snprintf(what, sizeof what, "operation '%s'", o->name);
    int32_t comp = o->comp, mode = o->mode;
    void *op = NULL;
    switch (o->kind) {
    case CDG_POINTWISE: {
        void *pw = cd_new(p, CDA_BACKEND_POINTWISE_DESCRIPTOR, what);
        cd_set(pw, CDA_ATTR_POINTWISE_MODE, CDA_TYPE_POINTWISE_MODE, 1, &mode, what);
        cd_set(pw, CDA_ATTR_POINTWISE_MATH_PREC, CDA_TYPE_DATA_TYPE, 1, &comp, what);
        if (o->mode == CDA_POINTWISE_GEN_INDEX) cd_set(pw, CDA_ATTR_POINTWISE_AXIS, CDA_TYPE_INT64, 1, &o->axis, what);
        CD(cd.BackendFinalize(pw), what);
        op = cd_new(p, CDA_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
        cd_set(op, CDA_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &pw, what);
        cd_set(op, CDA_ATTR_OPERATION_POINTWISE_XDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->x], what);
        if (o->b >= 0) cd_set(op, CDA_ATTR_OPERATION_POINTWISE_BDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->b], what);
        if (o->t >= 0) cd_set(op, CDA_ATTR_OPERATION_POINTWISE_TDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->t], what);
        cd_set(op, CDA_ATTR_OPERATION_POINTWISE_YDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->y], what);
        break;
    }
    case CDG_MATMUL: {
        void *mm = cd_new(p, CDA_BACKEND_MATMUL_DESCRIPTOR, what);
        cd_set(mm, CDA_ATTR_MATMUL_COMP_TYPE, CDA_TYPE_DATA_TYPE, 1, &comp, what);
        CD(cd.BackendFinalize(mm), what);
        op = cd_new(p, CDA_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
        cd_set(op, CDA_ATTR_OPERATION_MATMUL_ADESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->x], what);
        cd_set(op, CDA_ATTR_OPERATION_MATMUL_BDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->b], what);
        cd_set(op, CDA_ATTR_OPERATION_MATMUL_CDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->y], what);
        cd_set(op, CDA_ATTR_OPERATION_MATMUL_DESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &mm, what);
        if (o->mo >= 0)
            cd_set(op, CDA_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->mo], what);
        if (o->no >= 0)
            cd_set(op, CDA_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->no], what);
        if (o->ko >= 0)
            cd_set(op, CDA_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->ko], what);
        break;
    }
    case CDG_REDUCTION: {
        void *rd = cd_new(p, CDA_BACKEND_REDUCTION_DESCRIPTOR, what);
        cd_set(rd, CDA_ATTR_REDUCTION_OPERATOR, CDA_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what);
        cd_set(rd, CDA_ATTR_REDUCTION_COMP_TYPE, CDA_TYPE_DATA_TYPE, 1, &comp, what);
        CD(cd.BackendFinalize(rd), what);
        op = cd_new(p, CDA_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
        cd_set(op, CDA_ATTR_OPERATION_REDUCTION_XDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->x], what);
        cd_set(op, CDA_ATTR_OPERATION_REDUCTION_YDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->y], what);
        cd_set(op, CDA_ATTR_OPERATION_REDUCTION_DESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &rd, what);
        break;
    }
    case CDG_RESHAPE:
        op = cd_new(p, CDA_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
        cd_set(op, CDA_ATTR_OPERATION_RESHAPE_XDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->x], what);
        cd_set(op, CDA_ATTR_OPERATION_RESHAPE_YDESC, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &tens[o->y], what);
        break;
    }
    CD(cd.BackendFinalize(op), what);
    return op;
}

/* 1 when the configuration's engine carries the NONDETERMINISTIC note, 0 when not, -1 unknown */
static int cd_cfg_nondet(CdPlan *p, void *cfg) {
    void *eng = NULL;
    int64_t cnt = 0;
    int32_t notes[32];
    if (cd.BackendCreateDescriptor(CDA_BACKEND_ENGINE_DESCRIPTOR, &eng) != CDA_STATUS_SUCCESS) return -1;
    int r = -1;
    if (cd.BackendGetAttribute(cfg, CDA_ATTR_ENGINECFG_ENGINE, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &cnt, &eng) ==
            CDA_STATUS_SUCCESS &&
        cd.BackendGetAttribute(eng, CDA_ATTR_ENGINE_NUMERICAL_NOTE, CDA_TYPE_NUMERICAL_NOTE, 32, &cnt, notes) ==
            CDA_STATUS_SUCCESS) {
        r = 0;
        for (int64_t i = 0; i < cnt && i < 32; i++) r |= notes[i] == CDA_NUMERICAL_NOTE_NONDETERMINISTIC;
    }
    cd.BackendDestroyDescriptor(eng);
    (void)p;
    return r;
}

static void cd_build(CdPlan *p) {
    CdgGraph g;
    cdg_build(&g, &p->key);
    char err[256];
    RS_CHECK(cdg_check(&g, err, sizeof err) == 0, "cuDNN attention graph: %s", err);
    if (!cd_handle) CD(cd.Create(&cd_handle), "cudnnCreate");
    void *tens[CDG_MAX_TENSORS], *ops[CDG_MAX_OPS];
    for (int i = 0; i < g.nt; i++) tens[i] = cd_lower_tensor(p, &g, i, tens);
    for (int i = 0; i < g.nop; i++) ops[i] = cd_lower_op(p, &g.op[i], tens);
    void *graph = cd_new(p, CDA_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    cd_set(graph, CDA_ATTR_OPERATIONGRAPH_HANDLE, CDA_TYPE_HANDLE, 1, &cd_handle, "operation graph handle");
    cd_set(graph, CDA_ATTR_OPERATIONGRAPH_OPS, CDA_TYPE_BACKEND_DESCRIPTOR, g.nop, ops, "operation graph ops");
    CD(cd.BackendFinalize(graph), "operation graph (cuDNN found no fusion pattern for it)");

    /* a deterministic backward's engines may ask a workspace of Tq Tk nh 2 bytes (kernels/cuda/attention/cudnn_graph.h
     * cdg_det_plan_bytes): a plan whose workspace cannot be allocated now is passed over, and if none is left the
     * message names the smallest one asked against the room there is */
    const int64_t room = p->key.bwd && p->key.deterministic ? (int64_t)cuda_cudnn_workspace_room() : -1;
    int64_t smallest_ws = -1;
    int tried = 0, skipped_nondet = 0, skipped_ws = 0, last_st = 0;
    char last_msg[1024] = "";
    static const int32_t modes[2] = {CDA_HEUR_MODE_A, CDA_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2 && !p->plan; m++) {
        void *heur = cd_new(p, CDA_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
        cd_set(heur, CDA_ATTR_ENGINEHEUR_OPERATION_GRAPH, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristics graph");
        cd_set(heur, CDA_ATTR_ENGINEHEUR_MODE, CDA_TYPE_HEUR_MODE, 1, &modes[m], "heuristics mode");
        CD(cd.BackendFinalize(heur), "heuristics");
        int64_t count = 0;
        CD(cd.BackendGetAttribute(heur, CDA_ATTR_ENGINEHEUR_RESULTS, CDA_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL),
           "heuristics result count");
        if (count > CD_MAX_CFGS) count = CD_MAX_CFGS;
        void *cfgs[CD_MAX_CFGS];
        for (int64_t i = 0; i < count; i++) cfgs[i] = cd_new(p, CDA_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
        int64_t got = 0;
        if (count)
            CD(cd.BackendGetAttribute(heur, CDA_ATTR_ENGINEHEUR_RESULTS, CDA_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs),
               "heuristics results");
        for (int64_t i = 0; i < got && !p->plan; i++) {
            int nondet = cd_cfg_nondet(p, cfgs[i]);
            if (p->key.bwd && p->key.deterministic && nondet == 1) {
                skipped_nondet++;
                continue;
            }
            void *plan = NULL;
            CD(cd.BackendCreateDescriptor(CDA_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan), "execution plan");
            cd_set(plan, CDA_ATTR_EXECUTION_PLAN_HANDLE, CDA_TYPE_HANDLE, 1, &cd_handle, "plan handle");
            cd_set(plan, CDA_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CDA_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i], "plan config");
            tried++;
            int st = cd.BackendFinalize(plan);
            if (st != CDA_STATUS_SUCCESS) {
                last_st = st;
                cd.GetLastErrorString(last_msg, sizeof last_msg);
                cd.BackendDestroyDescriptor(plan);
                continue;
            }
            int64_t n = 0, ws = 0;
            CD(cd.BackendGetAttribute(plan, CDA_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CDA_TYPE_INT64, 1, &n, &ws),
               "plan workspace size");
            if (room >= 0 && ws > room) {
                if (smallest_ws < 0 || ws < smallest_ws) smallest_ws = ws;
                skipped_ws++;
                cd.BackendDestroyDescriptor(plan);
                continue;
            }
            p->ws = ws;
            RS_CHECK(p->ndesc < CD_MAX_DESCS, "cuDNN plan: too many descriptors");
            p->descs[p->ndesc++] = plan;
            p->plan = plan;
            printf("cuDNN attention plan: %s: engine config %lld of %lld (%s heuristics), workspace %.1f MiB, "
                   "nondeterministic note %s\n",
                   cd_ctx, (long long)i + 1, (long long)got, m ? "fallback" : "mode A", p->ws / 1048576.0,
                   nondet < 0 ? "unknown" : nondet ? "yes" : "no");
        }
    }
    if (!p->plan && skipped_ws)
        RS_FATAL("cuDNN's deterministic attention backward (device.attention_kernel = cudnn_det) does not fit this GPU: "
                 "its %d finalized engine configuration(s) ask a workspace of at least %.0f MiB, %.0f MiB could be "
                 "allocated (cuDNN keeps a rows x rows x heads matrix: %lld x %lld x %d here)\n  graph: %s\n  use "
                 "device.attention_kernel: ringscan (ours, deterministic) or cudnn (cuDNN's faster, nondeterministic "
                 "backward); `ringscan plan` counts cudnn_det's workspace",
                 skipped_ws, smallest_ws / 1048576.0, room / 1048576.0, (long long)p->key.Tq, (long long)p->key.Tk,
                 p->key.nh, cd_ctx);
    if (!p->plan)
        RS_FATAL("cuDNN: no engine configuration of the attention graph finalized (%d tried, %d skipped as "
                 "nondeterministic)\n  graph: %s\n  last status: %s%s%s",
                 tried, skipped_nondet, cd_ctx, last_st ? cd.GetErrorString(last_st) : "-",
                 last_msg[0] ? "\n  cuDNN says: " : "", last_msg);
}

void cuda_attention_cudnn_lower_only(const void *key) {
    const CdgKey *k = key;
    RS_CHECK(cd_lib, "cuda_attention_cudnn_lower_only: cuDNN is not loaded");
    CdgGraph g;
    cdg_build(&g, k);
    char err[256];
    RS_CHECK(cdg_check(&g, err, sizeof err) == 0, "cuDNN attention graph: %s", err);
    CdPlan *p = RS_CALLOC(1, sizeof *p);
    snprintf(cd_ctx, sizeof cd_ctx, "lowering only: %s%s%s, %d/%d/%d", k->bwd ? "backward" : "forward",
             k->causal ? " causal" : "", k->batch ? " variable length" : "", k->nh, k->nkv, k->hd);
    void *tens[CDG_MAX_TENSORS];
    for (int i = 0; i < g.nt; i++) tens[i] = cd_lower_tensor(p, &g, i, tens);
    for (int i = 0; i < g.nop; i++) cd_lower_op(p, &g.op[i], tens);
    for (int i = p->ndesc - 1; i >= 0; i--) cd.BackendDestroyDescriptor(p->descs[i]);
    free(p);
}

static CdPlan *cd_plan(const CdgKey *k) {
    for (int i = 0; i < cd_nplans; i++)
        if (!memcmp(&cd_plans[i]->key, k, sizeof *k)) return cd_plans[i];
    CdPlan *p = RS_CALLOC(1, sizeof *p);
    p->key = *k;
    cd_build(p);
    cd_plans = RS_REALLOC(cd_plans, (size_t)(cd_nplans + 1) * sizeof *cd_plans);
    cd_plans[cd_nplans++] = p;
    return p;
}

/* ---- execution ---- */

static size_t cd_align(size_t n) { return (n + 255) & ~(size_t)255; }

static void cd_execute(const CdPlan *p, int n, int64_t *uids, void **ptrs, void *ws) {
    void *vp = NULL;
    CD(cd.BackendCreateDescriptor(CDA_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp), "variant pack");
    CD(cd.BackendSetAttribute(vp, CDA_ATTR_VARIANT_PACK_UNIQUE_IDS, CDA_TYPE_INT64, n, uids), "variant pack uids");
    CD(cd.BackendSetAttribute(vp, CDA_ATTR_VARIANT_PACK_DATA_POINTERS, CDA_TYPE_VOID_PTR, n, ptrs),
       "variant pack pointers");
    CD(cd.BackendSetAttribute(vp, CDA_ATTR_VARIANT_PACK_WORKSPACE, CDA_TYPE_VOID_PTR, 1, &ws), "variant pack workspace");
    CD(cd.BackendFinalize(vp), "variant pack");
    CD(cd.SetStream(cd_handle, (void *)cuda_stream()), "cudnnSetStream");
    CD(cd.BackendExecute(cd_handle, p->plan, vp), "execute");
    cd.BackendDestroyDescriptor(vp);
}

static int cd_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* the route of this call, from the caller's hint (lib/backend/attn_hint.h; never read back from the device); the
 * hint's check against the rows is queued on the GPU (a difference stops the run where the host next waits) */
static CdgRoute cd_route(const char *entry, int bwd, const AttnHint *hint, const int32_t *pos_q,
                         const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, int64_t Tq,
                         int64_t Tk, int nh, int nkv, int hd, int causal) {
    RS_CHECK(cd_lib, "cuDNN attention called but cuDNN is not loaded (cuda_attention_cudnn_load)");
    RS_CHECK(hint, "%s through cuDNN needs the caller's AttnHint (lib/backend/attn_hint.h attn_hint_rows over the call's "
                   "host pos/doc_pos): the route is never read back from the device", entry);
    if (Tq < 1 || Tk < 1) return CDG_ROUTE_OURS;
    cuda_cudnn_hint_check(hint, pos_q, doc_pos_q, Tq, pos_k, doc_pos_k, Tk);
    const CdgRoute r = cdg_route(hint, Tq, Tk, nh, nkv, hd, causal, NULL);
    /* cudnn_det keeps packed documents on ours (deterministic too; cuDNN's deterministic variable-length
     * backward would keep a batch x rows x rows x heads matrix); the variable-length backward runs on cuDNN at
     * head dims <= 128 only (cdg_varlen_backward_ok: wrong at hd 256 on cuDNN 9.14), ours beyond, taking the
     * forward's LSE as it is. cd_varlen_bwd_any (a test's probe) sends every head dim to cuDNN. */
    return r == CDG_ROUTE_VARLEN && (cd_det || (bwd && !cd_varlen_bwd_any && !cdg_varlen_backward_ok(hd)))
               ? CDG_ROUTE_OURS
               : r;
}

/* batch 0: one sequence of Tq x Tk; > 0: variable length, batch sequences of at most Tq = Tk rows */
static CdgKey cd_key(int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal, int bwd,
                     int batch) {
    CdgKey k;
    memset(&k, 0, sizeof k); /* the key is compared with memcmp, padding included */
    k.Tq = Tq, k.Tk = Tk, k.nh = nh, k.nkv = nkv, k.hd = hd, k.ldq = ldq, k.ldk = ldk, k.ldo = ldo;
    k.causal = causal, k.bwd = bwd, k.deterministic = bwd && cd_det, k.batch = batch;
    char vl[96] = "";
    if (batch) snprintf(vl, sizeof vl, ", variable length: %d sequences of at most %lld rows, ragged", batch,
                        (long long)Tq);
    snprintf(cd_ctx, sizeof cd_ctx, "%s%s, Tq %lld, Tk %lld, heads %d/%d/%d, ld q %d k|v %d out %d, %s%s",
             bwd ? "backward" : "forward", bwd ? (cd_det ? " (deterministic)" : " (dq accumulator)") : "",
             (long long)Tq, (long long)Tk, nh, nkv, hd, ldq, ldk, ldo, causal ? "top-left causal" : "all keys", vl);
    return k;
}

/* variable length: the plan's key from the hint's buckets, the workspace carved, and the lengths and offsets
 * of the call's rows queued (cuda_cudnn_varlen_rows); uids/ptrs get the lengths and offsets, n counts them */
static CdgKey cd_varlen_prepare(const AttnHint *hint, const int32_t *pos, const int32_t *doc_pos, int64_t T, int nh,
                                int nkv, int hd, int ldq, int ldk, int ldo, int bwd, CdPlan **plan, CdgWorkspace *w,
                                char **own, char **ws, int64_t *uids, void **ptrs, int *n) {
    int32_t batch;
    int64_t smax;
    RS_CHECK(cdg_varlen_shape(hint, T, &batch, &smax) == 0, "cuDNN variable length: no buckets for %lld rows",
             (long long)T);
    CdgKey key = cd_key(smax, smax, nh, nkv, hd, ldq, ldk, ldo, 1, bwd, batch);
    *plan = cd_plan(&key);
    cdg_workspace(w, T, T, nh, nkv, hd, ldq, ldk, bwd, key.deterministic, batch);
    const size_t base = cd_align((size_t)(*plan)->ws); /* cuDNN's part first, then ours */
    *ws = cuda_cudnn_workspace(base + (size_t)w->bytes);
    *own = *ws + base;
    int64_t mult[CDG_NOFF];
    int64_t *off[CDG_NOFF];
    const int noff = CDG_NOFF;
    cdg_varlen_mults(mult, &key);
    for (int i = 0; i < noff; i++) off[i] = (int64_t *)(*own + w->off[i]);
    int32_t *seq = (int32_t *)(*own + w->seq);
    cuda_cudnn_varlen_rows(seq, off, mult, noff, pos, doc_pos, T, batch, smax);
    uids[*n] = CDG_UID_SEQ_Q, ptrs[(*n)++] = seq;
    uids[*n] = CDG_UID_SEQ_KV, ptrs[(*n)++] = seq;
    for (int i = 0; i < noff; i++) uids[*n] = CDG_UID_OFF_Q + i, ptrs[(*n)++] = off[i];
    return key;
}

void cuda_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                  const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k,
                                  const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh,
                                  int nkv, int hd, int ldq, int ldk, int ldo, int causal) {
    CdgRoute r = cd_route("attention_forward", 0, hint, pos_q, doc_pos_q, pos_k, doc_pos_k, Tq, Tk, nh, nkv, hd, causal);
    if (r == CDG_ROUTE_OURS || !cd_aligned16(out) || !cd_aligned16(q) || !cd_aligned16(k) || !cd_aligned16(v)) {
        cd_counts[1]++;
        cuda_attention_forward(out, lse, q, k, v, pos_q, doc_pos_q, pos_k, doc_pos_k, hint, Tq, Tk, nh, nkv, hd, ldq,
                               ldk, ldo, causal);
        return;
    }
    if (r == CDG_ROUTE_VARLEN) {
        CdPlan *p;
        CdgWorkspace w;
        char *own, *ws;
        int64_t uids[16];
        void *ptrs[16];
        int n = 0;
        cd_varlen_prepare(hint, pos_q, doc_pos_q, Tq, nh, nkv, hd, ldq, ldk, ldo, 0, &p, &w, &own, &ws, uids, ptrs, &n);
        float scale = 1.0f / sqrtf((float)hd), neg_inf = -INFINITY;
        float *stats = (float *)(own + w.stats); /* (Tq, nh): our lse's layout */
        const int64_t u[7] = {CDG_UID_Q, CDG_UID_K, CDG_UID_V, CDG_UID_O, CDG_UID_STATS, CDG_UID_SCALE, CDG_UID_NEG_INF};
        void *const pp[7] = {(void *)q, (void *)k, (void *)v, out, stats, &scale, &neg_inf};
        for (int i = 0; i < 7; i++) uids[n] = u[i], ptrs[n++] = pp[i];
        cd_execute(p, n, uids, ptrs, ws);
        cuda_cudnn_copy_f32(lse, stats, Tq * nh);
        cd_counts[0]++, cd_varlen_counts[0]++;
        return;
    }
    CdgKey key = cd_key(Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, r == CDG_ROUTE_CAUSAL, 0, 0);
    CdPlan *p = cd_plan(&key);
    CdgWorkspace w;
    cdg_workspace(&w, Tq, Tk, nh, nkv, hd, ldq, ldk, 0, 0, 0);
    const size_t base = cd_align((size_t)p->ws); /* cuDNN's part first, then ours */
    char *ws = cuda_cudnn_workspace(base + (size_t)w.bytes), *own = ws + base;
    float *stats = (float *)(own + w.stats);
    float scale = 1.0f / sqrtf((float)hd), neg_inf = -INFINITY;
    int64_t uids[7] = {CDG_UID_Q, CDG_UID_K, CDG_UID_V, CDG_UID_O, CDG_UID_STATS, CDG_UID_SCALE, CDG_UID_NEG_INF};
    void *ptrs[7] = {(void *)q, (void *)k, (void *)v, out, stats, &scale, &neg_inf};
    cd_execute(p, key.causal ? 7 : 6, uids, ptrs, ws);
    cuda_cudnn_stats_to_lse(lse, stats, Tq, nh);
    cd_counts[0]++;
}

void cuda_attention_cudnn_backward(float *dq, float *dk, float *dv, const void *dout, const void *out,
                                   const float *lse, const void *q, const void *k, const void *v,
                                   const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k,
                                   const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh,
                                   int nkv, int hd, int ldq, int ldk, int ldo, int causal) {
    CdgRoute r =
        cd_route("attention_backward", 1, hint, pos_q, doc_pos_q, pos_k, doc_pos_k, Tq, Tk, nh, nkv, hd, causal);
    /* variable length: dk and dv interleaved in the workspace as k and v are (cdg_workspace): v must be k's rows'
     * second half */
    if (r == CDG_ROUTE_VARLEN && ((const char *)v - (const char *)k != (ptrdiff_t)nkv * hd * 2 || ldk < 2 * nkv * hd))
        r = CDG_ROUTE_OURS;
    if (r == CDG_ROUTE_OURS || !cd_aligned16(dout) || !cd_aligned16(out) || !cd_aligned16(q) || !cd_aligned16(k) ||
        !cd_aligned16(v)) {
        cd_counts[3]++;
        cuda_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, pos_q, doc_pos_q, pos_k, doc_pos_k, hint, Tq, Tk,
                                nh, nkv, hd, ldq, ldk, ldo, causal);
        return;
    }
    const int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd;
    if (r == CDG_ROUTE_VARLEN) {
        CdPlan *p;
        CdgWorkspace w;
        char *own, *ws;
        int64_t uids[32];
        void *ptrs[32];
        int n = 0;
        CdgKey key = cd_varlen_prepare(hint, pos_q, doc_pos_q, Tq, nh, nkv, hd, ldq, ldk, ldo, 1, &p, &w, &own, &ws,
                                       uids, ptrs, &n);
        RS_CHECK(!key.deterministic, "cuDNN variable length: a deterministic backward (cudnn_det runs ours)");
        cuda_cudnn_copy_f32((float *)(own + w.stats), lse, Tq * nh); /* (Tq, nh) both */
        float scale = 1.0f / sqrtf((float)hd), one = 1.0f, neg_inf = -INFINITY;
        const int64_t u[14] = {CDG_UID_Q,  CDG_UID_K,     CDG_UID_V,     CDG_UID_O,   CDG_UID_DO,
                               CDG_UID_STATS, CDG_UID_DQ, CDG_UID_DK,    CDG_UID_DV,  CDG_UID_SCALE,
                               CDG_UID_ONE, CDG_UID_SOFTMAX_SUM, CDG_UID_DQ_ACCUM, CDG_UID_NEG_INF};
        void *const pp[14] = {(void *)q,       (void *)k,    (void *)v,    (void *)out, (void *)dout,
                              own + w.stats,   own + w.dq,   own + w.dk,   own + w.dv,  &scale,
                              &one,            own + w.softmax_sum, own + w.dq_accum, &neg_inf};
        for (int i = 0; i < 14; i++) uids[n] = u[i], ptrs[n++] = pp[i];
        if (nh != nkv) {
            uids[n] = CDG_UID_DK_FULL, ptrs[n++] = own + w.dk_full;
            uids[n] = CDG_UID_DV_FULL, ptrs[n++] = own + w.dv_full;
        }
        cd_execute(p, n, uids, ptrs, ws);
        /* the gradients in their inputs' row strides (cudnn_graph.h) */
        cuda_cudnn_add_bf16(dq, own + w.dq, Tq, (int)qd, ldq, ldq);
        cuda_cudnn_add_bf16(dk, own + w.dk, Tk, (int)kvd, ldk, ldk);
        cuda_cudnn_add_bf16(dv, own + w.dv, Tk, (int)kvd, ldk, ldk);
        cd_counts[2]++, cd_varlen_counts[1]++;
        return;
    }
    CdgKey key = cd_key(Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, r == CDG_ROUTE_CAUSAL, 1, 0);
    CdPlan *p = cd_plan(&key);
    CdgWorkspace w;
    cdg_workspace(&w, Tq, Tk, nh, nkv, hd, ldq, ldk, 1, key.deterministic, 0);
    const size_t base = cd_align((size_t)p->ws); /* cuDNN's part first, then ours */
    char *ws = cuda_cudnn_workspace(base + (size_t)w.bytes), *own = ws + base;
    cuda_cudnn_lse_to_stats((float *)(own + w.stats), lse, Tq, nh);
    float scale = 1.0f / sqrtf((float)hd), one = 1.0f, neg_inf = -INFINITY;
    int64_t uids[14] = {CDG_UID_Q, CDG_UID_K, CDG_UID_V, CDG_UID_O, CDG_UID_DO, CDG_UID_STATS, CDG_UID_DQ,
                        CDG_UID_DK, CDG_UID_DV, CDG_UID_SCALE, CDG_UID_ONE, CDG_UID_SOFTMAX_SUM};
    void *ptrs[14] = {(void *)q, (void *)k, (void *)v, (void *)out, (void *)dout, own + w.stats, own + w.dq,
                      own + w.dk, own + w.dv, &scale, &one, own + w.softmax_sum};
    int n = 12;
    if (!key.deterministic) uids[n] = CDG_UID_DQ_ACCUM, ptrs[n++] = own + w.dq_accum;
    if (key.causal) uids[n] = CDG_UID_NEG_INF, ptrs[n++] = &neg_inf;
    cd_execute(p, n, uids, ptrs, ws);
    cuda_cudnn_add_bf16(dq, own + w.dq, Tq, (int)qd, ldq, (int)qd);
    cuda_cudnn_add_bf16(dk, own + w.dk, Tk, (int)kvd, ldk, (int)kvd);
    cuda_cudnn_add_bf16(dv, own + w.dv, Tk, (int)kvd, ldk, (int)kvd);
    cd_counts[2]++;
}
