/* The rules a configuration must meet on a device (config.c), written
 * once for arena creation, sa_config_check and sa_set_superblock_size. A
 * leaf: calls only libc (and trace.c's path check, through arena.c). */
#ifndef SA_CONFIG_H
#define SA_CONFIG_H

#include "base/base.h"

#define SA_SUPERBLOCK_MAX ((size_t)1 << 30) /* block offsets stay below 2^32 */
#define SA_VA_RESERVE_MAX ((size_t)1 << 46) /* 64 TiB */

/* A configuration resolved against its device. */
typedef struct sa_resolved_s {
  size_t superblock_size, large_threshold, physical_cap, va_size;
  size_t target_excess; /* footprint_target - 1, in 1/SA_TARGET_UNIT */
  bool large_threshold_explicit;
} sa_resolved;
/* Resolve c's zeros against a device of granularity gran and total bytes
 * and check every rule between the sizes; SA_ERR_BAD_CONFIG with a message
 * naming the key, its value and the rule. */
sa_status sa__config_resolve(const sa_config *c, size_t gran, size_t total, sa_resolved *r,
                             char *err, size_t err_size);
/* The largest large_threshold whose size class fits in a superblock. */
size_t sa__threshold_limit(size_t superblock_size);

#endif /* SA_CONFIG_H */
