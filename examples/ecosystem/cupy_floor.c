/* The least a CuPy C allocator hook can cost: a pair of functions for
 * cupy.cuda.memory.CFunctionAllocator that hand out one block the caller
 * allocated beforehand and do nothing else. bench_cupy.py times CuPy's
 * pairs through them beside CuPy's pool and streamarena, so that what the
 * CFunctionAllocator path costs CuPy itself (a Python object per array,
 * made through a Python-level constructor call) is told apart from what
 * streamarena's hooks add.
 *
 * One block, one array at a time: a second request while the block is out,
 * or one larger than it, gets NULL (bench_cupy.py times pairs only).
 */
#include <stddef.h>
#include <stdint.h>

/* What bench_cupy.py passes as the param: its ctypes mirror must match. */
typedef struct floor_block_s {
  uintptr_t base;  /* device memory of capacity bytes */
  size_t capacity;
  int out;         /* the block is handed out */
} floor_block;

__attribute__((visibility("default"))) void *sa_floor_malloc(void *param, size_t size, int dev) {
  (void)dev;
  floor_block *b = param;
  if (b->out || size > b->capacity) return NULL;
  b->out = 1;
  return (void *)b->base;
}

__attribute__((visibility("default"))) void sa_floor_free(void *param, void *ptr, int dev) {
  (void)dev;
  floor_block *b = param;
  if ((uintptr_t)ptr == b->base) b->out = 0;
}
