/* The stream-order checker and the vector clocks it reads.
 *
 * Each stream keeps a clock: for every other stream, the highest ticket that
 * work enqueued on it from now on is ordered after. stream_wait_event joins
 * the event's clock (the recorder's clock at record time, plus the record's
 * own ticket) into the waiter's, so edges are transitive through events.
 * check_handout(p, size, s) then flags any unfinished kernel op on another
 * stream u that touches the range while s's clock does not cover its ticket:
 * the memory would be used by s while u may still use it.
 *
 * Called by driver/host.c (check_handout) and sim/stream.c and sim/event.c (clock updates),
 * with the simulator lock held.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "sim.h"

uint64_t sa_sim_clock_get(const sa_sim_clock *c, uint64_t sid) {
  size_t lo = 0, hi = c->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->v[mid].sid < sid) lo = mid + 1;
    else hi = mid;
  }
  return lo < c->n && c->v[lo].sid == sid ? c->v[lo].ticket : 0;
}

/* 1 if the entry still orders something: its stream lives and has not
 * completed that ticket (the checker skips completed work anyway). */
static int pending(const sa_sim_tick *t) {
  const sa_sim_stream *u = sa_sim_stream_at(t->slot);
  return u != NULL && u->sid == t->sid && u->completed < t->ticket;
}

static void put(sa_sim_tick *v, size_t *n, const sa_sim_tick *t) {
  if (*n > 0 && v[*n - 1].sid == t->sid) {
    if (v[*n - 1].ticket < t->ticket) v[*n - 1].ticket = t->ticket;
    return;
  }
  v[(*n)++] = *t;
}

sa_status sa_sim_clock_join(sa_sim_clock *out, const sa_sim_clock *a, const sa_sim_clock *b,
                            const sa_sim_stream *edge, uint64_t ticket) {
  size_t cap = a->n + b->n + 1;
  sa_sim_tick *v = malloc(cap * sizeof *v);
  if (v == NULL) return SA_ERR_OUT_OF_MEMORY;
  sa_sim_tick extra = {0, 0, ticket};
  if (edge != NULL) extra = (sa_sim_tick){edge->sid, edge->slot, ticket};
  size_t i = 0, j = 0, n = 0;
  int extra_left = edge != NULL;
  /* Three-way merge of sorted lists, keeping the maximum ticket per sid. */
  while (i < a->n || j < b->n || extra_left) {
    const sa_sim_tick *pick = NULL;
    if (i < a->n) pick = &a->v[i];
    if (j < b->n && (pick == NULL || b->v[j].sid < pick->sid)) pick = &b->v[j];
    if (extra_left && (pick == NULL || extra.sid < pick->sid)) pick = &extra;
    put(v, &n, pick);
    if (pick == &extra) extra_left = 0;
    else if (i < a->n && pick == &a->v[i]) i++;
    else j++;
  }
  /* Drop what no longer orders anything, so clocks stay as small as the set
   * of streams with pending work. */
  size_t kept = 0;
  for (size_t k = 0; k < n; k++) {
    if (pending(&v[k])) v[kept++] = v[k];
  }
  *out = (sa_sim_clock){v, kept};
  return SA_OK;
}

void sa_sim_clock_free(sa_sim_clock *c) {
  free(c->v);
  c->v = NULL;
  c->n = 0;
}

static const char *op_name(sa_sim_op_kind kind) {
  return kind == SA_SIM_OP_FILL ? "fill" : "check";
}

static void describe(const sa_sim_stream *s, char *buf, size_t len) {
  if (sa_sim_stream_is_default(s)) snprintf(buf, len, "the default stream of device %d", s->device);
  else snprintf(buf, len, "stream %p (#%" PRIu64 ")", (void *)sa_sim_stream_handle(s), s->sid);
}

sa_status sa_sim_check_handout(uintptr_t p, size_t size, sa_stream stream, int device) {
  sa_sim_stream *s = sa_sim_stream_for_call(stream, device, "check_handout");
  if (s == NULL) return SA_ERR_UNKNOWN_STREAM;
  if (size == 0) return SA_OK;
  uintptr_t end = p > UINTPTR_MAX - size ? UINTPTR_MAX : p + size;
  for (size_t slot = 0; slot < sa_sim_stream_slots(); slot++) {
    const sa_sim_stream *u = sa_sim_stream_at(slot);
    if (u == NULL || u == s || u->head == u->tail) continue;
    /* Ops up to `covered` are done or ordered before s: skip them. */
    uint64_t covered = sa_sim_clock_get(&s->clock, u->sid);
    if (covered < u->completed) covered = u->completed;
    if (covered >= u->enqueued) continue;
    for (size_t i = u->head + (size_t)(covered - u->completed); i < u->tail; i++) {
      const sa_sim_op *op = &u->ops[i];
      if (op->kind != SA_SIM_OP_FILL && op->kind != SA_SIM_OP_CHECK) continue;
      if (op->size == 0 || op->p >= end || p >= op->p + op->size) continue;
      char sname[64], uname[64];
      describe(s, sname, sizeof sname);
      describe(u, uname, sizeof uname);
      fprintf(stderr,
              "streamarena host checker: stream-order violation: block %p (%zu bytes) "
              "handed to %s, but %s has an unfinished %s of [%p, %p) (op ticket %" PRIu64
              ", completed up to %" PRIu64 ") that %s is not ordered after (it waited on "
              "no event recorded after that op)\n",
              (void *)p, size, sname, uname, op_name(op->kind), (void *)op->p,
              (void *)(op->p + op->size), u->completed + 1 + (uint64_t)(i - u->head),
              u->completed, sname);
      sa_sim_note_violation();
      return SA_ERR_STREAM_ORDER;
    }
  }
  return SA_OK;
}
