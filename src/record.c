/* sa_record_stream's side table: for each recorded block, the extra streams
 * that use it. Blocks in it have state SA_BLOCK_RECORDED, so the free fast
 * path sends them here; the table is consulted only at free time.
 */
#include <stdlib.h>

#include "internal.h"

static size_t bucket_of(uintptr_t p) {
  return (size_t)((p >> 8) * 0x9E3779B97F4A7C15ull >> 54) % SA_RECORD_BUCKETS;
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
  }
  sa_record **head = &a->records[bucket_of(p)], *r = *head;
  while (r != NULL && r->p != p) r = r->next;
  bool made = r == NULL;
  if (made) {
    r = calloc(1, sizeof *r);
    if (r == NULL) {
      st = SA_ERR_OUT_OF_MEMORY;
      goto out;
    }
    r->p = p;
    r->next = *head;
    *head = r;
  }
  for (unsigned i = 0; i < r->n; i++)
    if (r->streams[i] == s) goto out; /* recorded already */
  if (r->n == r->cap) {
    unsigned cap = r->cap ? r->cap * 2 : 2;
    sa_stream *grown = realloc(r->streams, cap * sizeof *grown);
    if (grown == NULL) {
      st = SA_ERR_OUT_OF_MEMORY;
      if (made) { /* the block stays unrecorded: no entry */
        *head = r->next;
        free(r);
      }
      goto out;
    }
    r->streams = grown;
    r->cap = cap;
  }
  r->streams[r->n++] = s;
out:
  pthread_mutex_unlock(&a->record_lock);
  return st;
}

sa_record *sa__record_take(sa_arena *a, uintptr_t p) {
  sa_record *found = NULL;
  pthread_mutex_lock(&a->record_lock);
  if (a->records != NULL) {
    for (sa_record **pr = &a->records[bucket_of(p)]; *pr != NULL; pr = &(*pr)->next) {
      if ((*pr)->p != p) continue;
      found = *pr;
      *pr = found->next;
      break;
    }
  }
  pthread_mutex_unlock(&a->record_lock);
  return found;
}

void sa__record_restore(sa_arena *a, sa_record *r) {
  if (r == NULL) return;
  pthread_mutex_lock(&a->record_lock); /* the table exists: r came from it */
  sa_record **head = &a->records[bucket_of(r->p)];
  r->next = *head;
  *head = r;
  pthread_mutex_unlock(&a->record_lock);
}

void sa__record_free(sa_record *r) {
  if (r == NULL) return;
  free(r->streams);
  free(r);
}

bool sa__record_names_stream(sa_arena *a, sa_stream s) {
  bool found = false;
  pthread_mutex_lock(&a->record_lock);
  for (size_t i = 0; a->records != NULL && i < SA_RECORD_BUCKETS && !found; i++)
    for (sa_record *r = a->records[i]; r != NULL && !found; r = r->next)
      for (unsigned k = 0; k < r->n && !found; k++) found = r->streams[k] == s;
  pthread_mutex_unlock(&a->record_lock);
  return found;
}

void sa__record_forget_stream(sa_arena *a, sa_stream s) {
  pthread_mutex_lock(&a->record_lock);
  if (a->records != NULL) {
    for (size_t i = 0; i < SA_RECORD_BUCKETS; i++) {
      for (sa_record **pr = &a->records[i]; *pr != NULL;) {
        sa_record *r = *pr;
        for (unsigned k = 0; k < r->n;) {
          if (r->streams[k] == s)
            r->streams[k] = r->streams[--r->n];
          else
            k++;
        }
        if (r->n > 0) {
          pr = &r->next;
          continue;
        }
        *pr = r->next; /* none left: as if never recorded */
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
  for (size_t i = 0; i < SA_RECORD_BUCKETS; i++) {
    for (sa_record *r = a->records[i], *n; r != NULL; r = n) {
      n = r->next;
      free(r->streams);
      free(r);
    }
  }
  free(a->records);
  a->records = NULL;
}
