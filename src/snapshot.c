/* sa_snapshot_write: the arena's state as JSON, for people and tools
 * (tools/render_snapshot.py draws it).
 *
 * It stops the arena briefly (sa__world_lock): every stream arena lock in
 * list order, then the arena lock (other threads hold at most one stream
 * arena lock at a time, so this order cannot deadlock). Thread caches are not stopped:
 * their blocks show as "cached".
 */
#include <inttypes.h>

#include "arena.h"
#include "base/base.h"
#include "driver/driver.h"
#include "large/mark.h"
#include "large/span.h"
#include "report.h"
#include "small/size_class.h"
#include "small/stream_arena.h"
#include "small/superblock.h"
#include "vm/physical.h"

static const char block_letter[] = {'F', 'C', 'L', 'R', 'D'}; /* SA_BLOCK_* */

static bool span_live(const sa_span *sp) {
  uint8_t state = atomic_load_explicit(&sp->xstate, memory_order_relaxed);
  return state == SA_BLOCK_LIVE || state == SA_BLOCK_RECORDED;
}

static const char *span_state(const sa_span *sp) {
  if (span_live(sp)) return "live";
  for (unsigned i = 0; i < sp->nmarks; i++)
    if (!sa__mark_known_done(&sp->marks[i])) return "awaiting_event";
  return "cached";
}

static void write_superblock(FILE *f, const sa_superblock *sb, bool first) {
  fprintf(f, "%s\n    {\"base\": \"0x%" PRIxPTR "\", \"size\": %zu, ", first ? "" : ",",
          sb->hdr.base, sb->hdr.size);
  if (sb->owner == NULL) {
    fprintf(f, "\"state\": \"%s\", \"stream\": null}", sb->event ? "awaiting_event" : "free");
    return;
  }
  uint32_t counts[5] = {0};
  fprintf(f, "\"state\": \"%s\", \"stream\": \"%p\", \"class\": %u, \"block_size\": %zu, "
          "\"blocks\": \"", sb->used ? "active" : "empty", sb->owner->stream, sb->cls,
          sb->block_size);
  for (uint32_t i = 0; i < sb->nblocks; i++) {
    uint8_t s = atomic_load_explicit(&sb->state[i], memory_order_relaxed);
    if (i >= sb->bump && s == SA_BLOCK_FREE) s = SA_BLOCK_FREE;
    counts[s < 5 ? s : 0]++;
    fputc(s < 5 ? block_letter[s] : '?', f);
  }
  fprintf(f, "\", \"free\": %u, \"cached\": %u, \"live\": %u, \"awaiting_event\": %u}",
          counts[SA_BLOCK_FREE], counts[SA_BLOCK_CACHED],
          counts[SA_BLOCK_LIVE] + counts[SA_BLOCK_RECORDED], counts[SA_BLOCK_DEFERRED]);
}

/* A mapping's chunks, each at its own address (mapped in order from at);
 * at 0: cached, mapped nowhere. extra: more fields of a mapped chunk. */
static void write_chunks(FILE *f, const sa_chunk *c, uintptr_t at, const char *extra,
                         bool *first) {
  for (; c != NULL; c = c->next, *first = false) {
    fprintf(f, "%s{\"size\": %zu, \"mapped_at\": ", *first ? "" : ", ", c->size);
    if (at == 0) {
      fprintf(f, "null}");
      continue;
    }
    fprintf(f, "\"0x%" PRIxPTR "\"%s}", at, extra);
    at += c->size;
  }
}

sa_status sa_snapshot_write(sa_arena *a, FILE *f) {
  if (a == NULL || f == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_stats st;
  sa_status status = sa_get_stats(a, &st);
  if (status != SA_OK) return status;
  sa_stream_arena *head = sa__world_lock(a);
  SA_VALIDATE(sa__world_check_locked(a)); /* what is written was whole */

  fprintf(f, "{\n  \"backend\": \"%s\", \"device\": %d, \"granularity\": %zu, \"va_base\": \"0x%"
          PRIxPTR "\", \"va_size\": %zu,\n", sa_backend_name(a->drv->backend), a->drv->device,
          a->gran, a->range.base, a->range.size);
  fprintf(f, "  \"superblock_size\": %zu, \"large_threshold\": %zu, \"physical_cap\": %zu,\n",
          atomic_load(&a->small.xsuperblock_size), atomic_load(&a->xlarge_threshold),
          a->physical.cap);
  fprintf(f, "  \"stats\": {\"live_bytes\": %zu, \"live_bytes_peak\": %zu, \"reserved_bytes\": "
          "%zu, \"reserved_bytes_peak\": %zu, \"cached_bytes\": %zu, \"deferred_frees\": %zu, "
          "\"events_in_flight\": %zu},\n", st.live_bytes, st.live_bytes_peak,
          st.reserved_bytes, st.reserved_bytes_peak, st.cached_bytes, st.deferred_frees,
          st.events_in_flight);

  sa_summary sum;
  sa__summary_locked(a, &sum);
  fprintf(f, "  \"summary\": {\"total\": %zu, \"reserved\": %zu, \"in_use\": %zu, \"live\": "
          "%zu, \"free\": %zu, \"largest_free_span\": %zu, \"fragmentation\": %.4f},\n",
          sum.total, sum.reserved, sum.in_use, sum.live_bytes, sum.free, sum.largest_free_span,
          sum.fragmentation);
  fprintf(f, "  \"streams\": [");
  bool first = true;
  for (sa_stream_arena *sarena = head; sarena != NULL; sarena = sarena->next) {
    sa_holding h;
    sa__holding_locked(a, sarena, &h);
    fprintf(f,
            "%s\n    {\"stream\": \"%p\", \"released\": %s, \"empty_superblocks\": %u, "
            "\"deferred_blocks\": %zu, \"superblock_bytes\": %zu, \"live_block_bytes\": %zu, "
            "\"free_block_bytes\": %zu, \"live_spans\": %zu, \"live_span_bytes\": %zu, "
            "\"free_span_bytes\": %zu, \"classes\": [",
            first ? "" : ",", sarena->stream, sa__stream_arena_gone(sarena) ? "true" : "false",
            sarena->nempty, h.deferred_blocks, h.superblock_bytes, h.live_block_bytes,
            h.free_block_bytes, h.live_spans, h.live_span_bytes, h.free_span_bytes);
    bool cfirst = true;
    for (unsigned c = 0; c < SA_CLASS_COUNT; c++) {
      size_t n = 0;
      for (sa_superblock *sb = sarena->bins[c]; sb != NULL; sb = sb->next) n++;
      if (n == 0) continue;
      fprintf(f, "%s{\"class\": %u, \"block_size\": %zu, \"partial_superblocks\": %zu}",
              cfirst ? "" : ", ", c, sa_class_size(c), n);
      cfirst = false;
    }
    fprintf(f, "]}");
    first = false;
  }
  fprintf(f, "\n  ],\n  \"superblocks\": [");
  first = true;
  for (sa_superblock *sb = a->small.all_superblocks; sb != NULL; sb = sb->all_next) {
    if (sb->hdr.base == 0) continue;
    write_superblock(f, sb, first);
    first = false;
  }
  fprintf(f, "\n  ],\n  \"spans\": [");
  first = true;
  for (const sa_run *r = a->spans.runs; r != NULL; r = r->next)
    for (const sa_span *sp = r->first; sp != NULL; sp = sp->next) {
      if (sp->holder != NULL) continue; /* listed as the superblock carved in it */
      fprintf(f, "%s\n    {\"base\": \"0x%" PRIxPTR "\", \"size\": %zu, \"request\": %zu, "
              "\"state\": \"%s\", \"stream\": \"%p\"}", first ? "" : ",", sp->base, sp->size,
              span_live(sp) ? sp->request : 0, span_state(sp),
              sp->owner != NULL ? sp->owner->stream : NULL);
      first = false;
    }
  fprintf(f, "\n  ],\n  \"chunks\": [");
  first = true;
  for (const sa_superblock *sb = a->small.all_superblocks; sb != NULL; sb = sb->all_next)
    write_chunks(f, sb->hdr.chunks, sb->hdr.base, "", &first);
  for (const sa_slab *sl = a->small.slabs; sl != NULL; sl = sl->next)
    write_chunks(f, sl->hdr.chunks, sl->hdr.base, "", &first);
  for (const sa_slab *sl = a->small.full_slabs; sl != NULL; sl = sl->next)
    write_chunks(f, sl->hdr.chunks, sl->hdr.base, "", &first);
  for (const sa_run *r = a->spans.all_runs; r != NULL; r = r->all_next) /* kept-aside ones too */
    write_chunks(f, r->hdr.chunks, r->hdr.base, "", &first);
  for (const sa_chunk *s = a->physical.stuck; s != NULL; s = s->phys->stuck_next) /* held too */
    write_chunks(f, s, s->phys->stuck_va, ", \"stuck\": true", &first);
  write_chunks(f, a->physical.cache, 0, "", &first);
  fprintf(f, "]\n}\n");

  sa__world_unlock(a, head);
  /* Flushed, so that a full disk or a stream not open for writing shows
   * here: the caller's file failed, not the arena. */
  return fflush(f) != 0 || ferror(f) ? SA_ERR_INVALID_ARGUMENT : SA_OK;
}
