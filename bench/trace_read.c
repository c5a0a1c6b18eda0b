/* Reading allocation traces: see trace_read.h. */
#include "trace_read.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <zlib.h>

#include "user_path.h"

#define MAX_FIELDS 64 /* columns read per line; the rest are ignored */
/* Live bytes past this are no device's: a malformed size, refused before
 * sums (and the replay's capacity from them) wrap around. */
#define TRACE_MAX_LIVE ((size_t)1 << 56) /* 64 PiB */

/* A string -> number map (open addressing). Keys are copied. */
typedef struct smap_s {
  char **keys;
  uint32_t *vals;
  size_t cap, n;
} smap;

static uint64_t hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static bool smap_grow(smap *m) {
  size_t cap = m->cap ? m->cap * 2 : 1024;
  char **keys = calloc(cap, sizeof *keys);
  uint32_t *vals = calloc(cap, sizeof *vals);
  if (keys == NULL || vals == NULL) {
    free(keys);
    free(vals);
    return false;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (m->keys[i] == NULL || m->keys[i] == (char *)m) continue; /* empty or deleted */
    size_t j = hash(m->keys[i]) & (cap - 1);
    while (keys[j] != NULL) j = (j + 1) & (cap - 1);
    keys[j] = m->keys[i];
    vals[j] = m->vals[i];
  }
  free(m->keys);
  free(m->vals);
  m->keys = keys;
  m->vals = vals;
  m->cap = cap;
  return true;
}

/* The slot of key (SIZE_MAX if absent). Deleted slots hold the map's address. */
static size_t smap_find(const smap *m, const char *key) {
  if (m->cap == 0) return SIZE_MAX;
  for (size_t j = hash(key) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
    if (m->keys[j] == NULL) return SIZE_MAX;
    if (m->keys[j] != (char *)m && strcmp(m->keys[j], key) == 0) return j;
  }
}

static bool smap_put(smap *m, const char *key, uint32_t val) {
  if ((m->n + 1) * 2 > m->cap && !smap_grow(m)) return false;
  size_t j = hash(key) & (m->cap - 1);
  while (m->keys[j] != NULL && m->keys[j] != (char *)m) j = (j + 1) & (m->cap - 1);
  m->keys[j] = strdup(key);
  if (m->keys[j] == NULL) return false;
  m->vals[j] = val;
  m->n++;
  return true;
}

static void smap_del(smap *m, size_t j) {
  free(m->keys[j]);
  m->keys[j] = (char *)m; /* tombstone: keeps probe chains intact */
}

static void smap_fini(smap *m) {
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i] != (char *)m) free(m->keys[i]);
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

/* Split line at commas in place; trims blanks. Returns the field count. */
static size_t split(char *line, char **fields) {
  size_t n = 0;
  char *p = line;
  for (;;) {
    while (*p == ' ' || *p == '\t') p++;
    if (n < MAX_FIELDS) fields[n++] = p;
    char *c = strchr(p, ',');
    char *end = c != NULL ? c : p + strlen(p);
    while (end > p && isspace((unsigned char)end[-1])) end--;
    *end = '\0';
    if (c == NULL) break;
    p = c + 1;
  }
  return n;
}

static int column(char **names, size_t n, const char *a, const char *b) {
  for (size_t i = 0; i < n; i++)
    if (strcasecmp(names[i], a) == 0 || (b != NULL && strcasecmp(names[i], b) == 0))
      return (int)i;
  return -1;
}

typedef struct loader_s {
  trace *t;
  size_t cap_ops;
  smap live, streams, threads;
  smap freeing; /* PyTorch: freed, not yet free_completed */
  size_t *slot_size; /* requested size of each slot */
  size_t cap_slots;
  size_t live_bytes;
} loader;

static bool push_op(loader *l, trace_op op) {
  trace *t = l->t;
  if (t->nops == l->cap_ops) {
    size_t cap = l->cap_ops ? 2 * l->cap_ops : 4096;
    trace_op *ops = realloc(t->ops, cap * sizeof *ops);
    if (ops == NULL) return false;
    t->ops = ops;
    l->cap_ops = cap;
  }
  t->ops[t->nops++] = op;
  return true;
}

static bool intern(smap *m, const char *key, size_t *count, uint32_t *out) {
  size_t j = smap_find(m, key);
  if (j != SIZE_MAX) {
    *out = m->vals[j];
    return true;
  }
  *out = (uint32_t)*count;
  if (!smap_put(m, key, *out)) return false;
  (*count)++;
  return true;
}

/* What a line's op or action asks for, over the three dialects. */
typedef enum action_e {
  ACT_ALLOC,
  ACT_FREE,           /* streamarena, RMM */
  ACT_FREE_REQUESTED, /* PyTorch: the program's free */
  ACT_FREE_COMPLETED, /* PyTorch: the address may be reused from here */
  ACT_FAILED,         /* a failed allocation */
  ACT_SKIP,           /* the recording allocator's own event */
  ACT_UNKNOWN
} action;

static action classify(const char *op) {
  static const struct {
    const char *name;
    action act;
  } names[] = {
      {"alloc", ACT_ALLOC},
      {"allocate", ACT_ALLOC},
      {"free", ACT_FREE},
      {"deallocate", ACT_FREE},
      {"free_requested", ACT_FREE_REQUESTED},
      {"free_completed", ACT_FREE_COMPLETED},
      {"oom", ACT_FAILED},
      {"segment_alloc", ACT_SKIP},
      {"segment_free", ACT_SKIP},
      {"segment_map", ACT_SKIP},
      {"segment_unmap", ACT_SKIP},
      {"snapshot", ACT_SKIP},
      {"user_defined", ACT_SKIP},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(op, names[i].name) == 0) return names[i].act;
  if (strncmp(op, "allocate failure", 16) == 0) return ACT_FAILED;
  return ACT_UNKNOWN;
}

/* The free of the live allocation in slot j of l->live, on stream. */
static sa_status free_live(loader *l, size_t j, uint32_t stream) {
  uint32_t slot = l->live.vals[j];
  smap_del(&l->live, j);
  l->live_bytes -= l->slot_size[slot];
  return push_op(l, (trace_op){slot, (uint16_t)stream, 1, l->slot_size[slot]})
             ? SA_OK
             : SA_ERR_OUT_OF_MEMORY;
}

/* The line's stream as a dense number. */
static sa_status line_stream(loader *l, const char *key, size_t lineno, uint32_t *stream,
                             char *err, size_t err_size) {
  if (!intern(&l->streams, key, &l->t->nstreams, stream)) return SA_ERR_OUT_OF_MEMORY;
  if (*stream > UINT16_MAX) {
    snprintf(err, err_size, "line %zu: more than 65536 streams", lineno);
    return SA_ERR_INVALID_ARGUMENT;
  }
  return SA_OK;
}

/* One data line; an error status on a malformed line (message in err). */
static sa_status line(loader *l, char **f, size_t n, const int *col, size_t lineno,
                      char *err, size_t err_size) {
  trace *t = l->t;
  for (int i = 0; i < 4; i++) {
    if (col[i] >= (int)n) {
      snprintf(err, err_size, "line %zu: %zu fields, expected more", lineno, n);
      return SA_ERR_INVALID_ARGUMENT;
    }
  }
  const char *op = f[col[1]], *id = f[col[2]];
  action act = classify(op);
  switch (act) {
    case ACT_UNKNOWN:
      snprintf(err, err_size, "line %zu: unknown operation '%s'", lineno, op);
      return SA_ERR_INVALID_ARGUMENT;
    case ACT_FAILED:
      t->failed_allocs++;
      return SA_OK;
    case ACT_SKIP:
      t->skipped++;
      return SA_OK;
    default:
      break;
  }
  if (id[0] == '\0') { /* every empty id would be one allocation */
    snprintf(err, err_size, "line %zu: no id", lineno);
    return SA_ERR_INVALID_ARGUMENT;
  }
  if (col[4] >= 0 && col[4] < (int)n) {
    uint32_t th;
    if (!intern(&l->threads, f[col[4]], &t->nthreads, &th)) return SA_ERR_OUT_OF_MEMORY;
  }
  size_t j = smap_find(&l->live, id);
  size_t k = smap_find(&l->freeing, id);
  if (act == ACT_FREE_COMPLETED) {
    if (k != SIZE_MAX) { /* its free_requested freed it */
      smap_del(&l->freeing, k);
      return SA_OK;
    }
    if (j == SIZE_MAX) {
      t->unmatched_frees++;
      return SA_OK;
    }
    act = ACT_FREE; /* completed without a request: the free is here */
  }
  if (act == ACT_FREE || act == ACT_FREE_REQUESTED) {
    sa_status st = SA_OK;
    if (j == SIZE_MAX) {
      t->unmatched_frees++;
    } else {
      uint32_t stream;
      st = line_stream(l, f[col[0]], lineno, &stream, err, err_size);
      if (st == SA_OK) st = free_live(l, j, stream);
    }
    /* Its free_completed (also of a block allocated before the recording
     * began) is then expected, not another unmatched free. */
    if (st == SA_OK && act == ACT_FREE_REQUESTED && k == SIZE_MAX &&
        !smap_put(&l->freeing, id, 0))
      st = SA_ERR_OUT_OF_MEMORY;
    return st;
  }

  uint32_t stream;
  sa_status st = line_stream(l, f[col[0]], lineno, &stream, err, err_size);
  if (st != SA_OK) return st;
  const char *sz = f[col[3]];
  errno = 0;
  char *end;
  unsigned long long size = strtoull(sz, &end, 10);
  /* strtoull takes "-1" as 2^64 - 1: a sign is no size */
  if (errno != 0 || end == sz || *end != '\0' || size == 0 || sz[0] == '-') {
    snprintf(err, err_size, "line %zu: bad size '%s'", lineno, sz);
    return SA_ERR_INVALID_ARGUMENT;
  }
  if (size > TRACE_MAX_LIVE - l->live_bytes) {
    snprintf(err, err_size, "line %zu: size %s takes the live bytes past 64 PiB, beyond any "
             "device", lineno, sz);
    return SA_ERR_INVALID_ARGUMENT;
  }
  if (k != SIZE_MAX) { /* handed out again before its free completed */
    t->early_reuse++;
    smap_del(&l->freeing, k);
  }
  if (j != SIZE_MAX) { /* the trace lost a free: the old one stays live */
    t->never_freed++;
    smap_del(&l->live, j);
  }
  if (t->nslots == l->cap_slots) {
    size_t cap = l->cap_slots ? 2 * l->cap_slots : 4096;
    size_t *s = realloc(l->slot_size, cap * sizeof *s);
    if (s == NULL) return SA_ERR_OUT_OF_MEMORY;
    l->slot_size = s;
    l->cap_slots = cap;
  }
  uint32_t slot = (uint32_t)t->nslots++;
  l->slot_size[slot] = (size_t)size;
  if (!smap_put(&l->live, id, slot)) return SA_ERR_OUT_OF_MEMORY;
  l->live_bytes += (size_t)size;
  if (l->live_bytes > t->peak_live) {
    t->peak_live = l->live_bytes;
    t->peak_op = t->nops; /* the op pushed next */
  }
  return push_op(l, (trace_op){slot, (uint16_t)stream, 0, (size_t)size}) ? SA_OK
                                                                          : SA_ERR_OUT_OF_MEMORY;
}

/* Whether gz has seen an error (not the end of the file). */
static bool read_failed(gzFile gz) {
  int code = Z_OK;
  (void)gzerror(gz, &code);
  return code != Z_OK && code != Z_STREAM_END;
}

/* The next line of gz into *buf (grown as needed), without its line end.
 * Its length; -1 at the end of the file or on a read error (gzerror says
 * which: a line cut short by the error is not returned); -2 when the buffer
 * cannot grow; -3 when the line holds a NUL byte. */
static ssize_t read_line(gzFile gz, char **buf, size_t *cap) {
  size_t len = 0;
  for (;;) {
    if (*cap - len < 2) {
      size_t ncap = *cap ? 2 * *cap : 4096;
      char *nbuf = realloc(*buf, ncap);
      if (nbuf == NULL) return -2;
      *buf = nbuf;
      *cap = ncap;
    }
    int room = *cap - len > INT_MAX ? INT_MAX : (int)(*cap - len);
    if (gzgets(gz, *buf + len, room) == NULL) break;
    size_t got = strlen(*buf + len);
    len += got;
    if (len > 0 && (*buf)[len - 1] == '\n') break;
    /* gzgets stops at a line end, a full buffer or the end of the file;
     * stopping short of all three, the string ends at a NUL it copied (the
     * rest of the line would be overwritten by the next one). */
    if (got < (size_t)room - 1 && !gzeof(gz)) return -3;
  }
  bool whole = len > 0 && (*buf)[len - 1] == '\n';
  if (len == 0 || (!whole && read_failed(gz))) return -1;
  while (len > 0 && ((*buf)[len - 1] == '\n' || (*buf)[len - 1] == '\r')) (*buf)[--len] = '\0';
  return (ssize_t)len;
}

/* Whether gz stopped at a clean end of file; else the reason into err. */
static bool read_ok(gzFile gz, const char *path, char *err, size_t err_size) {
  if (!read_failed(gz)) return true;
  int code = Z_OK;
  const char *msg = gzerror(gz, &code);
  snprintf(err, err_size, "%s: read error: %s", path,
           code == Z_ERRNO ? strerror(errno) : msg);
  return false;
}

sa_status trace_load(const char *path, trace *t, char *err, size_t err_size) {
  memset(t, 0, sizeof *t);
  char full[4096];
  if (!user_path(path, full, sizeof full)) {
    snprintf(err, err_size, "%s: path too long", path);
    return SA_ERR_INVALID_ARGUMENT;
  }
  errno = 0;
  gzFile gz = gzopen(full, "rb");
  if (gz == NULL) {
    snprintf(err, err_size, "%s: %s", full, errno != 0 ? strerror(errno) : "cannot open");
    return SA_ERR_INVALID_ARGUMENT;
  }
  (void)gzbuffer(gz, 1u << 17); /* fewer reads; fails only after the first read */
  loader l = {.t = t};
  char *buf = NULL;
  size_t bufcap = 0, lineno = 0;
  int col[5] = {-1, -1, -1, -1, -1}; /* stream, op, id, size, thread */
  bool header = false;
  sa_status st = SA_OK;
  ssize_t len = 0;
  char *fields[MAX_FIELDS];
  while (st == SA_OK && (len = read_line(gz, &buf, &bufcap)) >= 0) {
    lineno++;
    if (len == 0 || buf[0] == '#') continue;
    size_t n = split(buf, fields);
    if (!header) {
      col[0] = column(fields, n, "stream", NULL);
      col[1] = column(fields, n, "op", "action");
      col[2] = column(fields, n, "id", "pointer");
      if (col[2] < 0) col[2] = column(fields, n, "addr", NULL);
      col[3] = column(fields, n, "size", NULL);
      col[4] = column(fields, n, "thread", NULL);
      if (col[0] < 0 || col[1] < 0 || col[2] < 0 || col[3] < 0) {
        snprintf(err, err_size, "%s:%zu: not a trace header (need stream, op|action, "
                 "id|pointer|addr, size)", full, lineno);
        st = SA_ERR_INVALID_ARGUMENT;
        break;
      }
      t->format = column(fields, n, "addr", NULL) >= 0     ? "pytorch"
                  : column(fields, n, "action", NULL) >= 0 ? "rmm"
                                                           : "streamarena";
      header = true;
      continue;
    }
    st = line(&l, fields, n, col, lineno, err, err_size);
    if (st == SA_ERR_INVALID_ARGUMENT) { /* which file, too: replay reads several */
      char msg[512];
      snprintf(msg, sizeof msg, "%s", err);
      snprintf(err, err_size, "%s: %s", full, msg);
    }
  }
  if (st == SA_OK && len == -2) st = SA_ERR_OUT_OF_MEMORY;
  if (st == SA_OK && len == -3) {
    snprintf(err, err_size, "%s: line %zu: a NUL byte (not a text file?)", full, lineno + 1);
    st = SA_ERR_INVALID_ARGUMENT;
  }
  if (st == SA_OK && !read_ok(gz, full, err, err_size)) st = SA_ERR_INVALID_ARGUMENT;
  if (st == SA_OK && !header) {
    snprintf(err, err_size, "%s: no header line", full);
    st = SA_ERR_INVALID_ARGUMENT;
  }
  if (st == SA_ERR_OUT_OF_MEMORY) /* the callers print err on any failure */
    snprintf(err, err_size, "%s: out of memory after %zu lines", full, lineno);
  size_t still_live = 0;
  for (size_t i = 0; i < l.live.cap; i++)
    if (l.live.keys[i] != NULL && l.live.keys[i] != (char *)&l.live) still_live++;
  t->never_freed += still_live;
  free(buf);
  (void)gzclose(gz); /* reading: nothing to flush, and errors were seen above */
  free(l.slot_size);
  smap_fini(&l.live);
  smap_fini(&l.freeing);
  smap_fini(&l.streams);
  smap_fini(&l.threads);
  if (st != SA_OK) trace_free(t);
  return st;
}

void trace_free(trace *t) {
  free(t->ops);
  memset(t, 0, sizeof *t);
}
