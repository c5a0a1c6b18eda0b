/* Cross-file functions of the PyTorch plugin (plugin.c, check.c). */
#ifndef SA_TORCH_PLUGIN_H
#define SA_TORCH_PLUGIN_H

#include <stdbool.h>
#include <stdint.h>

#include "driver/driver.h"
#include "plugins/torch/streamarena_torch.h"

#define sa_likely(x) __builtin_expect(!!(x), 1)
#define sa_unlikely(x) __builtin_expect(!!(x), 0)

/* plugin.c */
/* The default arena of device dev as sa_default_arena gives it (created at
 * the first call, and again after sa_default_arenas_shutdown); never kept. */
sa_status sa__torch_arena(int dev, sa_arena **out);
/* Whether any allocation went through the plugin yet. */
bool sa__torch_started(void);

/* check.c: no-ops returning SA_OK while check mode is off. */
/* Before the free of ptr on stream: fill it behind every stream that may
 * still use it, and record it on the filling stream. */
sa_status sa__torch_check_fill(int dev, void *ptr, size_t size, sa_stream stream);
/* After sa_record_stream(ptr, stream): remember it for the fill. */
sa_status sa__torch_check_record(void *ptr, sa_stream stream);
uint64_t sa__torch_check_fills(int dev);

#endif /* SA_TORCH_PLUGIN_H */
