/* sa_record_stream's side table: for each recorded block, the extra streams
 * that use it. Blocks in it have state SA_BLOCK_RECORDED, so the free fast
 * path sends them here; the table is consulted only at free time.
 *
 * One hash table (chain_table.c; records.lock) holds two kinds of entries:
 * a block's, keyed by its address, and a stream's, keyed by its handle
 * shifted left with the low bit set (block addresses are 256-aligned),
 * whose n counts the blocks' entries that name the stream. So
 * sa_stream_release of a stream that no entry names costs a lookup, not a
 * walk of every entry. The table doubles once it holds two entries per
 * bucket, so chains stay short however many blocks are recorded. See Note
 * [Record table].
 */
#include <stdlib.h>

#include "record.h"
#include "../arena.h"
#include "chain_table.h"

#define RECORD_KEY_SHIFT 8 /* block addresses are 256-aligned */

/* Shifted first: NULL and CU_STREAM_LEGACY (1) are two handles. */
static uintptr_t stream_key(sa_stream s) { return (uintptr_t)s << 1 | 1; }
static bool is_stream_entry(const sa_record *r) { return (r->link.key & 1) != 0; }

static sa_record *record_of(sa_chain_link *l) { return sa__chain_entry(l, sa_record, link); }

/* Twice the buckets once entries outnumber them two to one; without memory
 * for that the table stays as it is (longer chains, nothing lost). */
static void maybe_grow(sa_chain_table *t) {
  if (t->n > 2 * sa__chain_buckets(t)) (void)sa__chain_double(t);
}

/* One block's entry naming s less. Lock held. */
static void stream_uncount(sa_chain_table *t, sa_stream s) {
  sa_chain_link **pc = sa__chain_find(t, stream_key(s));
  sa_record *c = record_of(*pc);
  if (c == NULL || --c->n > 0) return;
  sa__chain_unlink(t, pc);
  free(c);
}

sa_status sa__record_add(sa_arena *a, uintptr_t p, sa_stream s) {
  sa_chain_table *t = &a->records.table;
  sa_status st = SA_OK;
  pthread_mutex_lock(&a->records.lock);
  if (t->heads == NULL && !sa__chain_create(t, SA_RECORD_BUCKET_BITS, RECORD_KEY_SHIFT)) {
    pthread_mutex_unlock(&a->records.lock);
    return SA_ERR_OUT_OF_MEMORY;
  }
  sa_record *r = record_of(*sa__chain_find(t, p)), *c = NULL;
  bool made = r == NULL;
  if (made) {
    r = calloc(1, sizeof *r);
    if (r == NULL) {
      st = SA_ERR_OUT_OF_MEMORY;
      goto out;
    }
    r->link.key = p;
    sa__chain_push(t, &r->link);
  }
  for (unsigned i = 0; i < r->n; i++)
    if (r->streams[i] == s) goto out; /* recorded already */
  if (r->n == r->cap) {
    unsigned cap = r->cap ? r->cap * 2 : 2;
    sa_stream *grown = realloc(r->streams, cap * sizeof *grown);
    if (grown == NULL) {
      st = SA_ERR_OUT_OF_MEMORY;
      goto out;
    }
    r->streams = grown;
    r->cap = cap;
  }
  c = record_of(*sa__chain_find(t, stream_key(s)));
  if (c == NULL) {
    c = calloc(1, sizeof *c);
    if (c == NULL) {
      st = SA_ERR_OUT_OF_MEMORY;
      goto out;
    }
    c->link.key = stream_key(s);
    sa__chain_push(t, &c->link);
  }
  c->n++;
  r->streams[r->n++] = s;
out:
  if (st != SA_OK && made && r != NULL) { /* the block stays unrecorded: no entry */
    sa__chain_unlink(t, sa__chain_find(t, p));
    free(r->streams);
    free(r);
  }
  maybe_grow(t);
  pthread_mutex_unlock(&a->records.lock);
  return st;
}

sa_record *sa__record_take(sa_arena *a, uintptr_t p) {
  sa_chain_table *t = &a->records.table;
  sa_record *found = NULL;
  pthread_mutex_lock(&a->records.lock);
  if (t->heads != NULL) {
    sa_chain_link **pr = sa__chain_find(t, p);
    found = record_of(*pr);
    if (found != NULL) sa__chain_unlink(t, pr);
  }
  pthread_mutex_unlock(&a->records.lock);
  return found;
}

void sa__record_restore(sa_arena *a, sa_record *r) {
  if (r == NULL) return;
  pthread_mutex_lock(&a->records.lock); /* the table exists: r came from it */
  sa__chain_push(&a->records.table, &r->link); /* its streams' counts kept it */
  pthread_mutex_unlock(&a->records.lock);
}

void sa__record_free(sa_arena *a, sa_record *r) {
  if (r == NULL) return;
  pthread_mutex_lock(&a->records.lock);
  for (unsigned i = 0; i < r->n; i++) stream_uncount(&a->records.table, r->streams[i]);
  pthread_mutex_unlock(&a->records.lock);
  free(r->streams);
  free(r);
}

bool sa__record_names_stream(sa_arena *a, sa_stream s) {
  pthread_mutex_lock(&a->records.lock);
  bool found = sa__chain_get(&a->records.table, stream_key(s)) != NULL;
  pthread_mutex_unlock(&a->records.lock);
  return found;
}

void sa__record_forget_stream(sa_arena *a, sa_stream s) {
  sa_chain_table *t = &a->records.table;
  pthread_mutex_lock(&a->records.lock);
  sa_chain_link **pc = t->heads != NULL ? sa__chain_find(t, stream_key(s)) : NULL;
  if (pc != NULL && *pc != NULL) { /* some block's entry names s */
    sa_record *c = record_of(*pc);
    sa__chain_unlink(t, pc);
    free(c);
    for (size_t i = 0; i < sa__chain_buckets(t); i++) {
      for (sa_chain_link **pr = &t->heads[i]; *pr != NULL;) {
        sa_record *r = record_of(*pr);
        for (unsigned k = 0; k < r->n && !is_stream_entry(r);) {
          if (r->streams[k] == s)
            r->streams[k] = r->streams[--r->n];
          else
            k++;
        }
        if (r->n > 0 || is_stream_entry(r)) {
          pr = &r->link.next;
          continue;
        }
        sa__chain_unlink(t, pr); /* none left: as if never recorded */
        free(r->streams);
        free(r);
      }
    }
  }
  pthread_mutex_unlock(&a->records.lock);
}

void sa__record_use_begin(sa_arena *a) { pthread_rwlock_rdlock(&a->records.rw); }
void sa__record_use_end(sa_arena *a) { pthread_rwlock_unlock(&a->records.rw); }
void sa__record_forget_begin(sa_arena *a) { pthread_rwlock_wrlock(&a->records.rw); }
void sa__record_forget_end(sa_arena *a) { pthread_rwlock_unlock(&a->records.rw); }

void sa__record_fini(sa_arena *a) {
  sa_chain_table *t = &a->records.table;
  if (t->heads == NULL) return;
  for (size_t i = 0; i < sa__chain_buckets(t); i++) {
    for (sa_chain_link *l = t->heads[i], *next; l != NULL; l = next) {
      next = l->next;
      sa_record *r = record_of(l);
      free(r->streams);
      free(r);
    }
  }
  sa__chain_destroy(t);
}
