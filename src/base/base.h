/* What every file of the allocator uses: branch hints, invariants and their
 * validators, zeroed aligned memory, intrusive lists, hand-offs through ck
 * stacks, owner-only counters, and the state byte of a block.
 *
 * The bottom of the allocator's headers: it includes the public header and
 * libc only. invariant.c defines sa__invariant_broken.
 */
#ifndef SA_BASE_BASE_H
#define SA_BASE_BASE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <streamarena/streamarena.h>

#define sa_likely(x) __builtin_expect(!!(x), 1)
#define sa_unlikely(x) __builtin_expect(!!(x), 0)
#define SA_NOINLINE __attribute__((noinline))
#define SA_ALWAYS_INLINE inline __attribute__((always_inline))

/* Invariants in code (invariant.c). SA_ASSERT states one rule at the point
 * where it must hold; SA_CHECK is a validator's test of one rule of a named
 * structure. Both are compiled into every build with asserts on (tests,
 * sanitizers, the fuzzer, stress runs: NDEBUG undefined) and out of release
 * builds (-c opt defines NDEBUG). A broken one prints the structure, the
 * rule and the place, and aborts: a damaged allocator must not hand out
 * memory. */
#ifdef NDEBUG
/* Out, but the condition still compiled as an operand of sizeof (never
 * evaluated): it keeps compiling, and what a validator counts or names
 * stays used. */
#define SA_INVARIANTS 0
#define SA_ASSERT(cond) ((void)sizeof(cond))
#define SA_CHECK(structure, cond, rule) ((void)sizeof(cond), (void)(structure), (void)(rule))
#else
#define SA_INVARIANTS 1
#define SA_ASSERT(cond) \
  (sa_likely(cond) ? (void)0 : sa__invariant_broken("assertion", #cond, __FILE__, __LINE__))
#define SA_CHECK(structure, cond, rule) \
  (sa_likely(cond) ? (void)0 : sa__invariant_broken((structure), (rule), __FILE__, __LINE__))
#endif
_Noreturn void sa__invariant_broken(const char *structure, const char *rule, const char *file,
                                    int line);

/* Validators: sa__<structure>_check walks one structure whole and
 * SA_CHECKs each of its rules, with the lock the structure lives under
 * held, at a point where it must be whole. A call site names one with
 * SA_VALIDATE, which release builds compile out (the call stays
 * type-checked). Trim, snapshot and arena destroy run them all
 * (report.c: sa__world_check). */
#define SA_VALIDATE(call) (SA_INVARIANTS ? (void)(call) : (void)0)

/* Where a structure can grow large, a walk after every operation would
 * make a stress test quadratic in its size, so those calls are paced:
 * each earns SA_CHECK_CREDIT element visits, and the walk runs once the
 * credit covers what the last walk visited (a paced validator returns
 * that count). A structure of up to SA_CHECK_CREDIT elements is walked at
 * every call; a larger one costs each operation SA_CHECK_CREDIT visits on
 * average, whatever its size. The pace lives under the same lock as the
 * structure. */
#define SA_CHECK_CREDIT 32
typedef struct sa_check_pace_s {
  size_t credit; /* visits earned since the last walk */
  size_t cost;   /* visits the last walk made */
} sa_check_pace;
#if SA_INVARIANTS
#define SA_VALIDATE_PACED(pace, call) \
  (sa__pace_due(pace) ? sa__pace_done((pace), (call)) : (void)0)
#else
#define SA_VALIDATE_PACED(pace, call) ((void)0)
#endif
static inline bool sa__pace_due(sa_check_pace *p) {
  p->credit += SA_CHECK_CREDIT;
  return p->credit >= p->cost;
}
static inline void sa__pace_done(sa_check_pace *p, size_t visited) {
  p->credit = 0;
  p->cost = visited;
}

/* x, rounded up to a multiple of to, a power of two. */
static inline size_t sa__round_up(size_t x, size_t to) { return (x + to - 1) & ~(to - 1); }

/* Zeroed memory aligned for types declared with CK_CC_CACHELINE members
 * (calloc only guarantees 16 bytes). Free with free(). */
static inline void *sa__zalloc_aligned(size_t size, size_t align) {
  size_t rounded = (size + align - 1) / align * align;
  void *p = aligned_alloc(align, rounded);
  if (p != NULL) memset(p, 0, rounded);
  return p;
}

/* A doubly linked list threaded through type's own next_field and
 * prev_field, its head a pointer to the first node: defines name_push (to
 * the front) and name_unlink (n's own links stay as they were). A macro
 * because C has no generics: nodes keep typed links, and walks over them
 * stay plain loops. Unused: a list may need only one of the two. */
#define SA_DLIST_FUNCTIONS(name, type, next_field, prev_field)                      \
  static inline __attribute__((unused)) void name##_push(type **head, type *n) {    \
    n->prev_field = NULL;                                                           \
    n->next_field = *head;                                                          \
    if (*head != NULL) (*head)->prev_field = n;                                     \
    *head = n;                                                                      \
  }                                                                                 \
  static inline __attribute__((unused)) void name##_unlink(type **head, type *n) {  \
    if (n->prev_field != NULL)                                                      \
      n->prev_field->next_field = n->next_field;                                    \
    else                                                                            \
      *head = n->next_field;                                                        \
    if (n->next_field != NULL) n->next_field->prev_field = n->prev_field;           \
  }

/* ck's stacks order memory with inline assembly that C11 (and so
 * ThreadSanitizer) cannot see. An object handed over through a ck stack is
 * therefore also published with a C11 release store before the push and
 * read with an acquire load after the pop: the pop follows the push, so the
 * load sees the store and everything written before it. Costs one plain
 * store and load on x86. */
static inline void sa__handoff_publish(_Atomic uint64_t *x) {
  atomic_store_explicit(x, atomic_load_explicit(x, memory_order_relaxed) + 1,
                        memory_order_release);
}
static inline void sa__handoff_accept(_Atomic uint64_t *x) {
  (void)atomic_load_explicit(x, memory_order_acquire);
}
static inline void sa__count(_Atomic uint64_t *c) { /* owner-only counter */
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

/* What a call that finds work still pending does: ask and go on
 * (SA_QUERY), or wait on the host until it completes (SA_WAIT). */
typedef enum sa_wait_e { SA_QUERY = 0, SA_WAIT = 1 } sa_wait;

/* Block states, one byte per block (distinct bytes: no read-modify-write). */
enum {
  SA_BLOCK_FREE = 0,     /* in its superblock's free pool */
  SA_BLOCK_CACHED = 1,   /* in a thread cache */
  SA_BLOCK_LIVE = 2,     /* handed to the user */
  SA_BLOCK_RECORDED = 3, /* handed to the user, sa_record_stream called */
  SA_BLOCK_DEFERRED = 4  /* freed, waiting for an event */
};

#endif /* SA_BASE_BASE_H */
