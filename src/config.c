/* Configuration: defaults (sa_config_init) and the key=value parser
 * (sa_config_parse).
 *
 * Owns nothing beyond the caller's sa_config; calls only libc. Called by
 * users, by the default arenas (STREAMARENA_CONF) and by the examples'
 * --conf options. Range checks that need a driver (superblock_size a
 * multiple of the granularity, say) are the arena's job at creation: this
 * file only checks syntax and what fits in the fields.
 *
 * Parsing writes into a copy and commits it only when every item parsed, so
 * a bad item leaves the caller's config untouched. */
#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <streamarena/streamarena.h>

void sa_config_init(sa_config *config) {
  if (config == NULL) return;
  memset(config, 0, sizeof *config);
  config->device = 0;
  config->backend = SA_BACKEND_AUTO;
  /* 0 = the driver's allocation granularity, resolved by the arena. */
  config->superblock_size = 0;
  config->va_reserve_bytes = 0;        /* 0 = 4 x device memory */
  config->max_physical_bytes = 0;      /* 0 = the whole device */
  config->release_threshold_bytes = 0;
  config->large_threshold = 0;         /* 0 = superblock_size / 2 */
  config->flags = 0;
  config->trace_path[0] = '\0';
  config->oom_callback = NULL;
  config->oom_user_data = NULL;
}

/* A piece of the spec: [begin, end), not NUL-terminated. */
typedef struct span_s {
  const char *begin;
  const char *end;
} span;

static size_t span_len(span s) { return (size_t)(s.end - s.begin); }

static bool span_is(span s, const char *word) {
  size_t n = strlen(word);
  return span_len(s) == n && memcmp(s.begin, word, n) == 0;
}

/* Case-insensitive, for size suffixes. */
static bool span_is_nocase(span s, const char *word) {
  size_t n = strlen(word);
  if (span_len(s) != n) return false;
  for (size_t i = 0; i < n; i++) {
    if (tolower((unsigned char)s.begin[i]) != tolower((unsigned char)word[i])) return false;
  }
  return true;
}

static span span_trim(span s) {
  while (s.begin < s.end && (*s.begin == ' ' || *s.begin == '\t')) s.begin++;
  while (s.end > s.begin && (s.end[-1] == ' ' || s.end[-1] == '\t')) s.end--;
  return s;
}

/* printf into err (if any), always NUL-terminated, truncating. */
__attribute__((format(printf, 3, 4))) static void set_error(char *err, size_t err_size,
                                                            const char *fmt, ...) {
  if (err == NULL || err_size == 0) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err, err_size, fmt, ap);
  va_end(ap);
  if (n < 0) err[0] = '\0';
}

/* Leading decimal digits of s into *value; false on overflow. *digits gets
 * how many were read (0: none). */
static bool parse_digits(span s, uint64_t *value, size_t *digits) {
  uint64_t v = 0;
  size_t i = 0;
  for (; s.begin + i < s.end && isdigit((unsigned char)s.begin[i]); i++) {
    uint64_t d = (uint64_t)(s.begin[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *value = v;
  *digits = i;
  return true;
}

typedef enum size_result_e { SIZE_OK, SIZE_SYNTAX, SIZE_OVERFLOW } size_result;

/* "<digits>[ ]<suffix>" with the suffixes of sa_config_parse's comment,
 * case-insensitive. Binary multiples only: K means KiB. */
static size_result parse_size(span s, size_t *out) {
  uint64_t v;
  size_t digits;
  if (!parse_digits(s, &v, &digits)) return SIZE_OVERFLOW;
  if (digits == 0) return SIZE_SYNTAX;
  span suffix = span_trim((span){s.begin + digits, s.end});
  static const struct {
    const char *name;
    unsigned shift;
  } suffixes[] = {
      {"", 0},     {"B", 0},     {"K", 10},  {"KiB", 10}, {"M", 20},
      {"MiB", 20}, {"G", 30},    {"GiB", 30}, {"T", 40},  {"TiB", 40},
  };
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    if (!span_is_nocase(suffix, suffixes[i].name)) continue;
    unsigned shift = suffixes[i].shift;
    if (v > (UINT64_MAX >> shift)) return SIZE_OVERFLOW;
    uint64_t bytes = v << shift;
    if (bytes > SIZE_MAX) return SIZE_OVERFLOW;
    *out = (size_t)bytes;
    return SIZE_OK;
  }
  return SIZE_SYNTAX;
}

typedef enum key_kind_e { KEY_SIZE, KEY_DEVICE, KEY_BACKEND, KEY_FLAG, KEY_PATH } key_kind;

/* One row per key: how to parse it and where it goes. */
typedef struct key_desc_s {
  const char *name;
  key_kind kind;
  size_t offset; /* KEY_SIZE: offset of the size_t field */
  unsigned flag; /* KEY_FLAG: the SA_FLAG_* bit */
} key_desc;

static const key_desc keys[] = {
    {"device", KEY_DEVICE, 0, 0},
    {"backend", KEY_BACKEND, 0, 0},
    {"superblock_size", KEY_SIZE, offsetof(sa_config, superblock_size), 0},
    {"va_reserve", KEY_SIZE, offsetof(sa_config, va_reserve_bytes), 0},
    {"max_physical", KEY_SIZE, offsetof(sa_config, max_physical_bytes), 0},
    {"release_threshold", KEY_SIZE, offsetof(sa_config, release_threshold_bytes), 0},
    {"large_threshold", KEY_SIZE, offsetof(sa_config, large_threshold), 0},
    {"check_stream_order", KEY_FLAG, 0, SA_FLAG_CHECK_STREAM_ORDER},
    {"oom_report", KEY_FLAG, 0, SA_FLAG_OOM_REPORT},
    {"trace", KEY_PATH, 0, 0},
};

/* Apply one key's value to *c. Returns false after writing a message. */
static bool apply(sa_config *c, const key_desc *k, span value, char *err, size_t err_size) {
  int vlen = (int)(span_len(value) > 64 ? 64 : span_len(value)); /* for messages */
  switch (k->kind) {
    case KEY_SIZE: {
      size_t bytes = 0;
      size_result r = parse_size(value, &bytes);
      if (r == SIZE_OVERFLOW) {
        set_error(err, err_size, "value '%.*s' for key '%s' is too large", vlen, value.begin,
                  k->name);
        return false;
      }
      if (r != SIZE_OK) {
        set_error(err, err_size,
                  "bad value '%.*s' for key '%s': expected a size such as 4MiB "
                  "(suffixes B, KiB, MiB, GiB, TiB, K, M, G, T)",
                  vlen, value.begin, k->name);
        return false;
      }
      memcpy((char *)c + k->offset, &bytes, sizeof bytes);
      return true;
    }
    case KEY_DEVICE: {
      uint64_t v;
      size_t digits;
      bool fits = parse_digits(value, &v, &digits);
      if (fits && digits == span_len(value) && digits > 0 && v <= INT_MAX) {
        c->device = (int)v;
        return true;
      }
      set_error(err, err_size,
                "bad value '%.*s' for key 'device': expected a device ordinal 0..%d", vlen,
                value.begin, INT_MAX);
      return false;
    }
    case KEY_BACKEND:
      if (span_is(value, "auto")) {
        c->backend = SA_BACKEND_AUTO;
      } else if (span_is(value, "cuda")) {
        c->backend = SA_BACKEND_CUDA;
      } else if (span_is(value, "host")) {
        c->backend = SA_BACKEND_HOST;
      } else {
        set_error(err, err_size, "bad value '%.*s' for key 'backend': expected auto, cuda or host",
                  vlen, value.begin);
        return false;
      }
      return true;
    case KEY_FLAG:
      if (span_is(value, "1")) {
        c->flags |= k->flag;
      } else if (span_is(value, "0")) {
        c->flags &= ~k->flag;
      } else {
        set_error(err, err_size, "bad value '%.*s' for key '%s': expected 0 or 1", vlen,
                  value.begin, k->name);
        return false;
      }
      return true;
    case KEY_PATH:
      if (span_len(value) >= sizeof c->trace_path) {
        set_error(err, err_size, "value for key '%s' is longer than %zu bytes", k->name,
                  sizeof c->trace_path - 1);
        return false;
      }
      memcpy(c->trace_path, value.begin, span_len(value));
      c->trace_path[span_len(value)] = '\0';
      return true;
  }
  set_error(err, err_size, "internal error: key '%s' has no parser", k->name);
  return false;
}

/* One "key=value" item (already trimmed, not empty). */
static bool parse_item(sa_config *c, span item, char *err, size_t err_size) {
  int ilen = (int)(span_len(item) > 64 ? 64 : span_len(item));
  const char *eq = memchr(item.begin, '=', span_len(item));
  if (eq == NULL) {
    set_error(err, err_size, "missing '=' in '%.*s': expected key=value", ilen, item.begin);
    return false;
  }
  span key = span_trim((span){item.begin, eq});
  span value = span_trim((span){eq + 1, item.end});
  int klen = (int)(span_len(key) > 64 ? 64 : span_len(key));
  const key_desc *k = NULL;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    if (span_is(key, keys[i].name)) k = &keys[i];
  }
  if (k == NULL) {
    if (span_len(key) == 0) {
      set_error(err, err_size, "missing key in '%.*s'", ilen, item.begin);
    } else {
      set_error(err, err_size, "unknown key '%.*s'", klen, key.begin);
    }
    return false;
  }
  if (span_len(value) == 0) {
    set_error(err, err_size, "empty value for key '%s'", k->name);
    return false;
  }
  return apply(c, k, value, err, err_size);
}

/* A NULL or empty spec applies nothing (so getenv() may be passed as is);
 * empty items (",,", a trailing comma) are skipped; spaces and tabs around
 * keys and values are ignored. A trace path cannot contain a comma. */
sa_status sa_config_parse(sa_config *config, const char *spec, char *err, size_t err_size) {
  if (err != NULL && err_size > 0) err[0] = '\0';
  if (config == NULL) {
    set_error(err, err_size, "config is NULL");
    return SA_ERR_INVALID_ARGUMENT;
  }
  if (spec == NULL) return SA_OK;
  sa_config work = *config;
  const char *p = spec;
  for (;;) {
    const char *comma = strchr(p, ',');
    const char *end = comma != NULL ? comma : p + strlen(p);
    span item = span_trim((span){p, end});
    if (span_len(item) > 0 && !parse_item(&work, item, err, err_size)) {
      return SA_ERR_BAD_CONFIG;
    }
    if (comma == NULL) break;
    p = comma + 1;
  }
  *config = work;
  return SA_OK;
}
