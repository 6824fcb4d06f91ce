/*
 * model_offload.c — checkpoint.offload: host. The kept activations of each layer wait for
 * the backward in host memory, so the device holds two layers' worth instead of all of
 * them.
 *
 * Layout (model.c): a layer's kept buffers are one contiguous range (LayerActs.kept,
 * Model.kept_len[l] bytes); on the device layer l's range lives in slot l % 2 of two
 * slots after the head's buffers; host_arena holds layer l at kept_at[l] (page-locked on
 * cuda: Backend.host_alloc). Layers L-2 and L-1 never leave: nothing overwrites their
 * slots between their forward and their backward, which starts with them.
 *
 * Schedule, on the backend's copy queue (backend.h copyq_*: cuda a copy stream ordered by
 * events, so the copies overlap the compute and the host never waits; cpu memcpy at once):
 *   forward   after layer l's forward its range goes to the host (l < L-2); before block
 *             l writes layer l+1's input x (the first write into slot (l+1) % 2, after
 *             its mixer's core) the compute waits for that slot's copy of layer l-1;
 *   backward  after layer l's backward layer l-2's range comes back into slot l % 2, so it
 *             overlaps layer l-1's backward; before layer l-2's recompute the compute waits
 *             for it.
 * Bytes move and nothing else is computed, so the results are bitwise those without
 * offload (tests/test_long.py). Counters: ModelCounters.offload_bytes_*.
 *
 * Callers: lib/model/model_step.c (stash, fetch, ready), lib/model/model_block.c (claim), model.c
 * (init, free).
 */
#include "model.h"

#include "core/error.h"

static int offload_on(const Model *m) { return m->copyq != NULL; }
/* layer l's range goes to the host and comes back (the last two never leave their slots) */
static int offload_moves(const Model *m, int l) {
    return offload_on(m) && l >= 0 && l < (int)m->cfg->model.num_hidden_layers - 2;
}

void model_offload_init(Model *m) {
    if (m->cfg->checkpoint.offload != OFFLOAD_HOST) return;
    m->copyq = m->be->copyq_create(2);
}

void model_offload_free(Model *m) {
    if (m->copyq) m->be->copyq_destroy(m->copyq);
    m->copyq = NULL;
}

void model_offload_claim(Model *m, int layer) {
    if (offload_on(m)) m->be->copyq_wait(m->copyq, layer % 2);
}

void model_offload_stash(Model *m, int layer) {
    if (!offload_moves(m, layer)) return;
    m->be->copyq_to_host(m->copyq, layer % 2, (char *)m->host_arena + m->kept_at[layer], m->la[layer].kept,
                         (size_t)m->kept_len[layer]);
    m->count.offload_bytes_to_host += m->kept_len[layer];
}

void model_offload_fetch(Model *m, int layer) {
    if (!offload_moves(m, layer)) return;
    m->be->copyq_to_device(m->copyq, layer % 2, m->la[layer].kept, (char *)m->host_arena + m->kept_at[layer],
                           (size_t)m->kept_len[layer]);
    m->count.offload_bytes_to_device += m->kept_len[layer];
}

void model_offload_ready(Model *m, int layer) {
    if (offload_moves(m, layer)) m->be->copyq_wait(m->copyq, layer % 2);
}
