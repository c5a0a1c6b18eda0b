/* sa_config_init and sa_config_parse: defaults, every key, size suffixes,
 * and that a bad spec names the offender and leaves the config unchanged.
 * sa_config_check: a configuration that parses but cannot work on its
 * device gets the status sa_arena_create gives it and a message naming the
 * key, the value and the rule; the granularity is public. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamarena/streamarena.h>

/* Parse spec into a fresh default config; returns the status. */
static sa_status parse(sa_config *c, const char *spec, char *err, size_t err_size) {
  sa_config_init(c);
  return sa_config_parse(c, spec, err, err_size);
}

/* Parse a single size key and return the bytes it set. */
static size_t parsed_size(const char *spec) {
  sa_config c;
  char err[256];
  sa_status s = parse(&c, spec, err, sizeof err);
  if (s != SA_OK) fail_msg("'%s' failed: %s", spec, err);
  return c.superblock_size;
}

static void defaults_are_documented(void **state) {
  (void)state;
  sa_config c;
  memset(&c, 0xab, sizeof c);
  sa_config_init(&c);
  assert_int_equal(c.device, 0);
  assert_int_equal(c.backend, SA_BACKEND_AUTO);
  assert_int_equal(c.peer_access, 0);
  assert_int_equal(c.superblock_size, 0);
  assert_int_equal(c.va_reserve_bytes, 0);
  assert_int_equal(c.max_physical_bytes, 0);
  assert_int_equal(c.release_threshold_bytes, 0);
  assert_int_equal(c.large_threshold, 0);
  assert_true(c.footprint_target == 0);
  assert_int_equal(c.flags, SA_FLAG_KEEP_SPANS); /* the one flag on by default */
  assert_string_equal(c.trace_path, "");
  assert_null(c.oom_callback);
  assert_null(c.oom_user_data);
}

static void init_accepts_null(void **state) {
  (void)state;
  sa_config_init(NULL); /* must not crash */
}

static void every_key_sets_its_field(void **state) {
  (void)state;
  sa_config c;
  char err[256];
  assert_int_equal(parse(&c,
                         "device=3,backend=host,superblock_size=4MiB,va_reserve=1TiB,"
                         "max_physical=8GiB,release_threshold=1GiB,large_threshold=512KiB,"
                         "check_stream_order=1,oom_report=1,trace=/tmp/sa.trace,peer_access=1+2,"
                         "chunk_size=8MiB,exact_growth=1,initial_physical=3GiB,"
                         "footprint_target=1.5",
                         err, sizeof err),
                   SA_OK);
  assert_string_equal(err, "");
  assert_int_equal(c.device, 3);
  assert_int_equal(c.backend, SA_BACKEND_HOST);
  assert_int_equal(c.peer_access, 6);
  assert_int_equal(c.superblock_size, (size_t)4 << 20);
  assert_int_equal(c.va_reserve_bytes, (size_t)1 << 40);
  assert_int_equal(c.max_physical_bytes, (size_t)8 << 30);
  assert_int_equal(c.release_threshold_bytes, (size_t)1 << 30);
  assert_int_equal(c.large_threshold, (size_t)512 << 10);
  assert_int_equal(c.chunk_size, (size_t)8 << 20);
  assert_int_equal(c.initial_physical_bytes, (size_t)3 << 30);
  assert_true(c.footprint_target == 1.5);
  assert_int_equal(c.flags, SA_FLAG_CHECK_STREAM_ORDER | SA_FLAG_OOM_REPORT | SA_FLAG_EXACT_GROWTH |
                               SA_FLAG_KEEP_SPANS);
  assert_string_equal(c.trace_path, "/tmp/sa.trace");
}

static void backend_values(void **state) {
  (void)state;
  sa_config c;
  assert_int_equal(parse(&c, "backend=cuda", NULL, 0), SA_OK);
  assert_int_equal(c.backend, SA_BACKEND_CUDA);
  assert_int_equal(parse(&c, "backend=host,backend=auto", NULL, 0), SA_OK);
  assert_int_equal(c.backend, SA_BACKEND_AUTO);
}

static void peer_access_values(void **state) {
  (void)state;
  sa_config c;
  assert_int_equal(parse(&c, "peer_access=1", NULL, 0), SA_OK);
  assert_int_equal(c.peer_access, 2);
  assert_int_equal(parse(&c, "peer_access=0+2 + 63,device=1", NULL, 0), SA_OK);
  assert_int_equal(c.peer_access, 1 | 4 | (uint64_t)1 << 63);
  assert_int_equal(c.device, 1);
  assert_int_equal(parse(&c, "peer_access=all", NULL, 0), SA_OK);
  assert_true(c.peer_access == SA_PEER_ACCESS_ALL);
  assert_int_equal(parse(&c, "peer_access=all,peer_access=none", NULL, 0), SA_OK);
  assert_int_equal(c.peer_access, 0);
}

/* Named points and plain decimals; the last item wins. */
static void footprint_target_values(void **state) {
  (void)state;
  sa_config c;
  static const struct {
    const char *spec;
    double target;
  } ok[] = {
      {"footprint_target=tight", SA_FOOTPRINT_TIGHT},
      {"footprint_target=balanced", SA_FOOTPRINT_BALANCED},
      {"footprint_target=fast", SA_FOOTPRINT_FAST},
      {"footprint_target=1", 1.0},
      {"footprint_target=1.25", 1.25},
      {"footprint_target= 8 ", 8.0},
      {"footprint_target=fast,footprint_target=2.", 2.0},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    if (parse(&c, ok[i].spec, NULL, 0) != SA_OK) fail_msg("'%s' refused", ok[i].spec);
    if (c.footprint_target != ok[i].target)
      fail_msg("'%s' gave %g, expected %g", ok[i].spec, c.footprint_target, ok[i].target);
  }
}

static void flags_turn_off_again(void **state) {
  (void)state;
  sa_config c;
  assert_int_equal(parse(&c, "check_stream_order=1,oom_report=1,check_stream_order=0", NULL, 0),
                   SA_OK);
  assert_int_equal(c.flags, SA_FLAG_OOM_REPORT | SA_FLAG_KEEP_SPANS);
  assert_int_equal(parse(&c, "keep_spans=0", NULL, 0), SA_OK);
  assert_int_equal(c.flags, 0);
  assert_int_equal(parse(&c, "background_growth=1", NULL, 0), SA_OK);
  assert_int_equal(c.flags, SA_FLAG_KEEP_SPANS | SA_FLAG_BACKGROUND_GROWTH);
  assert_int_equal(parse(&c, "background_growth=1,background_growth=0", NULL, 0), SA_OK);
  assert_int_equal(c.flags, SA_FLAG_KEEP_SPANS);
}

static void size_suffixes(void **state) {
  (void)state;
  assert_int_equal(parsed_size("superblock_size=0"), 0);
  assert_int_equal(parsed_size("superblock_size=4096"), 4096);
  assert_int_equal(parsed_size("superblock_size=4096B"), 4096);
  assert_int_equal(parsed_size("superblock_size=3K"), 3 << 10);
  assert_int_equal(parsed_size("superblock_size=3KiB"), 3 << 10);
  assert_int_equal(parsed_size("superblock_size=3M"), (size_t)3 << 20);
  assert_int_equal(parsed_size("superblock_size=3MiB"), (size_t)3 << 20);
  assert_int_equal(parsed_size("superblock_size=3G"), (size_t)3 << 30);
  assert_int_equal(parsed_size("superblock_size=3GiB"), (size_t)3 << 30);
  assert_int_equal(parsed_size("superblock_size=3T"), (size_t)3 << 40);
  assert_int_equal(parsed_size("superblock_size=3TiB"), (size_t)3 << 40);
  /* Case and spacing are forgiven; the number itself is not. */
  assert_int_equal(parsed_size("superblock_size=2mib"), (size_t)2 << 20);
  assert_int_equal(parsed_size("superblock_size = 2 MiB "), (size_t)2 << 20);
  assert_int_equal(parsed_size(" superblock_size=2MiB ,"), (size_t)2 << 20);
}

static void largest_sizes_fit(void **state) {
  (void)state;
  char spec[64];
  snprintf(spec, sizeof spec, "superblock_size=%zu", (size_t)SIZE_MAX);
  assert_int_equal(parsed_size(spec), SIZE_MAX);
  /* 2^24 TiB = 2^64 would overflow; one less fits in 64 bits. */
  assert_int_equal(parsed_size("superblock_size=16777215TiB"), (size_t)16777215 << 40);
}

static void empty_and_null_specs_change_nothing(void **state) {
  (void)state;
  sa_config c, before;
  sa_config_init(&c);
  c.device = 5;
  before = c;
  assert_int_equal(sa_config_parse(&c, NULL, NULL, 0), SA_OK);
  assert_int_equal(sa_config_parse(&c, "", NULL, 0), SA_OK);
  assert_int_equal(sa_config_parse(&c, " , ,", NULL, 0), SA_OK);
  assert_memory_equal(&c, &before, sizeof c);
}

static void null_config_is_invalid_argument(void **state) {
  (void)state;
  char err[64];
  assert_int_equal(sa_config_parse(NULL, "device=1", err, sizeof err), SA_ERR_INVALID_ARGUMENT);
}

/* Each bad spec fails with SA_ERR_BAD_CONFIG, names `needle` in the message,
 * and leaves a config that already holds other values bit-for-bit alone. */
static void expect_bad(const char *spec, const char *needle) {
  sa_config c, before;
  sa_config_init(&c);
  assert_int_equal(sa_config_parse(&c, "device=2,backend=host,superblock_size=8MiB,trace=x",
                                    NULL, 0),
                   SA_OK);
  before = c;
  char err[256];
  memset(err, 'z', sizeof err);
  sa_status s = sa_config_parse(&c, spec, err, sizeof err);
  if (s != SA_ERR_BAD_CONFIG) fail_msg("'%s': status %d, expected SA_ERR_BAD_CONFIG", spec, s);
  if (strstr(err, needle) == NULL) fail_msg("'%s': message '%s' lacks '%s'", spec, err, needle);
  assert_memory_equal(&c, &before, sizeof c);
}

static void unknown_key(void **state) {
  (void)state;
  expect_bad("superblok_size=4MiB", "superblok_size");
  expect_bad("Device=1", "Device");
  /* A later error undoes earlier good items too. */
  expect_bad("device=1,backend=cuda,nope=1", "nope");
  /* A typo names the key meant; a key far from every known one gets the list
   * (STREAMARENA_CONF's users have no --help to ask). */
  expect_bad("superblok_size=4MiB",
             "unknown key 'superblok_size' (did you mean 'superblock_size'?)");
  expect_bad("BACKEND=host", "(did you mean 'backend'?)");
  expect_bad("nope=1", "unknown key 'nope'; keys: device, backend, peer_access,");
  expect_bad("nope=1", ", oom_report, exact_growth, trace");
}

static void bad_numbers(void **state) {
  (void)state;
  expect_bad("superblock_size=abc", "abc");
  expect_bad("superblock_size=-1", "superblock_size");
  expect_bad("superblock_size=+1", "superblock_size");
  expect_bad("superblock_size=1.5MiB", "1.5MiB");
  expect_bad("superblock_size=0x100", "0x100");
  expect_bad("superblock_size=MiB", "MiB");
  expect_bad("device=-1", "device");
  expect_bad("device=1K", "device");
  expect_bad("device=2147483648", "2147483648");
  expect_bad("check_stream_order=2", "check_stream_order");
  expect_bad("oom_report=yes", "oom_report");
  expect_bad("backend=gpu", "gpu");
  expect_bad("backend=HOST", "backend");
  expect_bad("peer_access=64", "peer_access");
  expect_bad("peer_access=1+", "peer_access");
  expect_bad("peer_access=+1", "peer_access");
  expect_bad("peer_access=1++2", "peer_access");
  expect_bad("peer_access=-1", "peer_access");
  expect_bad("peer_access=ALL", "peer_access");
  expect_bad("peer_access=1x", "1x");
  /* The footprint target: a named point or a number from 1 to 8, no more. */
  expect_bad("footprint_target=0.99", "footprint_target");
  expect_bad("footprint_target=0", "from 1 to 8");
  expect_bad("footprint_target=8.01", "8.01");
  expect_bad("footprint_target=-1.5", "-1.5");
  expect_bad("footprint_target=1e1", "1e1");
  expect_bad("footprint_target=inf", "inf");
  expect_bad("footprint_target=nan", "nan");
  expect_bad("footprint_target=.5", ".5");
  expect_bad("footprint_target=1.2.3", "1.2.3");
  expect_bad("footprint_target=Fast", "tight, balanced, fast");
  expect_bad("footprint_target=1.5MiB", "1.5MiB");
  /* ',' separates items: "0,1" is peer_access=0 and an item "1". */
  expect_bad("peer_access=0,1", "missing '='");
}

static void overflow(void **state) {
  (void)state;
  expect_bad("va_reserve=18446744073709551616", "va_reserve");
  expect_bad("va_reserve=99999999999999999999999999", "va_reserve");
  expect_bad("va_reserve=16777216TiB", "va_reserve");
  expect_bad("max_physical=17179869184GiB", "max_physical");
  expect_bad("device=99999999999999999999", "device");
}

static void empty_value(void **state) {
  (void)state;
  expect_bad("superblock_size=", "superblock_size");
  expect_bad("backend= ", "backend");
  expect_bad("trace=", "trace");
  expect_bad("device", "device");
  expect_bad("=4MiB", "key");
}

static void trailing_junk(void **state) {
  (void)state;
  expect_bad("superblock_size=4MiBx", "4MiBx");
  expect_bad("superblock_size=4 MiB B", "superblock_size");
  expect_bad("superblock_size=4KB", "4KB");
  expect_bad("device=1 2", "device");
  expect_bad("release_threshold=1GiB=2", "release_threshold");
}

static void trace_path_too_long(void **state) {
  (void)state;
  char spec[400];
  int n = snprintf(spec, sizeof spec, "trace=");
  memset(spec + n, 'p', 256);
  spec[n + 256] = '\0';
  expect_bad(spec, "trace");
  /* 255 bytes fit, with the NUL. */
  spec[n + 255] = '\0';
  sa_config c;
  assert_int_equal(parse(&c, spec, NULL, 0), SA_OK);
  assert_int_equal(strlen(c.trace_path), 255);
}

static void message_is_truncated_safely(void **state) {
  (void)state;
  sa_config c;
  char err[8];
  memset(err, 'z', sizeof err);
  assert_int_equal(parse(&c, "no_such_key=1", err, sizeof err), SA_ERR_BAD_CONFIG);
  assert_int_equal(strlen(err), sizeof err - 1);
  /* A zero-size or NULL buffer is never written. */
  char untouched = 'q';
  assert_int_equal(parse(&c, "no_such_key=1", &untouched, 0), SA_ERR_BAD_CONFIG);
  assert_int_equal(untouched, 'q');
  assert_int_equal(parse(&c, "no_such_key=1", NULL, 16), SA_ERR_BAD_CONFIG);
}

static void status_strings_cover_every_code(void **state) {
  (void)state;
  for (int s = 0; s < SA_STATUS_COUNT_; s++) {
    const char *text = sa_status_string((sa_status)s);
    assert_non_null(text);
    assert_string_not_equal(text, "unknown status");
    for (int t = 0; t < s; t++) assert_string_not_equal(text, sa_status_string((sa_status)t));
  }
  assert_string_equal(sa_status_string(SA_OK), "ok");
  assert_string_equal(sa_status_string(SA_ERR_BAD_CONFIG), "bad configuration");
  assert_string_equal(sa_status_string(SA_STATUS_COUNT_), "unknown status");
  assert_string_equal(sa_status_string((sa_status)-1), "unknown status");
}

static void backend_names(void **state) {
  (void)state;
  assert_string_equal(sa_backend_name(SA_BACKEND_AUTO), "auto");
  assert_string_equal(sa_backend_name(SA_BACKEND_CUDA), "cuda");
  assert_string_equal(sa_backend_name(SA_BACKEND_HOST), "host");
  assert_string_equal(sa_backend_name((sa_backend)42), "unknown");
}

/* spec (on the host backend) must fail sa_config_check and sa_arena_create
 * alike with want; the check's message must hold each of the needles. */
static void expect_rule(const char *spec, sa_status want, const char *n1, const char *n2,
                        const char *n3) {
  sa_config c;
  char err[256];
  sa_config_init(&c);
  assert_int_equal(sa_config_parse(&c, "backend=host", NULL, 0), SA_OK);
  if (sa_config_parse(&c, spec, err, sizeof err) != SA_OK) fail_msg("'%s': %s", spec, err);
  memset(err, 'z', sizeof err);
  sa_status got = sa_config_check(&c, err, sizeof err);
  if (got != want)
    fail_msg("'%s': sa_config_check gave %s (%s), expected %s", spec, sa_status_string(got), err,
             sa_status_string(want));
  const char *needles[] = {n1, n2, n3};
  for (int i = 0; i < 3; i++)
    if (needles[i] != NULL && strstr(err, needles[i]) == NULL)
      fail_msg("'%s': message '%s' lacks '%s'", spec, err, needles[i]);
  sa_arena *a = NULL;
  got = sa_arena_create(&c, &a);
  if (got != want) fail_msg("'%s': sa_arena_create gave %s", spec, sa_status_string(got));
  assert_null(a);
}

static void check_names_key_value_and_rule(void **state) {
  (void)state;
  expect_rule("superblock_size=3MiB", SA_ERR_BAD_CONFIG, "superblock_size=3MiB", "granularity",
              "2MiB");
  expect_rule("superblock_size=2GiB", SA_ERR_BAD_CONFIG, "superblock_size=2GiB", "1GiB", NULL);
  expect_rule("chunk_size=3MiB", SA_ERR_BAD_CONFIG, "chunk_size=3MiB", "granularity", "2MiB");
  expect_rule("chunk_size=4GiB", SA_ERR_BAD_CONFIG, "chunk_size=4GiB", "2GiB", NULL);
  expect_rule("max_physical=64MiB,initial_physical=128MiB", SA_ERR_BAD_CONFIG,
              "initial_physical=128MiB", "max_physical", "64MiB");
  expect_rule("reserve_limit=64MiB,initial_physical=128MiB", SA_ERR_BAD_CONFIG,
              "initial_physical=128MiB", "reserve_limit=64MiB", NULL);
  expect_rule("va_reserve=64MiB,initial_physical=128MiB", SA_ERR_BAD_CONFIG,
              "initial_physical=128MiB", "va_reserve=64MiB", NULL);
  /* A 33 MiB request is a 36 MiB block: no 34 MiB superblock holds one. */
  expect_rule("superblock_size=34MiB,large_threshold=34MiB", SA_ERR_BAD_CONFIG,
              "large_threshold=34MiB", "36MiB", "at most 32MiB");
  expect_rule("large_threshold=100", SA_ERR_BAD_CONFIG, "large_threshold=100", "256", NULL);
  expect_rule("superblock_size=8MiB,max_physical=4MiB", SA_ERR_BAD_CONFIG, "max_physical=4MiB",
              "superblock_size=8MiB", "physical cap");
  expect_rule("va_reserve=1000TiB", SA_ERR_BAD_CONFIG, "va_reserve=1000TiB", "64TiB", NULL);
  expect_rule("superblock_size=4MiB,va_reserve=2MiB", SA_ERR_BAD_CONFIG, "va_reserve=2MiB",
              "superblock_size=4MiB", NULL);
  expect_rule("trace=/nonexistent-dir/trace.csv", SA_ERR_BAD_CONFIG,
              "trace=/nonexistent-dir/trace.csv", "No such file", NULL);
  expect_rule("trace=/", SA_ERR_BAD_CONFIG, "trace=/", "directory", NULL);
  expect_rule("device=7", SA_ERR_NO_DEVICE, "device=7", "host", NULL);
  /* A budget replaces the footprint target: one or the other. */
  expect_rule("footprint_target=1.5,reserve_limit=1GiB", SA_ERR_BAD_CONFIG,
              "footprint_target=1.5", "reserve_limit=1GiB", "one of them");
}

/* initial_physical is mapped in whole granules: 3 MiB maps 4 MiB, which a
 * cap of 3 MiB cannot hold. sa_config_check must say so, as sa_arena_create
 * refuses it (it gave SA_ERR_OUT_OF_MEMORY after check said SA_OK). */
static void initial_physical_is_checked_after_rounding(void **state) {
  (void)state;
  expect_rule("max_physical=3MiB,initial_physical=3MiB", SA_ERR_BAD_CONFIG,
              "initial_physical=3MiB", "max_physical", "4MiB");
  expect_rule("max_physical=5MiB,initial_physical=4194305", SA_ERR_BAD_CONFIG,
              "initial_physical=4194305", "6MiB", NULL);
  /* So under a budget: 3 MiB maps 4 MiB, past reserve_limit=3MiB from the
   * start (accepted before, as if the budget were not rounded to). */
  expect_rule("reserve_limit=3MiB,initial_physical=3MiB", SA_ERR_BAD_CONFIG,
              "initial_physical=3MiB", "reserve_limit=3MiB", "4MiB");
  /* Rounded up to no more than the cap: accepted by both. */
  sa_config c;
  sa_config_init(&c);
  assert_int_equal(sa_config_parse(&c, "backend=host,max_physical=4MiB,initial_physical=3MiB",
                                   NULL, 0),
                   SA_OK);
  assert_int_equal(sa_config_check(&c, NULL, 0), SA_OK);
  sa_arena *a;
  assert_int_equal(sa_arena_create(&c, &a), SA_OK);
  assert_int_equal(sa_arena_destroy(a), SA_OK);
}

/* A footprint target set in the structure, not parsed, meets the same rule
 * at sa_config_check and sa_arena_create: a number from 1 to 8, or 0. */
static void check_names_a_bad_footprint_target(void **state) {
  (void)state;
  const double bad[] = {0.5, 8.5, -1, NAN, INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    sa_config c;
    sa_config_init(&c);
    c.backend = SA_BACKEND_HOST;
    c.footprint_target = bad[i];
    char err[256] = "";
    assert_int_equal(sa_config_check(&c, err, sizeof err), SA_ERR_BAD_CONFIG);
    if (strstr(err, "footprint_target=") == NULL || strstr(err, "from 1 to 8") == NULL)
      fail_msg("%g: '%s'", bad[i], err);
    sa_arena *a = NULL;
    assert_int_equal(sa_arena_create(&c, &a), SA_ERR_BAD_CONFIG);
    assert_null(a);
  }
  sa_config c;
  sa_config_init(&c);
  c.backend = SA_BACKEND_HOST;
  c.footprint_target = SA_FOOTPRINT_FAST;
  assert_int_equal(sa_config_check(&c, NULL, 0), SA_OK);
}

static void check_accepts_what_create_accepts(void **state) {
  (void)state;
  const char *good[] = {
      "",
      "superblock_size=34MiB,large_threshold=32MiB",
      "superblock_size=6MiB,large_threshold=6MiB",
      "superblock_size=2MiB,large_threshold=2MiB,max_physical=2MiB,va_reserve=2MiB",
      "superblock_size=1GiB,large_threshold=1GiB", /* thresholds stop at 64 MiB */
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    sa_config c;
    char err[256] = "unset";
    sa_config_init(&c);
    assert_int_equal(sa_config_parse(&c, "backend=host", NULL, 0), SA_OK);
    assert_int_equal(sa_config_parse(&c, good[i], NULL, 0), SA_OK);
    if (sa_config_check(&c, err, sizeof err) != SA_OK) fail_msg("'%s': %s", good[i], err);
    assert_string_equal(err, "");
    sa_arena *a;
    assert_int_equal(sa_arena_create(&c, &a), SA_OK);
    assert_int_equal(sa_arena_destroy(a), SA_OK);
  }
  assert_int_equal(sa_config_check(NULL, NULL, 0), SA_OK); /* the defaults */
}

/* The check's message must name what is wrong when the environment is: it
 * said "backend=auto,device=0: bad configuration" for STREAMARENA_BACKEND=gpu. */
static void check_names_a_bad_backend_variable(void **state) {
  (void)state;
  setenv("STREAMARENA_BACKEND", "gpu", 1);
  char err[256];
  sa_status st = sa_config_check(NULL, err, sizeof err);
  unsetenv("STREAMARENA_BACKEND");
  assert_int_equal(st, SA_ERR_BAD_CONFIG);
  if (strstr(err, "STREAMARENA_BACKEND") == NULL) fail_msg("'%s' lacks STREAMARENA_BACKEND", err);
}

static void granularity_is_public(void **state) {
  (void)state;
  size_t g = 0;
  assert_int_equal(sa_device_granularity(SA_BACKEND_HOST, 0, &g), SA_OK);
  assert_int_equal(g, (size_t)2 << 20);
  assert_int_equal(sa_device_granularity(SA_BACKEND_HOST, 0, NULL), SA_ERR_INVALID_ARGUMENT);
  assert_int_equal(sa_device_granularity(SA_BACKEND_HOST, 5, &g), SA_ERR_NO_DEVICE);
  sa_config c;
  sa_config_init(&c);
  c.backend = SA_BACKEND_HOST;
  sa_arena *a;
  assert_int_equal(sa_arena_create(&c, &a), SA_OK);
  assert_int_equal(sa_arena_granularity(a), (size_t)2 << 20);
  assert_int_equal(sa_arena_granularity(NULL), 0);
  assert_int_equal(sa_arena_destroy(a), SA_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults_are_documented),
      cmocka_unit_test(check_names_key_value_and_rule),
      cmocka_unit_test(check_accepts_what_create_accepts),
      cmocka_unit_test(check_names_a_bad_footprint_target),
      cmocka_unit_test(initial_physical_is_checked_after_rounding),
      cmocka_unit_test(granularity_is_public),
      cmocka_unit_test(check_names_a_bad_backend_variable),
      cmocka_unit_test(init_accepts_null),
      cmocka_unit_test(every_key_sets_its_field),
      cmocka_unit_test(backend_values),
      cmocka_unit_test(peer_access_values),
      cmocka_unit_test(footprint_target_values),
      cmocka_unit_test(flags_turn_off_again),
      cmocka_unit_test(size_suffixes),
      cmocka_unit_test(largest_sizes_fit),
      cmocka_unit_test(empty_and_null_specs_change_nothing),
      cmocka_unit_test(null_config_is_invalid_argument),
      cmocka_unit_test(unknown_key),
      cmocka_unit_test(bad_numbers),
      cmocka_unit_test(overflow),
      cmocka_unit_test(empty_value),
      cmocka_unit_test(trailing_junk),
      cmocka_unit_test(trace_path_too_long),
      cmocka_unit_test(message_is_truncated_safely),
      cmocka_unit_test(status_strings_cover_every_code),
      cmocka_unit_test(backend_names),
  };
  return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
