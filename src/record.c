/* sa_record_stream's side table: for each recorded block, the extra streams
 * that use it. Blocks in it have state SA_BLOCK_RECORDED, so the free fast
 * path sends them here; the table is consulted only at free time.
 *
 * One hash table (record_lock) holds two kinds of entries: a block's,
 * keyed by its address, and a stream's, keyed by its handle shifted left
 * with the low bit set (block addresses are 256-aligned), whose n counts the blocks'
 * entries that name the stream. So sa_stream_release of a stream that no
 * entry names costs a lookup, not a walk of every entry (a million recorded
 * blocks: 245 ms per release). The table doubles once it holds two entries
 * per bucket, so chains stay short however many blocks are recorded (1,024
 * buckets for good: 43 us per record and free at a million).
 */
#include <stdlib.h>

#include "internal.h"

static size_t bucket_of(const sa_arena *a, uintptr_t key) {
  return (size_t)((uint64_t)(key >> 8) * 0x9E3779B97F4A7C15ull >> (64 - a->record_bits));
}

/* Shifted first: NULL and CU_STREAM_LEGACY (1) are two handles. */
static uintptr_t stream_key(sa_stream s) { return (uintptr_t)s << 1 | 1; }
static bool is_stream_entry(const sa_record *r) { return (r->p & 1) != 0; }

/* The link that points at key's entry, or the null link ending its chain. */
static sa_record **find(sa_arena *a, uintptr_t key) {
  sa_record **pr = &a->records[bucket_of(a, key)];
  while (*pr != NULL && (*pr)->p != key) pr = &(*pr)->next;
  return pr;
}

/* Twice the buckets once entries outnumber them two to one; without memory
 * for that the table stays as it is (longer chains, nothing lost). */
static void maybe_grow(sa_arena *a) {
  size_t n = (size_t)1 << a->record_bits;
  if (a->nrecords <= 2 * n) return;
  sa_record **grown = calloc(2 * n, sizeof *grown);
  if (grown == NULL) return;
  sa_record **old = a->records;
  a->records = grown;
  a->record_bits++;
  for (size_t i = 0; i < n; i++) {
    for (sa_record *r = old[i], *next; r != NULL; r = next) {
      next = r->next;
      sa_record **head = &grown[bucket_of(a, r->p)];
      r->next = *head;
      *head = r;
    }
  }
  free(old);
}

static void link_entry(sa_arena *a, sa_record *r) {
  sa_record **head = &a->records[bucket_of(a, r->p)];
  r->next = *head;
  *head = r;
  a->nrecords++;
}

static void unlink_entry(sa_arena *a, sa_record **pr) {
  *pr = (*pr)->next;
  a->nrecords--;
}

/* One block's entry naming s less. Lock held. */
static void stream_uncount(sa_arena *a, sa_stream s) {
  sa_record **pc = find(a, stream_key(s));
  sa_record *c = *pc;
  if (c == NULL || --c->n > 0) return;
  unlink_entry(a, pc);
  free(c);
}

sa_status sa__record_add(sa_arena *a, uintptr_t p, sa_stream s) {
  sa_status st = SA_OK;
  pthread_mutex_lock(&a->record_lock);
  if (a->records == NULL) {
    a->records = calloc(SA_RECORD_BUCKETS, sizeof *a->records);
    if (a->records == NULL) {
      pthread_mutex_unlock(&a->record_lock);
      return SA_ERR_OUT_OF_MEMORY;
    }
    a->record_bits = SA_RECORD_BUCKET_BITS;
  }
  sa_record *r = *find(a, p), *c = NULL;
  bool made = r == NULL;
  if (made) {
    r = calloc(1, sizeof *r);
    if (r == NULL) {
      st = SA_ERR_OUT_OF_MEMORY;
      goto out;
    }
    r->p = p;
    link_entry(a, r);
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
  c = *find(a, stream_key(s));
  if (c == NULL) {
    c = calloc(1, sizeof *c);
    if (c == NULL) {
      st = SA_ERR_OUT_OF_MEMORY;
      goto out;
    }
    c->p = stream_key(s);
    link_entry(a, c);
  }
  c->n++;
  r->streams[r->n++] = s;
out:
  if (st != SA_OK && made && r != NULL) { /* the block stays unrecorded: no entry */
    unlink_entry(a, find(a, p));
    free(r->streams);
    free(r);
  }
  maybe_grow(a);
  pthread_mutex_unlock(&a->record_lock);
  return st;
}

sa_record *sa__record_take(sa_arena *a, uintptr_t p) {
  sa_record *found = NULL;
  pthread_mutex_lock(&a->record_lock);
  if (a->records != NULL) {
    sa_record **pr = find(a, p);
    found = *pr;
    if (found != NULL) unlink_entry(a, pr);
  }
  pthread_mutex_unlock(&a->record_lock);
  return found;
}

void sa__record_restore(sa_arena *a, sa_record *r) {
  if (r == NULL) return;
  pthread_mutex_lock(&a->record_lock); /* the table exists: r came from it */
  link_entry(a, r); /* its streams' counts kept it */
  pthread_mutex_unlock(&a->record_lock);
}

void sa__record_free(sa_arena *a, sa_record *r) {
  if (r == NULL) return;
  pthread_mutex_lock(&a->record_lock);
  for (unsigned i = 0; i < r->n; i++) stream_uncount(a, r->streams[i]);
  pthread_mutex_unlock(&a->record_lock);
  free(r->streams);
  free(r);
}

bool sa__record_names_stream(sa_arena *a, sa_stream s) {
  pthread_mutex_lock(&a->record_lock);
  bool found = a->records != NULL && *find(a, stream_key(s)) != NULL;
  pthread_mutex_unlock(&a->record_lock);
  return found;
}

void sa__record_forget_stream(sa_arena *a, sa_stream s) {
  pthread_mutex_lock(&a->record_lock);
  sa_record **pc = a->records != NULL ? find(a, stream_key(s)) : NULL;
  if (pc != NULL && *pc != NULL) { /* some block's entry names s */
    sa_record *c = *pc;
    unlink_entry(a, pc);
    free(c);
    for (size_t i = 0; i < (size_t)1 << a->record_bits; i++) {
      for (sa_record **pr = &a->records[i]; *pr != NULL;) {
        sa_record *r = *pr;
        for (unsigned k = 0; k < r->n && !is_stream_entry(r);) {
          if (r->streams[k] == s)
            r->streams[k] = r->streams[--r->n];
          else
            k++;
        }
        if (r->n > 0 || is_stream_entry(r)) {
          pr = &r->next;
          continue;
        }
        unlink_entry(a, pr); /* none left: as if never recorded */
        free(r->streams);
        free(r);
      }
    }
  }
  pthread_mutex_unlock(&a->record_lock);
}

void sa__record_use_begin(sa_arena *a) { pthread_rwlock_rdlock(&a->record_rw); }
void sa__record_use_end(sa_arena *a) { pthread_rwlock_unlock(&a->record_rw); }
void sa__record_forget_begin(sa_arena *a) { pthread_rwlock_wrlock(&a->record_rw); }
void sa__record_forget_end(sa_arena *a) { pthread_rwlock_unlock(&a->record_rw); }

void sa__record_fini(sa_arena *a) {
  if (a->records == NULL) return;
  for (size_t i = 0; i < (size_t)1 << a->record_bits; i++) {
    for (sa_record *r = a->records[i], *n; r != NULL; r = n) {
      n = r->next;
      free(r->streams);
      free(r);
    }
  }
  free(a->records);
  a->records = NULL;
  a->nrecords = 0;
}
