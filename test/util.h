/* Sizes, reproducible random numbers and a median for the tests, the
 * benchmarks and the fuzz target (C and C++): the one place KiB, MiB and
 * GiB, the project's two generators and the benchmarks' median are
 * written.
 *
 *   #include "test/util.h"        Bazel: deps = ["//test:util"]
 *
 *   size_t big = 16 * MiB;
 *   uint64_t x = 0x9E3779B97F4A7C15u;   any nonzero seed
 *   x = sa_xorshift64(x);
 *   size_t size = sa_log_uniform_size(x, 20);
 *
 * Owns nothing; calls nothing but qsort. A test whose outcome depends on its
 * sequence keeps its generator and seed: the sequences are part of what
 * the tests and the published benchmark figures were measured with. */
#ifndef SA_TEST_UTIL_H
#define SA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* Marsaglia's xorshift64 (shifts 13, 7, 17): the state after x (nonzero),
 * which is also the number drawn: x = sa_xorshift64(x). The benchmarks' and
 * defrag_test's size mixes, and cpu_scaling's reference loop. */
static inline uint64_t sa_xorshift64(uint64_t x) {
  x ^= x << 13;
  x ^= x >> 7;
  return x ^ (x << 17);
}

/* Vigna's xorshift64* (shifts 12, 25, 27, then a multiply): steps *x
 * (nonzero) and returns the next number. The stress tests' generator
 * (sa_fixture_pick). */
static inline uint64_t sa_xorshift64s(uint64_t *x) {
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 0x2545F4914F6CDD1Dull;
}

/* A size drawn log-uniformly by the random value r, not rounded (what a
 * framework's tensors look like): 2^b < size <= 2^(b+1) with b from 8 to
 * max_bits - 1 (max_bits 20: 257 B to 1 MiB). */
static inline size_t sa_log_uniform_size(uint64_t r, unsigned max_bits) {
  size_t lo = (size_t)1 << (8 + r % (max_bits - 8));
  return lo + (size_t)((r >> 16) % lo) + 1;
}

/* Doubles in increasing order, for qsort. */
static inline int sa_double_order(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* The median of v[0] .. v[n - 1] (n >= 1), which it sorts: a benchmark's
 * figure over its repetitions. */
static inline double sa_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, sa_double_order);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif /* SA_TEST_UTIL_H */
