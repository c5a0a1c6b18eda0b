/* What happens when an invariant is broken (SA_ASSERT, SA_CHECK in
 * base.h): the structure and the rule are named on stderr, then the
 * process aborts. Only builds with asserts on reach here.
 *
 * Calls nothing of the allocator; called from every layer.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base.h"

void sa__invariant_broken(const char *structure, const char *rule, const char *file, int line) {
  fprintf(stderr, "streamarena: invariant broken: %s: %s (%s:%d)\n", structure, rule, file, line);
  fflush(stderr);
  abort();
}
