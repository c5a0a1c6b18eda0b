/* Size classes of small blocks.
 *
 * 256-byte steps up to 2 KiB, then eight classes per doubling (at most 12.5%
 * rounding waste) up to SA_CLASS_MAX_SIZE. Which classes an arena uses is
 * bounded by its large-allocation threshold: larger requests get spans.
 * Pure arithmetic, no tables: the fast path computes a class in a few
 * instructions.
 */
#ifndef SA_SIZE_CLASS_H
#define SA_SIZE_CLASS_H

#include <stddef.h>
#include <stdint.h>

#define SA_CLASS_COUNT 128
#define SA_CLASS_MAX_SIZE ((size_t)64 << 20)

/* The class of a request of size bytes, 1 <= size <= SA_CLASS_MAX_SIZE. */
static inline unsigned sa_size_class(size_t size) {
  if (size <= 2048) return (unsigned)((size + 255) >> 8) - 1;
  size_t s = size - 1;
  unsigned b = 63u - (unsigned)__builtin_clzll((unsigned long long)s);
  return 8u + (b - 11u) * 8u + (unsigned)((s >> (b - 3u)) & 7u);
}

/* The block size of class cls. */
static inline size_t sa_class_size(unsigned cls) {
  if (cls < 8) return ((size_t)cls + 1) * 256;
  unsigned k = cls - 8, b = 11 + k / 8;
  return ((size_t)1 << b) + ((size_t)(k % 8) + 1) * ((size_t)1 << (b - 3));
}

/* Blocks of class cls a thread cache bin holds: about 1 MiB of them,
 * between 2 and 64. An empty bin takes half that from its stream at once. */
static inline unsigned sa_class_bin_capacity(unsigned cls) {
  size_t cap = ((size_t)1 << 20) / sa_class_size(cls);
  return cap < 2 ? 2 : cap > 64 ? 64 : (unsigned)cap;
}
static inline unsigned sa_class_refill(unsigned cls) { return sa_class_bin_capacity(cls) / 2; }

#endif /* SA_SIZE_CLASS_H */
