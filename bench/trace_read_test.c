/* Reading traces (trace_read.h): PyTorch's memory-history dialect, gzipped
 * files, and relative paths resolved from where `bazel run` was typed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "trace_read.h"
#include "user_path.h"

/* A fresh folder for one test's files. */
static void make_dir(char *dir, size_t n) {
  const char *base = getenv("TEST_TMPDIR");
  snprintf(dir, n, "%s/trace_read_XXXXXX", base != NULL && base[0] ? base : "/tmp");
  assert_non_null(mkdtemp(dir));
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fputs(text, f) >= 0, 1);
  assert_int_equal(fclose(f), 0);
}

static void write_gz(const char *path, const char *text) {
  gzFile gz = gzopen(path, "wb");
  assert_non_null(gz);
  assert_int_equal(gzwrite(gz, text, (unsigned)strlen(text)), (int)strlen(text));
  assert_int_equal(gzclose(gz), Z_OK);
}

static void load_ok(const char *path, trace *t) {
  char err[512] = "";
  sa_status st = trace_load(path, t, err, sizeof err);
  if (st != SA_OK) fail_msg("trace_load(%s): %s", path, err);
}

/* Allocation a (100 B) on stream 7, b (300 B) on 7, a freed (requested, not
 * yet completed), c (50 B) on stream 9, then a's and b's frees complete,
 * interleaved with the recording allocator's own events. */
static const char PYTORCH_CSV[] =
    "stream,action,addr,size,time_us\n"
    "7,segment_alloc,1000,2097152,1\n"
    "7,alloc,1000,100,2\n"
    "7,alloc,2000,300,3\n"
    "7,free_requested,1000,100,4\n"
    "9,alloc,3000,50,5\n"
    "7,free_completed,1000,100,6\n"
    "7,free_requested,2000,300,7\n"
    "7,free_completed,2000,300,8\n"
    "0,snapshot,0,0,9\n"
    "9,oom,0,1073741824,10\n";

static void pytorch_free_is_at_free_requested(void **state) {
  (void)state;
  char dir[512], path[600];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/pt.csv", dir);
  write_file(path, PYTORCH_CSV);
  trace t;
  load_ok(path, &t);
  assert_string_equal(t.format, "pytorch");
  assert_int_equal(t.nops, 5); /* 3 allocs, 2 frees: completions are no ops */
  assert_int_equal(t.nslots, 3);
  assert_int_equal(t.nstreams, 2);
  /* a, b live (400); a freed at its request: b + c = 350 never exceed it */
  assert_int_equal(t.peak_live, 400);
  assert_int_equal(t.ops[2].is_free, 1);
  assert_int_equal(t.ops[2].slot, 0);
  assert_int_equal(t.ops[3].is_free, 0);
  assert_int_equal(t.ops[3].size, 50);
  assert_int_equal(t.ops[3].stream, 1);
  assert_int_equal(t.ops[4].is_free, 1);
  assert_int_equal(t.ops[4].slot, 1);
  assert_int_equal(t.skipped, 2);
  assert_int_equal(t.failed_allocs, 1);
  assert_int_equal(t.unmatched_frees, 0);
  assert_int_equal(t.early_reuse, 0);
  assert_int_equal(t.never_freed, 1); /* c */
  trace_free(&t);
}

/* A recording that began with blocks already live (frees of unknown
 * addresses, each with its completion), an address handed out again before
 * its free completed, and a completion with no request before it (the free
 * is then at the completion). */
static void pytorch_odd_histories_are_counted(void **state) {
  (void)state;
  char dir[512], path[600];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/odd.csv", dir);
  write_file(path,
             "stream,action,addr,size\n"
             "1,free_requested,500,64\n"
             "1,free_completed,500,64\n"
             "1,alloc,600,64\n"
             "1,free_requested,600,64\n"
             "1,alloc,600,128\n"
             "1,free_completed,600,128\n"
             "1,free_completed,600,128\n"
             "1,free_completed,700,1\n");
  trace t;
  load_ok(path, &t);
  /* 500 once (its completion is expected), 600's second completion, 700 */
  assert_int_equal(t.unmatched_frees, 3);
  assert_int_equal(t.early_reuse, 1);
  /* alloc 600, free, alloc 600 again, freed by the completion without request */
  assert_int_equal(t.nops, 4);
  assert_int_equal(t.ops[3].is_free, 1);
  assert_int_equal(t.ops[3].slot, 1);
  assert_int_equal(t.never_freed, 0);
  trace_free(&t);
}

static void assert_same_trace(const trace *a, const trace *b) {
  assert_int_equal(a->nops, b->nops);
  assert_int_equal(a->nslots, b->nslots);
  assert_int_equal(a->nstreams, b->nstreams);
  assert_int_equal(a->peak_live, b->peak_live);
  assert_memory_equal(a->ops, b->ops, a->nops * sizeof a->ops[0]);
}

/* A long line (past any first buffer) and no line end at the very end. */
static char *big_csv(void) {
  size_t cap = 1 << 20, len = 0;
  char *s = malloc(cap);
  assert_non_null(s);
  len += (size_t)sprintf(s + len, "thread,stream,op,id,size,time_ns,note\n");
  len += (size_t)sprintf(s + len, "1,0x1,alloc,0xa,4096,0,");
  memset(s + len, 'x', 10000);
  len += 10000;
  s[len++] = '\n';
  for (int i = 0; i < 2000; i++)
    len += (size_t)sprintf(s + len, "1,0x%d,alloc,0x%x,%d,0,\n1,0x%d,free,0x%x,0,0,\n", i % 3,
                           0x100 + i, 256 + i, i % 3, 0x100 + i);
  len += (size_t)sprintf(s + len, "1,0x1,free,0xa,0,0,");
  assert_true(len < cap);
  return s;
}

static void gzipped_trace_reads_as_plain(void **state) {
  (void)state;
  char dir[512], plain[600], gz[600];
  make_dir(dir, sizeof dir);
  snprintf(plain, sizeof plain, "%s/t.csv", dir);
  snprintf(gz, sizeof gz, "%s/t.csv.gz", dir);
  char *text = big_csv();
  write_file(plain, text);
  write_gz(gz, text);
  free(text);
  trace a, b;
  load_ok(plain, &a);
  load_ok(gz, &b);
  assert_int_equal(a.nops, 4002);
  assert_int_equal(a.never_freed, 0);
  assert_same_trace(&a, &b);
  trace_free(&a);
  trace_free(&b);
}

/* A gzipped file cut short is an error that says so, not a shorter trace. */
static void truncated_gzip_is_an_error(void **state) {
  (void)state;
  char dir[512], gz[600], cut[600];
  make_dir(dir, sizeof dir);
  snprintf(gz, sizeof gz, "%s/t.csv.gz", dir);
  snprintf(cut, sizeof cut, "%s/cut.csv.gz", dir);
  char *text = big_csv();
  write_gz(gz, text);
  free(text);
  FILE *f = fopen(gz, "rb");
  assert_non_null(f);
  static char bytes[1 << 20];
  size_t n = fread(bytes, 1, sizeof bytes, f);
  fclose(f);
  assert_true(n > 100);
  f = fopen(cut, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n / 2, f), n / 2);
  assert_int_equal(fclose(f), 0);
  trace t;
  char err[512] = "";
  assert_int_equal(trace_load(cut, &t, err, sizeof err), SA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err, "read error"));
  assert_null(t.ops);
}

/* Under `bazel run` a relative path is the user's, from the folder named in
 * BUILD_WORKING_DIRECTORY; an absolute path is left alone. */
static void relative_path_is_the_users(void **state) {
  (void)state;
  char dir[512], path[600];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/rel.csv", dir);
  write_file(path, "stream,op,id,size\n1,alloc,0x10,512\n1,free,0x10,0\n");
  assert_int_equal(setenv("BUILD_WORKING_DIRECTORY", dir, 1), 0);
  trace t;
  load_ok("rel.csv", &t);
  assert_int_equal(t.nops, 2);
  trace_free(&t);
  load_ok(path, &t); /* absolute */
  trace_free(&t);
  char out[16];
  assert_false(user_path("rel.csv", out, sizeof out)); /* does not fit */

  /* Outside bazel run: as given (here, relative to the test's folder). */
  assert_int_equal(unsetenv("BUILD_WORKING_DIRECTORY"), 0);
  char err[512] = "";
  assert_int_equal(trace_load("rel.csv", &t, err, sizeof err), SA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err, "rel.csv"));
  assert_int_equal(setenv("BUILD_WORKING_DIRECTORY", "", 1), 0);
  assert_true(user_path("rel.csv", out, sizeof out));
  assert_string_equal(out, "rel.csv");
  assert_int_equal(unsetenv("BUILD_WORKING_DIRECTORY"), 0);
}

static void missing_file_and_unknown_action_are_errors(void **state) {
  (void)state;
  char dir[512], path[600];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/nope.csv", dir);
  trace t;
  char err[512] = "";
  assert_int_equal(trace_load(path, &t, err, sizeof err), SA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err, "No such file"));
  write_file(path, "stream,action,addr,size\n1,alloc,1,8\n1,freed,1,8\n");
  assert_int_equal(trace_load(path, &t, err, sizeof err), SA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err, "line 3: unknown operation 'freed'"));
}

/* Sizes the reader must refuse, each naming its line: a negative size
 * (strtoull would wrap "-1" to 2^64 - 1), and sizes whose sum no device
 * holds (the live bytes would wrap around, and the replay's capacity with
 * them). A large but possible size is read. */
static void negative_and_overflowing_sizes_are_errors(void **state) {
  (void)state;
  char dir[512], path[600];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/sizes.csv", dir);
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"stream,op,id,size\n1,alloc,0xa,-1\n", "line 2: bad size '-1'"},
      {"stream,op,id,size\n1,alloc,0xa,18446744073709551615\n1,alloc,0xb,4096\n", "line 2: "},
      {"stream,op,id,size\n1,alloc,0xa,9223372036854775808\n"
       "1,alloc,0xb,9223372036854775808\n", "line 2: "},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_file(path, cases[i].text);
    trace t;
    char err[512] = "";
    assert_int_equal(trace_load(path, &t, err, sizeof err), SA_ERR_INVALID_ARGUMENT);
    if (strstr(err, cases[i].want) == NULL) fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].want);
    assert_null(t.ops);
  }
  write_file(path, "stream,op,id,size\n1,alloc,0xa,1099511627776\n1,free,0xa,0\n"); /* 1 TiB */
  trace t;
  load_ok(path, &t);
  assert_int_equal(t.peak_live, (size_t)1 << 40);
  trace_free(&t);
}

/* A NUL byte inside a line (a file padded with zeros after a crash, say) is
 * an error naming the line: it must not join what follows it on that line
 * with the next line. */
static void nul_byte_in_a_line_is_an_error(void **state) {
  (void)state;
  char dir[512], path[600];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/nul.csv", dir);
  static const char text[] = "stream,op,id,size\n1,alloc,0xa,4096\n1,alloc,0xb,4\0" "096\n"
                             "1,free,0xa,0\n1,free,0xb,0\n";
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, sizeof text - 1, f), sizeof text - 1);
  assert_int_equal(fclose(f), 0);
  trace t;
  char err[512] = "";
  sa_status st = trace_load(path, &t, err, sizeof err);
  if (st == SA_OK) {
    size_t nops = t.nops, never = t.never_freed;
    trace_free(&t);
    fail_msg("read as %zu ops, %zu never freed, without an error", nops, never);
  }
  assert_int_equal(st, SA_ERR_INVALID_ARGUMENT);
  if (strstr(err, "line 3") == NULL) fail_msg("'%s' does not name line 3", err);
}

/* An error in a data line names the file as well as the line: replay reads
 * several traces in one run (every file of bench/traces). */
static void line_errors_name_the_file(void **state) {
  (void)state;
  char dir[512], path[600];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/named.csv", dir);
  write_file(path, "stream,op,id,size\n1,alloc,0xa,4096\n1,alloc\n");
  trace t;
  char err[512] = "";
  assert_int_equal(trace_load(path, &t, err, sizeof err), SA_ERR_INVALID_ARGUMENT);
  if (strstr(err, path) == NULL || strstr(err, "line 3") == NULL)
    fail_msg("'%s' does not name %s and its line 3", err, path);
}

/* Columns are found by name and extra ones ignored (docs/TRACE.md), also
 * when the trace's own come after twenty others (16 were read before). */
static void columns_after_many_others_are_found(void **state) {
  (void)state;
  char dir[512], path[600], text[2048];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/wide.csv", dir);
  char extra[256] = "", header[512], pad[128] = "";
  for (int i = 0; i < 20; i++) {
    size_t n = strlen(extra);
    snprintf(extra + n, sizeof extra - n, "x%d,", i);
    n = strlen(pad);
    snprintf(pad + n, sizeof pad - n, "0,");
  }
  snprintf(header, sizeof header, "%sstream,op,id,size\n", extra);
  snprintf(text, sizeof text, "%s%s1,alloc,0xa,4096\n%s1,free,0xa,0\n", header, pad, pad);
  write_file(path, text);
  trace t;
  load_ok(path, &t);
  assert_int_equal(t.nops, 2);
  assert_int_equal(t.ops[0].size, 4096);
  assert_int_equal(t.ops[1].is_free, 1);
  trace_free(&t);
}

/* An alloc or free without an id (an empty field) names no allocation: all
 * of them were one id, so each such alloc ended the one before it. */
static void empty_id_is_an_error(void **state) {
  (void)state;
  char dir[512], path[600];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/noid.csv", dir);
  write_file(path, "stream,op,id,size\n1,alloc,0xa,64\n1,alloc,,100\n1,alloc,,200\n");
  trace t;
  char err[512] = "";
  sa_status st = trace_load(path, &t, err, sizeof err);
  if (st == SA_OK) {
    size_t nops = t.nops;
    trace_free(&t);
    fail_msg("read as %zu ops without an error", nops);
  }
  assert_int_equal(st, SA_ERR_INVALID_ARGUMENT);
  if (strstr(err, "line 3") == NULL) fail_msg("'%s' does not name line 3", err);
}

/* Out of memory is an error with a message like any other: trace_load left
 * err unwritten, and replay printed it (stack garbage). A child caps its
 * address space and reads a 64 MiB line, which the line buffer cannot
 * hold. */
static void out_of_memory_is_an_error_with_a_message(void **state) {
  (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  skip(); /* their shadow memory does not live under an address-space cap */
#endif
  char dir[512], path[600];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/long.csv.gz", dir);
  static char xs[1 << 20];
  memset(xs, 'x', sizeof xs);
  gzFile gz = gzopen(path, "wb1");
  assert_non_null(gz);
  assert_true(gzputs(gz, "stream,op,id,size,note\n1,alloc,0xa,64,") > 0);
  for (int i = 0; i < 64; i++) assert_int_equal(gzwrite(gz, xs, sizeof xs), (int)sizeof xs);
  assert_int_equal(gzclose(gz), Z_OK);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL || fscanf(f, "%lu", &pages) != 1) _exit(3);
    fclose(f);
    rlim_t cap = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)16 << 20);
    struct rlimit rl = {cap, cap};
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
    trace t;
    char err[512];
    memset(err, '?', sizeof err); /* no terminating NUL unless trace_load writes one */
    sa_status st = trace_load(path, &t, err, sizeof err);
    if (st != SA_ERR_OUT_OF_MEMORY) _exit(4);
    if (memchr(err, '\0', sizeof err) == NULL || strstr(err, "out of memory") == NULL) _exit(5);
    _exit(0);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) != 0)
    fail_msg("child exit %d (4: not out of memory, 5: no message in err)", WEXITSTATUS(status));
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(pytorch_free_is_at_free_requested),
      cmocka_unit_test(pytorch_odd_histories_are_counted),
      cmocka_unit_test(gzipped_trace_reads_as_plain),
      cmocka_unit_test(truncated_gzip_is_an_error),
      cmocka_unit_test(relative_path_is_the_users),
      cmocka_unit_test(missing_file_and_unknown_action_are_errors),
      cmocka_unit_test(negative_and_overflowing_sizes_are_errors),
      cmocka_unit_test(nul_byte_in_a_line_is_an_error),
      cmocka_unit_test(line_errors_name_the_file),
      cmocka_unit_test(columns_after_many_others_are_found),
      cmocka_unit_test(empty_id_is_an_error),
      cmocka_unit_test(out_of_memory_is_an_error_with_a_message),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
