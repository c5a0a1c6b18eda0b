/* Reading allocation traces: see trace_read.h. */
#include "trace_read.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FIELDS 16

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
  bool is_alloc = strcmp(op, "alloc") == 0 || strcmp(op, "allocate") == 0;
  bool is_free = strcmp(op, "free") == 0 || strcmp(op, "deallocate") == 0;
  if (!is_alloc && !is_free) {
    if (strncmp(op, "allocate failure", 16) == 0) {
      t->failed_allocs++;
      return SA_OK;
    }
    snprintf(err, err_size, "line %zu: unknown operation '%s'", lineno, op);
    return SA_ERR_INVALID_ARGUMENT;
  }
  uint32_t stream;
  if (!intern(&l->streams, f[col[0]], &t->nstreams, &stream)) return SA_ERR_OUT_OF_MEMORY;
  if (stream > UINT16_MAX) {
    snprintf(err, err_size, "line %zu: more than 65536 streams", lineno);
    return SA_ERR_INVALID_ARGUMENT;
  }
  if (col[4] >= 0 && col[4] < (int)n) {
    uint32_t th;
    if (!intern(&l->threads, f[col[4]], &t->nthreads, &th)) return SA_ERR_OUT_OF_MEMORY;
  }
  size_t j = smap_find(&l->live, id);
  if (is_free) {
    if (j == SIZE_MAX) {
      t->unmatched_frees++;
      return SA_OK;
    }
    uint32_t slot = l->live.vals[j];
    smap_del(&l->live, j);
    l->live_bytes -= l->slot_size[slot];
    return push_op(l, (trace_op){slot, (uint16_t)stream, 1, l->slot_size[slot]})
               ? SA_OK
               : SA_ERR_OUT_OF_MEMORY;
  }
  errno = 0;
  char *end;
  unsigned long long size = strtoull(f[col[3]], &end, 10);
  if (errno != 0 || end == f[col[3]] || *end != '\0' || size == 0) {
    snprintf(err, err_size, "line %zu: bad size '%s'", lineno, f[col[3]]);
    return SA_ERR_INVALID_ARGUMENT;
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

sa_status trace_load(const char *path, trace *t, char *err, size_t err_size) {
  memset(t, 0, sizeof *t);
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    snprintf(err, err_size, "%s: %s", path, strerror(errno));
    return SA_ERR_INVALID_ARGUMENT;
  }
  loader l = {.t = t};
  char *buf = NULL;
  size_t bufcap = 0, lineno = 0;
  int col[5] = {-1, -1, -1, -1, -1}; /* stream, op, id, size, thread */
  bool header = false;
  sa_status st = SA_OK;
  ssize_t len;
  char *fields[MAX_FIELDS];
  while (st == SA_OK && (len = getline(&buf, &bufcap, f)) >= 0) {
    lineno++;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = '\0';
    if (len == 0 || buf[0] == '#') continue;
    size_t n = split(buf, fields);
    if (!header) {
      col[0] = column(fields, n, "stream", NULL);
      col[1] = column(fields, n, "op", "action");
      col[2] = column(fields, n, "id", "pointer");
      col[3] = column(fields, n, "size", NULL);
      col[4] = column(fields, n, "thread", NULL);
      if (col[0] < 0 || col[1] < 0 || col[2] < 0 || col[3] < 0) {
        snprintf(err, err_size, "%s:%zu: not a trace header (need stream, op|action, "
                 "id|pointer, size)", path, lineno);
        st = SA_ERR_INVALID_ARGUMENT;
        break;
      }
      t->format = column(fields, n, "action", NULL) >= 0 ? "rmm" : "streamarena";
      header = true;
      continue;
    }
    st = line(&l, fields, n, col, lineno, err, err_size);
  }
  if (st == SA_OK && !header) {
    snprintf(err, err_size, "%s: no header line", path);
    st = SA_ERR_INVALID_ARGUMENT;
  }
  if (st == SA_OK && ferror(f)) {
    snprintf(err, err_size, "%s: read error", path);
    st = SA_ERR_INVALID_ARGUMENT;
  }
  size_t still_live = 0;
  for (size_t i = 0; i < l.live.cap; i++)
    if (l.live.keys[i] != NULL && l.live.keys[i] != (char *)&l.live) still_live++;
  t->never_freed += still_live;
  free(buf);
  fclose(f);
  free(l.slot_size);
  smap_fini(&l.live);
  smap_fini(&l.streams);
  smap_fini(&l.threads);
  if (st != SA_OK) trace_free(t);
  return st;
}

void trace_free(trace *t) {
  free(t->ops);
  memset(t, 0, sizeof *t);
}
