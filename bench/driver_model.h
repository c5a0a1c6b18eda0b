/* The driver's time on an H200 (driver 580), modelled from what the host
 * simulator counted (sa_host_totals), with the costs bench/driver_costs
 * measured there (docs/DEFRAG.md): creating a chunk costs about the same
 * at 2 MiB as at 256 MiB, setting access and unmapping cost per chunk in
 * the range; only releasing memory costs mostly per byte, the rest a
 * little above 256 MiB. A model to compare policies by, not a measurement.
 * Used by //bench:replay and //bench:after_work. */
#ifndef SA_BENCH_DRIVER_MODEL_H
#define SA_BENCH_DRIVER_MODEL_H

#include <stdint.h>

#include <streamarena/host.h>

/* w1 - w0, call by call and byte by byte. */
void driver_work_between(const sa_host_totals *w0, const sa_host_totals *w1, sa_host_totals *out);
/* The modelled H200 microseconds of the driver work w. */
double driver_model_us(const sa_host_totals *w);
/* Virtual-memory driver calls of w (reserve and release, chunk create and
 * release, map, unmap, set access), and all driver calls. */
uint64_t driver_vmm_calls(const sa_host_totals *w);
uint64_t driver_all_calls(const sa_host_totals *w);

#endif /* SA_BENCH_DRIVER_MODEL_H */
