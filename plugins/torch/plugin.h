/* Cross-file functions of the PyTorch plugin (plugin.c, check.c). */
#ifndef SA_TORCH_PLUGIN_H
#define SA_TORCH_PLUGIN_H

#include <stdbool.h>
#include <stdint.h>

#include "driver/driver.h"
#include "plugins/common/hook.h"
#include "plugins/torch/streamarena_torch.h"

/* plugin.c: PyTorch's figures and its arenas, never kept (sa_hook_arena,
 * sa_hook_started). */
extern sa_hook sa__torch_hook;

/* check.c: no-ops returning SA_OK while check mode is off. */
/* Before the free of ptr on stream: fill it behind every stream that may
 * still use it, and record it on the filling stream. SA_ERR_STREAM_CAPTURING
 * (nothing done) where stream is being captured. */
sa_status sa__torch_check_fill(int dev, void *ptr, size_t size, sa_stream stream);
/* After sa_record_stream(ptr, stream): remember it for the fill. */
sa_status sa__torch_check_record(void *ptr, sa_stream stream);
uint64_t sa__torch_check_fills(int dev);

#endif /* SA_TORCH_PLUGIN_H */
