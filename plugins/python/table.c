/* The table of live CuPy blocks (table.h): open addressing with linear
 * probing, split into shards by address so that threads allocating at once
 * rarely meet on a lock. A shard grows by doubling at half full, and a
 * removal shifts the entries behind it back (no tombstones), so a lookup
 * stops at the first empty slot. Owns its memory (malloc); calls nothing
 * of the library.
 *
 * A shard's lock is a spin lock, not a mutex: it is held for a probe of a
 * few slots (a growth's copy is the one long hold), once at each CuPy
 * allocation and once at each free, where an uncontended pthread mutex
 * costs a call and a second atomic at the unlock. A waiter that spins long
 * yields its processor, in case the holder was preempted.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "plugins/python/table.h"

#define SHARD_BITS 6
#define SHARDS (1u << SHARD_BITS)
#define FIRST_CAPACITY 64

typedef struct entry_s {
  uintptr_t p; /* 0: empty */
  sa_stream stream;
  size_t size;
} entry;

typedef struct shard_s {
  _Alignas(64) _Atomic bool xlocked;
  entry *slots; /* capacity slots, a power of two; NULL until the first put */
  size_t capacity, count;
} shard;

static shard shards[SHARDS];

/* Spins between yields of a waiter (each spin a pause). */
#define SPINS_BEFORE_YIELD 128

static void shard_lock(shard *s) {
  while (atomic_exchange_explicit(&s->xlocked, true, memory_order_acquire)) {
    for (unsigned n = 0; atomic_load_explicit(&s->xlocked, memory_order_relaxed); n++) {
      if (n == SPINS_BEFORE_YIELD) {
        sched_yield();
        n = 0;
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
}

static void shard_unlock(shard *s) {
  atomic_store_explicit(&s->xlocked, false, memory_order_release);
}

/* Blocks are at least 256-byte aligned: the low bits carry nothing. */
static uint64_t hash(uintptr_t p) { return (uint64_t)(p >> 8) * 0x9E3779B97F4A7C15ull; }

static shard *shard_of(uint64_t h) { return &shards[h >> (64 - SHARD_BITS)]; }

static size_t home(const shard *s, uint64_t h) { return (size_t)h & (s->capacity - 1); }

/* Insert into slots known to have room. Lock held. */
static void place(shard *s, entry e) {
  size_t i = home(s, hash(e.p));
  while (s->slots[i].p != 0) i = (i + 1) & (s->capacity - 1);
  s->slots[i] = e;
  s->count++;
}

/* Double the capacity (or make the first slots). Lock held. */
static sa_status grow(shard *s) {
  size_t capacity = s->capacity ? s->capacity * 2 : FIRST_CAPACITY;
  entry *slots = calloc(capacity, sizeof *slots);
  if (slots == NULL) return SA_ERR_OUT_OF_MEMORY;
  entry *old = s->slots;
  size_t old_capacity = s->capacity;
  s->slots = slots;
  s->capacity = capacity;
  s->count = 0;
  for (size_t i = 0; i < old_capacity; i++)
    if (old[i].p != 0) place(s, old[i]);
  free(old);
  return SA_OK;
}

sa_status sa__py_table_put(void *p, sa_stream stream, size_t size) {
  uint64_t h = hash((uintptr_t)p);
  shard *s = shard_of(h);
  sa_status st = SA_OK;
  shard_lock(s);
  if (2 * (s->count + 1) > s->capacity) st = grow(s);
  if (st == SA_OK) place(s, (entry){(uintptr_t)p, stream, size});
  shard_unlock(s);
  return st;
}

bool sa__py_table_take(void *p, sa_stream *stream, size_t *size) {
  uint64_t h = hash((uintptr_t)p);
  shard *s = shard_of(h);
  bool found = false;
  shard_lock(s);
  size_t mask = s->capacity - 1;
  for (size_t i = s->capacity ? home(s, h) : 0; s->capacity && s->slots[i].p != 0;
       i = (i + 1) & mask) {
    if (s->slots[i].p != (uintptr_t)p) continue;
    *stream = s->slots[i].stream;
    *size = s->slots[i].size;
    found = true;
    /* Backward shift: move each later entry of the run into the hole when
     * its home does not lie (cyclically) between the hole and itself. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; s->slots[j].p != 0; j = (j + 1) & mask) {
      size_t k = home(s, hash(s->slots[j].p));
      bool stays = hole <= j ? (hole < k && k <= j) : (hole < k || k <= j);
      if (stays) continue;
      s->slots[hole] = s->slots[j];
      hole = j;
    }
    s->slots[hole].p = 0;
    s->count--;
    break;
  }
  shard_unlock(s);
  return found;
}

size_t sa__py_table_count(void) {
  size_t n = 0;
  for (unsigned i = 0; i < SHARDS; i++) {
    shard_lock(&shards[i]);
    n += shards[i].count;
    shard_unlock(&shards[i]);
  }
  return n;
}
