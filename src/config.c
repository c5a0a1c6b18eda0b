/* Configuration: defaults (sa_config_init), the key=value parser
 * (sa_config_parse) and the rules a configuration must meet on a device
 * (sa__config_resolve).
 *
 * Owns nothing beyond the caller's sa_config; calls only libc. Called by
 * users, by the default arenas (STREAMARENA_CONF) and by the examples'
 * --conf options; the arena (arena.c) resolves a configuration against its
 * device's granularity and memory at creation, in sa_config_check and in
 * sa_set_superblock_size, so every rule and its message live here once.
 *
 * Parsing writes into a copy and commits it only when every item parsed, so
 * a bad item leaves the caller's config untouched. */
#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "small/size_class.h"
#include "vm/physical.h"

void sa_config_init(sa_config *config) {
  if (config == NULL) return;
  memset(config, 0, sizeof *config);
  config->device = 0;
  config->backend = SA_BACKEND_AUTO;
  /* 0 = the driver's allocation granularity, resolved by the arena. */
  config->superblock_size = 0;
  config->va_reserve_bytes = 0;        /* 0 = 4 times the device memory */
  config->max_physical_bytes = 0;      /* 0 = the whole device */
  config->reserve_limit_bytes = 0;     /* 0 = the footprint target (alloc.c) */
  config->footprint_target = 0;        /* 0 = SA_FOOTPRINT_TIGHT */
  config->release_threshold_bytes = 0;
  config->large_threshold = 0;         /* 0 = superblock_size / 2 */
  config->chunk_size = 0;              /* 0 = the growth, a granule under a budget */
  config->initial_physical_bytes = 0;  /* 0 = nothing mapped up front */
  config->flags = SA_FLAG_KEEP_SPANS; /* see its comment in the header */
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
    uint64_t digit = (uint64_t)(s.begin[i] - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
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

typedef enum key_kind_e {
  KEY_SIZE,
  KEY_DEVICE,
  KEY_BACKEND,
  KEY_PEERS,
  KEY_FLAG,
  KEY_PATH,
  KEY_FOOTPRINT
} key_kind;

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
    {"peer_access", KEY_PEERS, 0, 0},
    {"superblock_size", KEY_SIZE, offsetof(sa_config, superblock_size), 0},
    {"va_reserve", KEY_SIZE, offsetof(sa_config, va_reserve_bytes), 0},
    {"max_physical", KEY_SIZE, offsetof(sa_config, max_physical_bytes), 0},
    {"reserve_limit", KEY_SIZE, offsetof(sa_config, reserve_limit_bytes), 0},
    {"footprint_target", KEY_FOOTPRINT, 0, 0},
    {"release_threshold", KEY_SIZE, offsetof(sa_config, release_threshold_bytes), 0},
    {"large_threshold", KEY_SIZE, offsetof(sa_config, large_threshold), 0},
    {"chunk_size", KEY_SIZE, offsetof(sa_config, chunk_size), 0},
    {"initial_physical", KEY_SIZE, offsetof(sa_config, initial_physical_bytes), 0},
    {"check_stream_order", KEY_FLAG, 0, SA_FLAG_CHECK_STREAM_ORDER},
    {"oom_report", KEY_FLAG, 0, SA_FLAG_OOM_REPORT},
    {"exact_growth", KEY_FLAG, 0, SA_FLAG_EXACT_GROWTH},
    {"trace", KEY_PATH, 0, 0},
    {"keep_spans", KEY_FLAG, 0, SA_FLAG_KEEP_SPANS},
    {"background_growth", KEY_FLAG, 0, SA_FLAG_BACKGROUND_GROWTH},
};

/* "all", "none", or device ordinals 0-63 joined by '+' (the item separator
 * ',' is taken): "1", "0+2+3". */
static bool parse_peers(span value, uint64_t *out) {
  if (span_is(value, "all")) {
    *out = SA_PEER_ACCESS_ALL;
    return true;
  }
  if (span_is(value, "none")) {
    *out = 0;
    return true;
  }
  uint64_t peers = 0;
  for (span rest = value;;) {
    const char *plus = memchr(rest.begin, '+', span_len(rest));
    span item = span_trim((span){rest.begin, plus != NULL ? plus : rest.end});
    uint64_t dev;
    size_t digits;
    if (!parse_digits(item, &dev, &digits) || digits == 0 || digits != span_len(item) || dev > 63)
      return false;
    peers |= (uint64_t)1 << dev;
    if (plus == NULL) break;
    rest.begin = plus + 1;
  }
  *out = peers;
  return true;
}

/* footprint_target's value: a named point, or a plain decimal number
 * ("1.5", "3"; no sign, exponent, hex, inf or nan) from 1 to
 * SA_FOOTPRINT_MAX. */
static bool parse_footprint(span value, double *out) {
  static const struct {
    const char *name;
    double target;
  } points[] = {
      {"tight", SA_FOOTPRINT_TIGHT},
      {"balanced", SA_FOOTPRINT_BALANCED},
      {"fast", SA_FOOTPRINT_FAST},
  };
  for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
    if (span_is(value, points[i].name)) {
      *out = points[i].target;
      return true;
    }
  }
  char text[32];
  size_t n = span_len(value), dots = 0;
  if (n == 0 || n >= sizeof text || value.begin[0] == '.') return false;
  for (size_t i = 0; i < n; i++) {
    char ch = value.begin[i];
    if (ch == '.') dots++;
    if ((ch != '.' && !isdigit((unsigned char)ch)) || dots > 1) return false;
  }
  memcpy(text, value.begin, n);
  text[n] = '\0';
  double v = strtod(text, NULL);
  if (!(v >= 1.0 && v <= SA_FOOTPRINT_MAX)) return false;
  *out = v;
  return true;
}

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
    case KEY_PEERS:
      if (parse_peers(value, &c->peer_access)) return true;
      set_error(err, err_size,
                "bad value '%.*s' for key 'peer_access': expected all, none or device "
                "ordinals 0..63 joined by '+' (e.g. 1+2)",
                vlen, value.begin);
      return false;
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
    case KEY_FOOTPRINT:
      if (parse_footprint(value, &c->footprint_target)) return true;
      set_error(err, err_size,
                "bad value '%.*s' for key 'footprint_target': expected tight, balanced, fast "
                "or a number from 1 to %g (peak reserved over peak live, e.g. 1.5)",
                vlen, value.begin, SA_FOOTPRINT_MAX);
      return false;
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

/* Edit distance between a typed key and a known one, ignoring case: the
 * message for an unknown key names the nearest known key when it is close
 * (a typo), else lists them all. Keys longer than 64 bytes count as far. */
static size_t key_distance(span typed, const char *known) {
  size_t n = span_len(typed), m = strlen(known);
  if (n > 64 || m > 64) return SIZE_MAX;
  size_t row[65];
  for (size_t j = 0; j <= m; j++) row[j] = j;
  for (size_t i = 1; i <= n; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= m; j++) {
      size_t up = row[j];
      int a = tolower((unsigned char)typed.begin[i - 1]);
      size_t best = diag + (a == tolower((unsigned char)known[j - 1]) ? 0 : 1);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[m];
}

static void unknown_key_error(span key, char *err, size_t err_size) {
  int klen = (int)(span_len(key) > 64 ? 64 : span_len(key));
  const char *nearest = NULL;
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    size_t dist = key_distance(key, keys[i].name);
    if (dist < best) {
      best = dist;
      nearest = keys[i].name;
    }
  }
  if (nearest != NULL && best <= 2 && best < strlen(nearest) / 2) {
    set_error(err, err_size, "unknown key '%.*s' (did you mean '%s'?)", klen, key.begin, nearest);
    return;
  }
  char list[320] = "";
  size_t used = 0;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0] && used < sizeof list; i++) {
    int w = snprintf(list + used, sizeof list - used, "%s%s", i > 0 ? ", " : "", keys[i].name);
    if (w < 0) break;
    used += (size_t)w;
  }
  set_error(err, err_size, "unknown key '%.*s'; keys: %s", klen, key.begin, list);
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
  const key_desc *k = NULL;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    if (span_is(key, keys[i].name)) k = &keys[i];
  }
  if (k == NULL) {
    if (span_len(key) == 0) {
      set_error(err, err_size, "missing key in '%.*s'", ilen, item.begin);
    } else {
      unknown_key_error(key, err, err_size);
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

/* ------------------------------------------------------------------------
 * The rules that need the device
 * ---------------------------------------------------------------------- */

/* bytes the way sa_config_parse reads them back: the largest unit that
 * divides them exactly ("3MiB"), else plain bytes. */
static const char *size_text(char *buf, size_t n, size_t bytes) {
  static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
  for (unsigned i = 0; i < 4; i++) {
    unsigned shift = 40 - 10 * i;
    if (bytes != 0 && bytes % ((size_t)1 << shift) == 0) {
      snprintf(buf, n, "%zu%s", bytes >> shift, units[i]);
      return buf;
    }
  }
  snprintf(buf, n, "%zu", bytes);
  return buf;
}

/* The largest small-block threshold a superblock of sb_size bytes can
 * serve: every request up to it rounds to a class no larger than the
 * superblock (a 33 MiB request is a 36 MiB block, which a 34 MiB
 * superblock cannot hold). */
size_t sa__threshold_limit(size_t sb_size) {
  if (sb_size < SA_ALIGNMENT) return 0;
  size_t limit = sb_size < SA_CLASS_MAX_SIZE ? sb_size : SA_CLASS_MAX_SIZE;
  unsigned cls = sa_size_class(limit);
  if (sa_class_size(cls) > limit) cls--;
  return sa_class_size(cls);
}

sa_status sa__config_resolve(const sa_config *c, size_t gran, size_t total, sa_resolved *r,
                             char *err, size_t err_size) {
  char v[32], w[32], x[32], y[32];
  if (err != NULL && err_size > 0) err[0] = '\0';
  size_t sb = c->superblock_size != 0 ? c->superblock_size : gran;
  if (sb % gran != 0) {
    set_error(err, err_size,
              "superblock_size=%s: must be a multiple of the allocation granularity, %s on "
              "this device",
              size_text(v, sizeof v, sb), size_text(w, sizeof w, gran));
    return SA_ERR_BAD_CONFIG;
  }
  if (sb > SA_SUPERBLOCK_MAX) {
    set_error(err, err_size, "superblock_size=%s: above the largest superblock, %s",
              size_text(v, sizeof v, sb), size_text(w, sizeof w, SA_SUPERBLOCK_MAX));
    return SA_ERR_BAD_CONFIG;
  }
  size_t limit = sa__threshold_limit(sb);
  size_t lt = c->large_threshold;
  r->large_threshold_explicit = lt != 0;
  if (lt == 0) lt = sb / 2;
  if (lt > SA_CLASS_MAX_SIZE) lt = SA_CLASS_MAX_SIZE; /* larger blocks are spans anyway */
  if (lt < SA_ALIGNMENT) {
    set_error(err, err_size, "large_threshold=%s: below the smallest block, %d bytes",
              size_text(v, sizeof v, lt), SA_ALIGNMENT);
    return SA_ERR_BAD_CONFIG;
  }
  if (lt > limit) {
    set_error(err, err_size,
              "large_threshold=%s: requests up to it round to blocks of up to %s, which must "
              "fit in a superblock (superblock_size=%s); use at most %s or a larger "
              "superblock_size",
              size_text(v, sizeof v, c->large_threshold),
              size_text(w, sizeof w, sa_class_size(sa_size_class(lt))),
              size_text(x, sizeof x, sb), size_text(y, sizeof y, limit));
    return SA_ERR_BAD_CONFIG;
  }
  if (c->chunk_size % gran != 0 || c->chunk_size > SA_CHUNK_MAX) {
    set_error(err, err_size,
              "chunk_size=%s: must be a multiple of the allocation granularity, %s on this "
              "device, and at most %s",
              size_text(v, sizeof v, c->chunk_size), size_text(w, sizeof w, gran),
              size_text(x, sizeof x, SA_CHUNK_MAX));
    return SA_ERR_BAD_CONFIG;
  }
  double ft = c->footprint_target;
  if (ft != 0 && !(ft >= 1.0 && ft <= SA_FOOTPRINT_MAX)) {
    set_error(err, err_size,
              "footprint_target=%g: must be 0 (the default, %g) or from 1 to %g, times the "
              "highest live bytes so far",
              ft, SA_FOOTPRINT_TIGHT, SA_FOOTPRINT_MAX);
    return SA_ERR_BAD_CONFIG;
  }
  if (ft != 0 && c->reserve_limit_bytes != 0) {
    set_error(err, err_size,
              "footprint_target=%g: reserve_limit=%s is set too; a budget replaces the "
              "footprint target, so give one of them",
              ft, size_text(v, sizeof v, c->reserve_limit_bytes));
    return SA_ERR_BAD_CONFIG;
  }
  size_t cap = c->max_physical_bytes != 0 ? c->max_physical_bytes : total;
  if (cap < sb) {
    if (c->max_physical_bytes != 0)
      set_error(err, err_size,
                "max_physical=%s: below superblock_size=%s; a superblock must fit under the "
                "physical cap",
                size_text(v, sizeof v, cap), size_text(w, sizeof w, sb));
    else
      set_error(err, err_size,
                "superblock_size=%s: above the device's memory, %s", size_text(v, sizeof v, sb),
                size_text(w, sizeof w, cap));
    return SA_ERR_BAD_CONFIG;
  }
  size_t init = c->initial_physical_bytes;
  /* It is mapped in whole granules (sa__span_prefill): those must fit under
   * the physical cap, and on the device, whose memory a max_physical above
   * it does not add to. Counted in granules, so that rounding up cannot
   * overflow. */
  size_t init_granules = init / gran + (init % gran != 0);
  bool device_bound = total < cap;
  size_t init_cap = device_bound ? total : cap;
  if (init_granules > init_cap / gran) {
    set_error(
        err, err_size,
        "initial_physical=%s: mapped in whole granules, %s, above %s, %s; "
        "what is mapped up front must fit under the physical cap",
        size_text(v, sizeof v, init),
        size_text(w, sizeof w, init_granules <= SIZE_MAX / gran ? init_granules * gran : init),
        c->max_physical_bytes != 0 && !device_bound ? "max_physical" : "the device's memory",
        size_text(x, sizeof x, init_cap));
    return SA_ERR_BAD_CONFIG;
  }
  /* Whole granules too: 3 MiB maps 4 MiB, past a 3 MiB budget. */
  if (c->reserve_limit_bytes != 0 && init_granules > c->reserve_limit_bytes / gran) {
    set_error(err, err_size, "initial_physical=%s: mapped in whole granules, %s, above "
              "reserve_limit=%s; what is mapped up front must fit under the budget",
              size_text(v, sizeof v, init), size_text(w, sizeof w, init_granules * gran),
              size_text(x, sizeof x, c->reserve_limit_bytes));
    return SA_ERR_BAD_CONFIG;
  }
  size_t va = c->va_reserve_bytes;
  if (va == 0) va = total <= SA_VA_RESERVE_MAX / 4 ? 4 * total : SA_VA_RESERVE_MAX;
  if (va > SA_VA_RESERVE_MAX) {
    set_error(err, err_size, "va_reserve=%s: above the largest reservation, %s",
              size_text(v, sizeof v, va), size_text(w, sizeof w, SA_VA_RESERVE_MAX));
    return SA_ERR_BAD_CONFIG;
  }
  if (va < sb) {
    set_error(err, err_size,
              "va_reserve=%s: below superblock_size=%s; the range must hold a superblock",
              size_text(v, sizeof v, va), size_text(w, sizeof w, sb));
    return SA_ERR_BAD_CONFIG;
  }
  if (init > va) {
    set_error(err, err_size, "initial_physical=%s: above va_reserve=%s; it must fit in the range",
              size_text(v, sizeof v, init), size_text(w, sizeof w, va));
    return SA_ERR_BAD_CONFIG;
  }
  r->superblock_size = sb;
  r->target_excess = (size_t)(((ft != 0 ? ft : SA_FOOTPRINT_TIGHT) - 1.0) * SA_TARGET_UNIT + 0.5);
  /* Past 2 the room would only be mapped ahead on a climb and never used,
   * and a chunk costs by its bytes as well as by the call: every trace
   * measured was slower there and held more (Note [Footprint target above
   * 2]). */
  if (r->target_excess > SA_TARGET_EXCESS_MAX) r->target_excess = SA_TARGET_EXCESS_MAX;
  r->large_threshold = lt;
  r->physical_cap = cap;
  r->va_size = (va + gran - 1) / gran * gran;
  return SA_OK;
}
