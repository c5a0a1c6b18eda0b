/* Paths the user typed, for the benchmark programs.
 *
 * `bazel run` starts a program in its runfiles folder, not where the user
 * typed the command; Bazel names that folder in BUILD_WORKING_DIRECTORY. A
 * relative path is resolved from there, so `bazel run //bench:replay --
 * trace.csv` finds ./trace.csv as the user meant. Outside `bazel run` (the
 * variable unset or empty) a path is used as given.
 */
#ifndef SA_BENCH_USER_PATH_H
#define SA_BENCH_USER_PATH_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* path as the user meant it, into out (out_size bytes). False if it does
 * not fit. */
bool user_path(const char *path, char *out, size_t out_size);

#ifdef __cplusplus
}
#endif

#endif /* SA_BENCH_USER_PATH_H */
