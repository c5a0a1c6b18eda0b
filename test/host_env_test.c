/* The host simulator's device memory from STREAMARENA_HOST_DEVICE_BYTES.
 * The variable is read once per process, so each case runs this binary
 * again as a probe (--probe) with the variable set, and reads its report. */
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <streamarena/host.h>

#include "driver/driver.h"
#include "test/util.h"

#define VAR "STREAMARENA_HOST_DEVICE_BYTES"

extern char **environ;

/* The probe: device memory as the simulator sees it, and how many 2 MiB
 * chunks fit (at most 16). */
static int probe(void) {
  sa_driver *d = NULL;
  size_t total = 0, n = 0;
  sa_chunk_handle c[16];
  if (sa_driver_host_open(0, &d) != SA_OK || d->ops->total_memory(d, &total) != SA_OK) return 2;
  while (n < 16 && d->ops->chunk_create(d, 2 * MiB, &c[n]) == SA_OK) n++;
  for (size_t i = 0; i < n; i++) {
    if (d->ops->chunk_release(d, c[i]) != SA_OK) return 3;
  }
  sa_driver_close(d);
  printf("total=%zu chunks=%zu\n", total, n);
  return 0;
}

typedef struct report_s {
  size_t total, chunks;
  char text[2048]; /* stdout and stderr together */
} report;

/* Run the probe with VAR=value (value NULL: unset). */
static void run_probe(const char *value, report *r) {
  size_t n = 0;
  while (environ[n] != NULL) n++;
  char **env = calloc(n + 2, sizeof *env);
  assert_non_null(env);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (strncmp(environ[i], VAR "=", strlen(VAR) + 1) != 0) env[k++] = environ[i];
  }
  char setting[256];
  if (value != NULL) {
    snprintf(setting, sizeof setting, "%s=%s", VAR, value);
    env[k++] = setting;
  }
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  posix_spawn_file_actions_t fa;
  assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
  assert_int_equal(posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO), 0);
  assert_int_equal(posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO), 0);
  assert_int_equal(posix_spawn_file_actions_addclose(&fa, fds[0]), 0);
  char *argv[] = {"host_env_test", "--probe", NULL};
  pid_t pid;
  assert_int_equal(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, env), 0);
  posix_spawn_file_actions_destroy(&fa);
  free(env);
  close(fds[1]);
  size_t len = 0;
  ssize_t got;
  while ((got = read(fds[0], r->text + len, sizeof r->text - 1 - len)) > 0) len += (size_t)got;
  r->text[len] = '\0';
  close(fds[0]);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  const char *line = strstr(r->text, "total=");
  assert_non_null(line);
  assert_int_equal(sscanf(line, "total=%zu chunks=%zu", &r->total, &r->chunks), 2);
}

static void variable_sets_the_device_memory(void **state) {
  (void)state;
  report r;
  run_probe("6MiB", &r);
  assert_int_equal(r.total, 6 * MiB);
  assert_int_equal(r.chunks, 3);
  run_probe("8388608", &r);
  assert_int_equal(r.total, 8 * MiB);
  assert_int_equal(r.chunks, 4);
  run_probe("4m", &r);
  assert_int_equal(r.total, 4 * MiB);
  run_probe("1GiB", &r);
  assert_int_equal(r.total, 1024 * MiB);
  assert_int_equal(r.chunks, 16);
}

static void without_the_variable_the_device_has_16gib(void **state) {
  (void)state;
  report r;
  run_probe(NULL, &r);
  assert_int_equal(r.total, (size_t)16 << 30);
  assert_null(strstr(r.text, VAR));
}

static void bad_values_keep_the_default_with_a_warning(void **state) {
  (void)state;
  const char *bad[] = {"lots", "1MiB", "-4GiB", "12 GiB", "3XiB", "99999999999999999999", "16EiB",
                       "4GB", "4Mi", "4MiBB"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    report r;
    run_probe(bad[i], &r);
    if (r.total != (size_t)16 << 30 || strstr(r.text, VAR) == NULL) {
      fail_msg("%s=\"%s\": total %zu, output: %s", VAR, bad[i], r.total, r.text);
    }
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--probe") == 0) return probe();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(variable_sets_the_device_memory),
      cmocka_unit_test(without_the_variable_the_device_has_16gib),
      cmocka_unit_test(bad_values_keep_the_default_with_a_warning),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
