/* The CUDA driver's virtual-memory entry points, as an X-macro list:
 * X(name without "cu", PFN version suffix). One list for the library's
 * loader (cuda.c) and the benchmarks' (bench/cuda_dl.h), which measures
 * what these calls cost (bench/driver_costs.c). */
#ifndef SA_DRIVER_CUDA_VMM_H
#define SA_DRIVER_CUDA_VMM_H

#define SA_CU_VMM_ENTRY_POINTS(X)         \
  X(MemGetAllocationGranularity, v10020) \
  X(MemAddressReserve, v10020)           \
  X(MemAddressFree, v10020)              \
  X(MemCreate, v10020)                   \
  X(MemRelease, v10020)                  \
  X(MemMap, v10020)                      \
  X(MemUnmap, v10020)                    \
  X(MemSetAccess, v10020)

#endif /* SA_DRIVER_CUDA_VMM_H */
