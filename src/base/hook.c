/* Test hooks: named points on slow paths where a test pauses one side of an
 * interleaving, so that a race happens every run instead of once in a
 * while (see sa__hook in hook.h). NULL outside tests: a load and a
 * branch on paths that take locks anyway.
 *
 * Owns the hook pointer; calls nothing; set by tests, read by any module. */
#include "hook.h"

_Atomic(sa_hook_fn) sa__test_hook;
