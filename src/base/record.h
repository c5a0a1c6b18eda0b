/* sa_record_stream's side table (record.c): for each recorded block, the
 * streams besides its own whose work uses it; consulted at its free. */
#ifndef SA_BASE_RECORD_H
#define SA_BASE_RECORD_H

#include <pthread.h>

#include "base.h"
#include "chain_table.h"

#define SA_RECORD_BUCKET_BITS 10 /* the record table's first size; it doubles */

/* The table and its locks, in the arena. */
typedef struct sa_records_s {
  pthread_mutex_t lock;
  pthread_rwlock_t rw;          /* read: a free uses the streams of a record it
                                   took; write: sa_stream_release forgets a
                                   stream */
  sa_chain_table table;         /* (lock) */
} sa_records;

typedef struct sa_record_s { /* the streams recorded for the block at link.key */
  sa_chain_link link; /* in the record table; key: the block's address or a stream's */
  unsigned n, cap;    /* n: for a stream's entry, the blocks' entries naming it */
  sa_stream *streams;
} sa_record;
sa_status sa__record_add(sa_arena *a, uintptr_t p, sa_stream s);
/* Detach p's record (NULL if none); the caller frees it or, when the free
 * fails, puts it back with sa__record_restore, which allocates nothing.
 * Either before sa__record_use_end: until then it names its streams. */
sa_record *sa__record_take(sa_arena *a, uintptr_t p);
void sa__record_restore(sa_arena *a, sa_record *r);
void sa__record_free(sa_arena *a, sa_record *r);
/* s was released (its work is done): no block needs an event on it. */
void sa__record_forget_stream(sa_arena *a, sa_stream s);
bool sa__record_names_stream(sa_arena *a, sa_stream s);
/* A free that takes a record holds use from before sa__record_take until it
 * made its last driver call on the record's streams; sa_stream_release holds
 * forget from before it looks at the stream until its records are
 * forgotten. So a release that finds no record naming its stream also has
 * no free still about to call the driver on it (the user destroys it next). */
void sa__record_use_begin(sa_arena *a);
void sa__record_use_end(sa_arena *a);
void sa__record_forget_begin(sa_arena *a);
void sa__record_forget_end(sa_arena *a);
void sa__record_fini(sa_arena *a);

#endif /* SA_BASE_RECORD_H */
