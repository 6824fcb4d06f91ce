/*
 * test_model_acts.c — the activation table's kept delta-rule buffer against the backends' own size
 * (lib/model/model_acts.c "gdn_kept" against backend.h gdn_kept_bytes). Plan runs without a GPU, so
 * model_acts.c counts each backend's kept format with its own formula; model.c checks the two when a
 * model is built, which for the cuda backend needs a GPU. Here the cuda side is its host arithmetic
 * (cuda_gdn_kept_bytes, no GPU work), so the check runs on any machine the cuda backend is built on:
 * both backends, under every checkpoint.gdn_keep (none: no buffer at all), at several lengths
 * (partial last chunk, context parallelism's two fragments per sample), GQA and head dims 64 / 128.
 */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "config/config.h"
#include "model/model_acts.h"
#include "test_util.h"

/* bytes of layer 0's "gdn_kept" in the table of cfg, or -1 */
static int64_t acts_kept_of(const Config *cfg, int64_t *rows) {
    ActTable t;
    model_acts_build(&t, cfg);
    int64_t bytes = -1;
    for (int i = 0; i < t.n; i++)
        if (t.b[i].layer == 0 && !strcmp(t.b[i].name, "gdn_kept")) {
            bytes = t.b[i].bytes;
            *rows = t.b[i].rows;
        }
    model_acts_free(&t);
    return bytes;
}

static void acts_set(Config *cfg, const char *kv) {
    ConfigErrors e = {0};
    EXPECT(config_apply_set(cfg, kv, 0, &e) == 0, "--set %s refused", kv);
    config_errors_free(&e);
}

static void acts_check_backend(const Backend *be, const char *kind) {
    static const struct { int64_t T; int cp, nk, nv, dk, dv; } shapes[] = {
        {4096, 1, 16, 32, 128, 128}, {4160, 1, 16, 16, 128, 128}, {8192, 2, 8, 16, 64, 128}, {1000, 1, 4, 8, 128, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int keep = 0; keep < GDN_KEEP_COUNT; keep++)
            for (int whole = 0; whole < 2; whole++) { /* layer 0 recomputed (its kept buffer in the scratch), or kept */
                Config cfg;
                config_init_defaults(&cfg);
                char kv[8][96];
                snprintf(kv[0], sizeof kv[0], "device.kind=%s", kind);
                snprintf(kv[1], sizeof kv[1], "data.seq_len=%lld", (long long)shapes[s].T);
                snprintf(kv[2], sizeof kv[2], "parallel.cp=%d", shapes[s].cp);
                snprintf(kv[3], sizeof kv[3], "model.linear_num_key_heads=%d", shapes[s].nk);
                snprintf(kv[4], sizeof kv[4], "model.linear_num_value_heads=%d", shapes[s].nv);
                snprintf(kv[5], sizeof kv[5], "model.linear_key_head_dim=%d", shapes[s].dk);
                snprintf(kv[6], sizeof kv[6], "model.linear_value_head_dim=%d", shapes[s].dv);
                snprintf(kv[7], sizeof kv[7], "checkpoint.gdn_keep=%s", gdn_keep_names[keep]);
                for (int i = 0; i < 8; i++) acts_set(&cfg, kv[i]);
                acts_set(&cfg, "checkpoint.input_rows=chunk"); /* resolved, as plan_resolve gives it */
                acts_set(&cfg, "checkpoint.mlp_act=rewritten");
                char kl[64];
                const long long layers = whole ? (long long)cfg.model.num_hidden_layers : 0;
                snprintf(kl, sizeof kl, "checkpoint.keep_layers=%lld", layers);
                acts_set(&cfg, kl);
                int64_t rows = 0;
                const int64_t got = acts_kept_of(&cfg, &rows);
                const int64_t frags = shapes[s].cp > 1 ? 2 : 1, n = shapes[s].T / shapes[s].cp / frags;
                /* the kind (model_acts_gdn_kept_kind): Tinv kept where the buffer lives in the recompute's scratch */
                const int kept_kind = (keep == GDN_KEEP_STATES ? GDN_KEPT_STATES : 0) |
                                      (keep != GDN_KEEP_NONE && !whole ? GDN_KEPT_TINV : 0);
                const int64_t want = keep == GDN_KEEP_NONE ? -1 /* no buffer */
                                     : frags * (int64_t)be->gdn_kept_bytes(n, shapes[s].nv, shapes[s].dk,
                                                                           shapes[s].dv, kept_kind);
                const int64_t want_rows = keep == GDN_KEEP_NONE ? 0 : frags;
                EXPECT(got == want && rows == want_rows, "%s T=%lld cp=%d nv=%d dk=%d dv=%d gdn_keep %s, layer 0 %s: "
                       "model_acts counts %lld bytes in %lld rows, the backend keeps %lld in %lld", kind,
                       (long long)shapes[s].T, shapes[s].cp, shapes[s].nv, shapes[s].dk, shapes[s].dv,
                       gdn_keep_names[keep], whole ? "kept whole" : "recomputed", (long long)got, (long long)rows,
                       (long long)want, (long long)want_rows);
                if (!strcmp(kind, "cuda") && keep != GDN_KEEP_NONE) /* the cuda kind tells: Tinv, T nv 128 bytes */
                    EXPECT((be->gdn_kept_bytes(n, shapes[s].nv, shapes[s].dk, shapes[s].dv, kept_kind | GDN_KEPT_TINV) >
                            be->gdn_kept_bytes(n, shapes[s].nv, shapes[s].dk, shapes[s].dv,
                                               kept_kind & ~GDN_KEPT_TINV)),
                           "cuda gdn_kept_bytes does not grow with GDN_KEPT_TINV");
                config_free(&cfg);
            }
}

TEST(model_acts_gdn_kept_matches_backends) {
    acts_check_backend(&backend_cpu, "cpu");
#ifdef RS_WITH_CUDA
    acts_check_backend(&backend_cuda, "cuda");
#else
    printf("  (cuda backend not built: its kept size is checked where it is)\n");
#endif
}

/* checkpoint.keep_layers: under remat and full (the KDA layer kind and cp 2 too) the table keeps, for the last N
 * layers, every buffer none keeps, whole (the policy's keep bit on each), the others' as the policy says; the
 * policy's kept bytes and peak grow with N from the policy's own (N = 0) to none's (N = L), the other policies'
 * columns do not move, and the per-layer kept bytes of a kept layer are none's. */
TEST(model_acts_keep_layers_mix_per_layer) {
    static const char *const variants[][2] = {{"model.linear_attention=gdn", "parallel.cp=1"},
                                               {"model.linear_attention=kda", "parallel.cp=1"},
                                               {"model.linear_attention=gdn", "parallel.cp=2"}};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++)
        for (int pol = ACT_POLICY_FULL; pol <= ACT_POLICY_REMAT; pol++) {
            const int L = 8;
            int64_t prev_kept = -1, prev_peak = -1, base_other[ACT_POLICY_COUNT] = {0};
            ActTable none_t;
            for (int n = 0; n <= L; n++) {
                Config cfg;
                config_init_defaults(&cfg);
                char kv[6][64];
                snprintf(kv[0], sizeof kv[0], "model.num_hidden_layers=%d", L);
                snprintf(kv[1], sizeof kv[1], "data.seq_len=4096");
                snprintf(kv[2], sizeof kv[2], "%s", variants[v][0]);
                snprintf(kv[3], sizeof kv[3], "%s", variants[v][1]);
                snprintf(kv[4], sizeof kv[4], "checkpoint.activations=%s", act_policy_names[pol]);
                snprintf(kv[5], sizeof kv[5], "checkpoint.keep_layers=%d", n);
                if (!strcmp(variants[v][0], "model.linear_attention=kda")) {
                    acts_set(&cfg, "model.linear_num_key_heads=32");
                    acts_set(&cfg, "model.linear_num_value_heads=32");
                }
                for (int i = 0; i < 6; i++) acts_set(&cfg, kv[i]);
                acts_set(&cfg, "checkpoint.input_rows=chunk");
                acts_set(&cfg, "checkpoint.mlp_act=kept"); /* a kept layer keeps what none keeps, act too */
                if (n == 0) {
                    Config c = cfg;
                    c.checkpoint.activations = ACT_POLICY_NONE;
                    model_acts_build(&none_t, &c);
                }
                ActTable t;
                model_acts_build(&t, &cfg);
                EXPECT(t.keep_layers == n && t.first_kept == L - n, "keep_layers %d: table says %d from layer %d", n,
                       t.keep_layers, t.first_kept);
                for (int i = 0; i < t.n; i++) {
                    const ActBuffer *b = &t.b[i];
                    if (b->layer < t.first_kept) continue;
                    EXPECT(!(b->keep & ACT_KEEP_NONE) || (b->keep & (1u << pol)),
                           "layer %d %s: kept under none, not under %s with keep_layers %d", b->layer, b->name,
                           act_policy_names[pol], n);
                    if (b->keep & ACT_KEEP_NONE)
                        EXPECT(b->bytes == b->policy_bytes[ACT_POLICY_NONE], "layer %d %s: %lld bytes, none's %lld",
                               b->layer, b->name, (long long)b->bytes, (long long)b->policy_bytes[ACT_POLICY_NONE]);
                }
                EXPECT(t.kept[pol] > prev_kept && t.peak[pol] >= prev_peak, "%s %s keep_layers %d: kept %lld peak %lld "
                       "after %lld, %lld", variants[v][0], act_policy_names[pol], n, (long long)t.kept[pol],
                       (long long)t.peak[pol], (long long)prev_kept, (long long)prev_peak);
                prev_kept = t.kept[pol];
                prev_peak = t.peak[pol];
                for (int q = 0; q < ACT_POLICY_COUNT; q++) {
                    if (q == pol) continue;
                    if (n == 0) base_other[q] = t.kept[q];
                    EXPECT(t.kept[q] == base_other[q], "%s moved with keep_layers %d", act_policy_names[q], n);
                }
                if (n == 0) EXPECT(t.kept[pol] == t.pure_kept, "keep_layers 0 is the policy itself");
                if (n == L)
                    EXPECT(t.kept[pol] == none_t.kept[ACT_POLICY_NONE] && t.peak[pol] == none_t.peak[ACT_POLICY_NONE],
                           "%s %s keep_layers L: kept %lld peak %lld, none's %lld %lld", variants[v][0],
                           act_policy_names[pol], (long long)t.kept[pol], (long long)t.peak[pol],
                           (long long)none_t.kept[ACT_POLICY_NONE], (long long)none_t.peak[ACT_POLICY_NONE]);
                model_acts_free(&t);
                config_free(&cfg);
            }
            model_acts_free(&none_t);
        }
}

/* cfg: the defaults with 4 layers, 4096 tokens, chunks of 512 rows, under policy `pol` */
static void acts_small(Config *cfg, int pol) {
    config_init_defaults(cfg);
    acts_set(cfg, "model.num_hidden_layers=4");
    acts_set(cfg, "data.seq_len=4096");
    acts_set(cfg, "checkpoint.chunk_rows=512");
    char kv[64];
    snprintf(kv, sizeof kv, "checkpoint.activations=%s", act_policy_names[pol]);
    acts_set(cfg, kv);
}

/* checkpoint.input_rows whole: under full and remat every layer's input side (ln1, rstd1, the in_proj outputs,
 * KDA's f) has T rows, not kept (the recompute's scratch, no chunk scratch), and nothing else moves: the kept
 * bytes are chunk's; the recompute transient grows, by at most a layer's input side beyond one chunk; the chunk
 * scratch per row drops by layer 0's (GDN, the wider mixer here) input row; under none the flag changes nothing. */
TEST(model_acts_input_rows_whole) {
    static const char *const inputs[] = {"ln1", "rstd1", "gdn_proj", "kda_f", "attn_proj"};
    static const char *const kinds[] = {"model.linear_attention=gdn", "model.linear_attention=kda"};
    for (size_t v = 0; v < 2; v++)
        for (int pol = 0; pol < ACT_POLICY_COUNT; pol++) {
            ActTable t[2]; /* input_rows chunk, whole */
            for (int w = 0; w < 2; w++) {
                Config cfg;
                acts_small(&cfg, pol);
                acts_set(&cfg, kinds[v]);
                if (v == 1) {
                    acts_set(&cfg, "model.linear_num_key_heads=32");
                    acts_set(&cfg, "model.linear_num_value_heads=32");
                }
                acts_set(&cfg, w ? "checkpoint.input_rows=whole" : "checkpoint.input_rows=chunk");
                acts_set(&cfg, "checkpoint.mlp_act=kept");
                model_acts_build(&t[w], &cfg);
                config_free(&cfg);
            }
            EXPECT(t[0].n == t[1].n && t[0].chunk_rows == 512 && t[1].chunk_rows == 512,
                   "same buffers, 512-row chunks");
            EXPECT(t[1].inputs_whole && !t[0].inputs_whole && model_acts_layer_inputs_whole(&t[1], 0) &&
                   !model_acts_layer_inputs_whole(&t[0], 0) == (pol != ACT_POLICY_NONE), "inputs_whole flags");
            int64_t grow_max = 0, grow[8] = {0}, in_row = 0;
            for (int i = 0; i < t[1].n; i++) {
                const ActBuffer *a = &t[0].b[i], *b = &t[1].b[i];
                int input = 0;
                for (size_t k = 0; k < sizeof inputs / sizeof *inputs; k++) input |= !strcmp(b->name, inputs[k]);
                EXPECT(!strcmp(a->name, b->name) && a->keep == b->keep, "%s: the same buffer, the same keep", b->name);
                if (!input || pol == ACT_POLICY_NONE) {
                    EXPECT(a->bytes == b->bytes && a->rows == b->rows, "%s %s: %lld bytes, chunk's %lld", b->name,
                           act_policy_names[pol], (long long)b->bytes, (long long)a->bytes);
                    continue;
                }
                EXPECT(b->rows == 4096 && a->rows == 512 && !(b->keep & (1u << pol)) && !b->chunk && a->chunk,
                       "%s %s whole: %lld rows (chunk's %lld), kept %d, chunk scratch %d", b->name,
                       act_policy_names[pol], (long long)b->rows, (long long)a->rows, !!(b->keep & (1u << pol)),
                       b->chunk);
                grow[b->layer] += b->bytes - a->bytes;
                if (b->layer == 0) in_row += b->cols * b->elt;
            }
            for (int l = 0; l < 4; l++) grow_max = grow[l] > grow_max ? grow[l] : grow_max;
            for (int q = 0; q < ACT_POLICY_COUNT; q++)
                EXPECT(t[0].kept[q] == t[1].kept[q], "%s: kept bytes move with input_rows", act_policy_names[q]);
            if (pol == ACT_POLICY_NONE) {
                EXPECT(t[0].peak[pol] == t[1].peak[pol], "none: the peak moves with input_rows");
            } else {
                EXPECT(t[1].recompute[pol] > t[0].recompute[pol] &&
                       t[1].recompute[pol] - t[0].recompute[pol] <= grow_max,
                       "%s %s: recompute %lld -> %lld, the input side grows a layer by at most %lld", kinds[v],
                       act_policy_names[pol], (long long)t[0].recompute[pol], (long long)t[1].recompute[pol],
                       (long long)grow_max);
                EXPECT(t[0].chunk_row_bytes - t[1].chunk_row_bytes == in_row, "%s: chunk row %lld -> %lld, not less "
                       "layer 0's input row %lld", kinds[v], (long long)t[0].chunk_row_bytes,
                       (long long)t[1].chunk_row_bytes, (long long)in_row);
            }
            model_acts_free(&t[0]);
            model_acts_free(&t[1]);
        }
}

/* checkpoint.mlp_act rewritten: "mlp_act" is one chunk's rows, never kept, in every layer under every policy (the
 * backward writes it again); kept: a per-token buffer, whole and kept where the layer keeps (none; keep_layers).
 * Kept bytes differ by exactly the kept layers' act rows, T I e each, and nothing else moves. */
TEST(model_acts_mlp_act) {
    for (int pol = 0; pol < ACT_POLICY_COUNT; pol++) {
        ActTable t[2]; /* kept, rewritten */
        for (int r = 0; r < 2; r++) {
            Config cfg;
            acts_small(&cfg, pol);
            acts_set(&cfg, "checkpoint.input_rows=chunk");
            acts_set(&cfg, "checkpoint.keep_layers=1");
            acts_set(&cfg, r ? "checkpoint.mlp_act=rewritten" : "checkpoint.mlp_act=kept");
            model_acts_build(&t[r], &cfg);
            config_free(&cfg);
        }
        int64_t act_rows = 0;
        int kept_layers = 0;
        for (int l = 0; l < 4; l++) kept_layers += model_acts_layer_keeps(&t[0], l);
        for (int i = 0; i < t[1].n; i++) {
            const ActBuffer *a = &t[0].b[i], *b = &t[1].b[i];
            EXPECT(!strcmp(a->name, b->name), "the same buffers in the same order");
            if (strcmp(b->name, "mlp_act")) {
                EXPECT(a->bytes == b->bytes && a->keep == b->keep, "%s: moved with mlp_act", b->name);
                continue;
            }
            const int keeps = model_acts_layer_keeps(&t[0], b->layer);
            EXPECT(model_acts_layer_keeps_act(&t[0], b->layer) == keeps && !model_acts_layer_keeps_act(&t[1], b->layer),
                   "layer %d: keeps_act %d / %d", b->layer, model_acts_layer_keeps_act(&t[0], b->layer),
                   model_acts_layer_keeps_act(&t[1], b->layer));
            EXPECT(b->rows == 512 && b->chunk && !(b->keep & (1u << pol)), "%s layer %d rewritten: %lld rows, kept %d",
                   act_policy_names[pol], b->layer, (long long)b->rows, !!(b->keep & (1u << pol)));
            EXPECT(!!(a->keep & (1u << pol)) == keeps && a->rows == (keeps ? 4096 : 512),
                   "%s layer %d kept: %lld rows, kept %d", act_policy_names[pol], b->layer, (long long)a->rows,
                   !!(a->keep & (1u << pol)));
            if (keeps) {
                EXPECT(a->bytes == 4096 * a->cols * a->elt, "layer %d act: %lld bytes", b->layer, (long long)a->bytes);
                act_rows += a->bytes;
            }
        }
        EXPECT(kept_layers == (pol == ACT_POLICY_NONE ? 4 : 1), "%s: %d kept layers", act_policy_names[pol],
               kept_layers);
        EXPECT(act_rows > 0 && t[0].kept[pol] - t[1].kept[pol] == act_rows,
               "%s: kept %lld vs %lld, the kept layers' act %lld", act_policy_names[pol], (long long)t[0].kept[pol],
               (long long)t[1].kept[pol], (long long)act_rows);
        model_acts_free(&t[0]);
        model_acts_free(&t[1]);
    }
}
