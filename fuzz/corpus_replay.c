/* Replays the fuzz corpus through the fuzz target without libFuzzer, so the
 * target's reference-model checks run in `bazel test //...` with gcc and
 * under every sanitizer config (the coverage-guided run is fuzz/run.sh).
 * Each file under the directory given as argv[1] is one input; the target
 * aborts on any finding, which fails the test.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return -1;
  uint8_t buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  int err = ferror(f);
  fclose(f);
  if (err) return -1;
  LLVMFuzzerTestOneInput(buf, n);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: corpus_replay CORPUS_DIR\n");
    return 2;
  }
  DIR *dir = opendir(argv[1]);
  if (dir == NULL) {
    perror(argv[1]);
    return 2;
  }
  unsigned replayed = 0, unreadable = 0;
  struct dirent *de;
  while ((de = readdir(dir)) != NULL) {
    if (de->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", argv[1], de->d_name);
    if (replay(path) == 0)
      replayed++;
    else
      unreadable++;
  }
  closedir(dir);
  printf("corpus_replay: %u passed, %u failed\n", replayed, unreadable);
  return replayed > 0 && unreadable == 0 ? 0 : 1;
}
