/* The H200 driver-time model (driver_model.h). */
#include "driver_model.h"

#define MIB_F 1048576.0

void driver_work_between(const sa_host_totals *w0, const sa_host_totals *w1,
                         sa_host_totals *out) {
  for (int f = 0; f < SA_HOST_FN_COUNT; f++) out->calls[f] = w1->calls[f] - w0->calls[f];
  out->bytes_created = w1->bytes_created - w0->bytes_created;
  out->bytes_released = w1->bytes_released - w0->bytes_released;
  out->bytes_mapped = w1->bytes_mapped - w0->bytes_mapped;
  out->bytes_unmapped = w1->bytes_unmapped - w0->bytes_unmapped;
  out->bytes_access = w1->bytes_access - w0->bytes_access;
  out->chunks_unmapped = w1->chunks_unmapped - w0->chunks_unmapped;
  out->chunks_access = w1->chunks_access - w0->chunks_access;
}

double driver_model_us(const sa_host_totals *w) {
  static const double per_call[SA_HOST_FN_COUNT] = {
      [SA_HOST_FN_VA_RESERVE] = 21,  [SA_HOST_FN_CHUNK_CREATE] = 12, [SA_HOST_FN_CHUNK_RELEASE] = 13,
      [SA_HOST_FN_MAP] = 1,          [SA_HOST_FN_SET_ACCESS] = 20,
      [SA_HOST_FN_EVENT_CREATE] = 0.45, [SA_HOST_FN_EVENT_RECORD] = 0.18,
      [SA_HOST_FN_EVENT_QUERY] = 0.18,  [SA_HOST_FN_STREAM_WAIT_EVENT] = 0.13,
      [SA_HOST_FN_STREAM_QUERY] = 1.5,
  };
  const double per_chunk_access = 30, per_chunk_unmap = 25;
  const double per_mib_created = 0.075, per_mib_released = 0.5;
  const double per_mib_access = 0.04, per_mib_unmapped = 0.01; /* large chunks */
  double total = 0;
  for (int f = 0; f < SA_HOST_FN_COUNT; f++) total += per_call[f] * (double)w->calls[f];
  return total + per_chunk_access * (double)w->chunks_access +
         per_chunk_unmap * (double)w->chunks_unmapped +
         per_mib_created * (double)w->bytes_created / MIB_F +
         per_mib_access * (double)w->bytes_access / MIB_F +
         per_mib_unmapped * (double)w->bytes_unmapped / MIB_F +
         per_mib_released * (double)w->bytes_released / MIB_F;
}

uint64_t driver_vmm_calls(const sa_host_totals *w) {
  const uint64_t *c = w->calls;
  return c[SA_HOST_FN_VA_RESERVE] + c[SA_HOST_FN_VA_RELEASE] + c[SA_HOST_FN_CHUNK_CREATE] +
         c[SA_HOST_FN_CHUNK_RELEASE] + c[SA_HOST_FN_MAP] + c[SA_HOST_FN_UNMAP] +
         c[SA_HOST_FN_SET_ACCESS];
}

uint64_t driver_all_calls(const sa_host_totals *w) {
  uint64_t n = 0;
  for (int f = 0; f < SA_HOST_FN_COUNT; f++) n += w->calls[f];
  return n;
}
