/* The grower: memory mapped ahead of a climb by a thread of the arena's
 * own (grower.h).
 *
 * A climb to a new live peak (a training step's first forward pass) grows
 * the arena again and again, and each growth costs the allocating thread
 * a chunk's creation, mapping and access setting (tens to hundreds of us
 * on an H200, about the same at any size: physical.c). Where the free top
 * of the run a climb extends holds less than a growth would map ahead, the
 * grower maps that much more above it while the application goes on, so
 * that the climb's next requests find the memory mapped.
 *
 * Protocol, one job at a time:
 *   1. asked (sa__grower_consider, arena lock): where and how much;
 *   2. claimed by the thread (sa__run_ahead_claim, arena lock): the range
 *      is taken in the va space and its bytes counted as held, within the
 *      footprint target, so nobody maps there or passes a limit meanwhile;
 *   3. made by the driver, no lock held: the chunk created, mapped, given
 *      access, with the thread's capture mode relaxed (VMM calls are not
 *      stream work, and a capture elsewhere must not refuse them);
 *   4. published (arena lock): a run of one free span joined with the run
 *      below, in the fit index; or, where the driver refused, given back.
 * An allocation that would grow while a job is in flight waits for it
 * (sa__grower_settle): the range claimed is right where its own growth
 * would go. A reclaim or trim does the same, so that what it gives back
 * includes the job's memory. Arena destroy stops the thread first.
 *
 * The grower holds the arena lock only in steps 2 and 4, for bookkeeping
 * without a driver call; the small-block fast paths never take it.
 */
#include <signal.h>

#include "grower.h"
#include "../arena.h"
#include "../base/base.h"
#include "../base/hook.h"
#include "../driver/driver.h"
#include "run.h"

_Atomic bool sa__grower_inline;

void sa__grower_init(sa_arena *a) {
  pthread_cond_init(&a->grower.wake, NULL);
  pthread_cond_init(&a->grower.idle, NULL);
}

/* Step 3: create, map and give access to the claimed range, no lock held.
 * What succeeded is left in created and mapped for the unwind. */
typedef struct bring_up_s {
  sa_arena *a;
  sa_run_ahead *job;
  bool created;
  size_t mapped;
} bring_up;

static sa_status bring_up_range(void *arg) {
  bring_up *b = arg;
  sa_driver *drv = b->a->drv;
  sa_run_ahead *job = b->job;
  sa_status st = drv->ops->chunk_create(drv, job->size, &job->phys->handle);
  if (st != SA_OK) return st;
  b->created = true;
  st = drv->ops->map(drv, job->at, job->size, job->phys->handle);
  if (st != SA_OK) return st;
  b->mapped = job->size;
  return drv->ops->set_access(drv, job->at, job->size);
}

/* One job: claim, bring up, publish or give back. Arena lock held on entry
 * and exit, not in between. */
static void grow_one(sa_arena *a, uintptr_t at, size_t size) {
  sa_grower *g = &a->grower;
  sa_run_ahead job = {.at = at, .size = size};
  if (sa__run_ahead_claim(a, &job) != SA_OK) return;
  g->busy = true;
  pthread_mutex_unlock(&a->lock);
  sa__hook(SA_HOOK_GROWER_CLAIMED, a);
  bring_up b = {a, &job, false, 0};
  sa_status st = a->drv->ops->call_relaxed(a->drv, bring_up_range, &b);
  pthread_mutex_lock(&a->lock);
  if (st == SA_OK) {
    sa__run_ahead_publish(a, &job);
    atomic_fetch_add_explicit(&g->xgrowths, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g->xbytes, job.size, memory_order_relaxed);
  } else {
    /* Nothing was handed out there: the next growth, on the allocating
     * thread, meets the driver's refusal itself if it lasts. No job is
     * asked for until a chunk was created again (the device full, say). */
    (void)sa__run_ahead_abandon(a, &job, b.created, b.mapped, st);
    g->refused_at = atomic_load_explicit(&a->physical.xcreated_bytes, memory_order_relaxed);
    g->refused = true;
  }
  g->busy = false;
  pthread_cond_broadcast(&g->idle);
}

static void *grower_main(void *arg) {
  sa_arena *a = arg;
  sa_grower *g = &a->grower;
  (void)pthread_setname_np(pthread_self(), "sa-grower"); /* as debuggers and top show it */
  pthread_mutex_lock(&a->lock);
  for (;;) {
    while (!g->stop && g->asked_size == 0) pthread_cond_wait(&g->wake, &a->lock);
    if (g->stop) break;
    uintptr_t at = g->asked_at;
    size_t size = g->asked_size;
    g->asked_size = 0;
    grow_one(a, at, size);
  }
  pthread_mutex_unlock(&a->lock);
  return NULL;
}

/* Start the thread, with every signal blocked in it: the application's
 * signals are for its own threads. */
static bool start(sa_arena *a) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&a->grower.thread, NULL, grower_main, a);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc == 0;
}

void sa__grower_consider(sa_arena *a, const sa_span *sp, size_t request, bool exact) {
  sa_grower *g = &a->grower;
  if (!(a->cfg.flags & SA_FLAG_BACKGROUND_GROWTH) || exact || g->broken || g->busy ||
      g->asked_size != 0)
    return;
  if (g->refused &&
      atomic_load_explicit(&a->physical.xcreated_bytes, memory_order_relaxed) == g->refused_at)
    return;
  g->refused = false;
  uintptr_t at;
  size_t size = sa__run_ahead_wanted(a, sp, request, &at);
  if (size == 0) return;
  if (atomic_load_explicit(&sa__grower_inline, memory_order_relaxed)) {
    grow_one(a, at, size);
    return;
  }
  if (!g->started) {
    g->started = start(a);
    g->broken = !g->started;
    if (g->broken) return;
  }
  g->asked_at = at;
  g->asked_size = size;
  pthread_cond_signal(&g->wake);
}

bool sa__grower_settle(sa_arena *a) {
  sa_grower *g = &a->grower;
  g->asked_size = 0;
  if (!g->busy) return false;
  while (g->busy) pthread_cond_wait(&g->idle, &a->lock);
  return true;
}

void sa__grower_fini(sa_arena *a) {
  sa_grower *g = &a->grower;
  if (g->started) {
    pthread_mutex_lock(&a->lock);
    g->stop = true;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&a->lock);
    pthread_join(g->thread, NULL);
    g->started = false;
  }
}

void sa__grower_check(const sa_arena *a) {
  static const char GROWER[] = "grower";
  const sa_grower *g = &a->grower;
  SA_CHECK(GROWER, g->busy || a->physical.growing == 0,
           "bytes are reserved for growing only while a job is in flight");
  SA_CHECK(GROWER, !g->busy || a->physical.growing > 0, "a job in flight has reserved its bytes");
  SA_CHECK(GROWER, g->started || g->asked_size == 0, "jobs wait only for a thread that runs");
}
