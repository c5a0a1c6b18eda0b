/* ThreadSanitizer settings compiled into the library.
 *
 * ck's lock-free stacks read an entry's next pointer while another thread
 * may be pushing it (the read is discarded when the compare-and-swap
 * fails): a benign race by design that TSAN, which cannot see ck's inline
 * assembly, reports. Only those ck internals are suppressed; the objects
 * handed over through the stacks are published with C11 atomics
 * (sa__handoff_publish), so TSAN still checks everything around them.
 */
#if defined(__SANITIZE_THREAD__)
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void) {
  return "race:ck_stack_pop_mpmc\n"
         "race:ck_stack_trypop_mpmc\n"
         "race:ck_stack_push_upmc\n"
         "race:ck_stack_push_mpmc\n";
}
#else
typedef int sa_sanitizer_unused; /* ISO C forbids an empty translation unit */
#endif
