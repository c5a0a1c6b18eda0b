/* Paths the user typed: see user_path.h. */
#include "user_path.h"

#include <stdio.h>
#include <stdlib.h>

bool user_path(const char *path, char *out, size_t out_size) {
  const char *wd = getenv("BUILD_WORKING_DIRECTORY");
  int n;
  if (path[0] != '/' && wd != NULL && wd[0] != '\0')
    n = snprintf(out, out_size, "%s/%s", wd, path);
  else
    n = snprintf(out, out_size, "%s", path);
  return n >= 0 && (size_t)n < out_size;
}
