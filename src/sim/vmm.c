/* Simulated virtual memory management (cuMemAddressReserve, cuMemCreate,
 * cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease) on the CPU.
 *
 * A reservation is an mmap(PROT_NONE, NORESERVE) range. All physical memory
 * is ONE memfd (one fd per chunk would run out of fds); a chunk is a range of
 * its file offsets, handed out first-fit from a free list, and released by
 * punching a hole so the memory really goes back. Mapping a chunk maps its
 * file range MAP_SHARED|MAP_FIXED, PROT_NONE until set_access; unmapping puts
 * an anonymous PROT_NONE range back. Remapping a chunk elsewhere keeps its
 * bytes, as on the GPU.
 *
 * Each chunk is memory of one device, counted against that device's
 * memory. A mapping records which devices set_access granted access to
 * (the CPU may touch it once any device may); a kernel of a device outside
 * that set does not run (sim/stream.c), as a GPU would fault.
 *
 * Validation follows CUDA: maps never over a mapping, exactly the chunk's
 * size, granularity-aligned; unmap and set_access never of part of a
 * mapping; va_release only of a whole reservation with nothing mapped in it.
 * Releasing a chunk that is still mapped is allowed (as in CUDA): its handle
 * dies at once, its memory at its last unmap. Stricter than CUDA on purpose,
 * to catch allocator bugs (measured on an H200, driver 580: CUDA accepts
 * these): a map must lie inside ONE reservation (CUDA maps across adjacent
 * ones), and unmap / set_access must cover contiguous mappings with no gap
 * (CUDA accepts gaps, and unmap of a range with nothing mapped).
 *
 * Called by driver/host.c (driver ops) and sim/stream.c (may a kernel touch
 * this range?), with the simulator lock held.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* memfd_create, fallocate, MAP_NORESERVE */
#endif
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim.h"

#define G SA_SIM_GRANULARITY

typedef struct extent_s {
  uint64_t off, len; /* a free range of memfd offsets */
} extent;

typedef struct va_range_s {
  uintptr_t base;
  size_t size;
} va_range;

typedef struct sim_chunk_s {
  uint64_t off;     /* file offset in the memfd */
  size_t size;
  int device;       /* whose memory it is */
  size_t map_count; /* live mappings of this chunk */
  int released;     /* handle released; memory freed at the last unmap */
} sim_chunk;

typedef struct mapping_s {
  uintptr_t va;
  size_t size; /* == chunk->size */
  sim_chunk *chunk;
  sa_sim_devices access; /* devices set_access granted; 0: none yet */
} mapping;

static struct {
  int fd;            /* the device's memory; -1 until the first chunk */
  uint64_t file_end; /* offsets at or past this are free */
  extent *free;      /* sorted by offset, never adjacent */
  size_t nfree, free_cap;
  va_range *ranges; /* sorted by base */
  size_t nranges, ranges_cap;
  mapping *maps; /* sorted by va */
  size_t nmaps, maps_cap;
  sa_sim_ptrset chunks; /* live chunk handles */
  size_t nchunks;       /* chunks holding memory (released-but-mapped included) */
  size_t chunk_bytes;
  size_t device_chunk_bytes[SA_SIM_MAX_DEVICES]; /* the same, per device */
  size_t device_bytes;  /* of each device */
  /* Successful calls' bytes and the mappings they covered since the
   * process started (sa_host_totals' fields but calls). */
  sa_host_totals totals;
} vmm = {.fd = -1, .device_bytes = SA_SIM_DEFAULT_DEVICE_BYTES};

/* The same, of the calling thread's calls (sa_host_get_thread_totals). */
static _Thread_local sa_host_totals thread_totals;

/* Count n in a field of both: the process's totals and the thread's. */
#define COUNT(field, n) (vmm.totals.field += (n), thread_totals.field += (n))

static sa_status einval(const char *what) { return sa_sim_fail(SA_ERR_DRIVER, EINVAL, what); }

/* Make room for need elements in a growable array. */
static sa_status grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return SA_OK;
  size_t n = *cap < 16 ? 16 : *cap;
  while (n < need) {
    if (n > SIZE_MAX / 2 / elem) return SA_ERR_OUT_OF_MEMORY;
    n *= 2;
  }
  void *p = realloc(*arr, n * elem);
  if (p == NULL) return SA_ERR_OUT_OF_MEMORY;
  *arr = p;
  *cap = n;
  return SA_OK;
}

/* Number of elements of a sorted array whose address field (at key_off
 * in each elem-byte element) is <= p: a binary search over either table. */
static size_t count_upto(const void *arr, size_t n, size_t elem, size_t key_off, uintptr_t p) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    uintptr_t key;
    memcpy(&key, (const char *)arr + mid * elem + key_off, sizeof key);
    if (key <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Number of reservations with base <= p. */
static size_t ranges_upto(uintptr_t p) {
  return count_upto(vmm.ranges, vmm.nranges, sizeof *vmm.ranges, offsetof(va_range, base), p);
}

/* Number of mappings with va <= p. */
static size_t maps_upto(uintptr_t p) {
  return count_upto(vmm.maps, vmm.nmaps, sizeof *vmm.maps, offsetof(mapping, va), p);
}

/* The reservation holding all of [p, p + size), or NULL. */
static const va_range *range_holding(uintptr_t p, size_t size) {
  size_t j = ranges_upto(p);
  if (j == 0) return NULL;
  const va_range *r = &vmm.ranges[j - 1];
  if (p - r->base >= r->size || size > r->size - (p - r->base)) return NULL;
  return r;
}

/* [va, va + size) is exactly whole, contiguous mappings [*first, *end). */
static int whole_mappings(uintptr_t va, size_t size, size_t *first, size_t *end) {
  size_t j = maps_upto(va);
  if (j == 0 || vmm.maps[j - 1].va != va) return 0;
  size_t k = j - 1;
  uintptr_t at = va;
  while (k < vmm.nmaps && vmm.maps[k].va == at && at - va < size) {
    at += vmm.maps[k].size;
    k++;
  }
  if (at - va != size) return 0;
  *first = j - 1;
  *end = k;
  return 1;
}

/* ---- memfd offsets ------------------------------------------------------ */

static sa_status offsets_alloc(size_t size, uint64_t *off) {
  for (size_t i = 0; i < vmm.nfree; i++) {
    extent *e = &vmm.free[i];
    if (e->len < size) continue;
    *off = e->off;
    e->off += size;
    e->len -= size;
    if (e->len == 0) {
      memmove(e, e + 1, (vmm.nfree - i - 1) * sizeof *e);
      vmm.nfree--;
    }
    return SA_OK;
  }
  if ((uint64_t)size > (uint64_t)INT64_MAX - vmm.file_end) {
    return sa_sim_fail(SA_ERR_OUT_OF_MEMORY, EFBIG, "host: device file offsets exhausted");
  }
  if (ftruncate(vmm.fd, (off_t)(vmm.file_end + size)) != 0) {
    return sa_sim_fail(SA_ERR_DRIVER, errno, "host: ftruncate of the device memfd failed");
  }
  *off = vmm.file_end;
  vmm.file_end += size;
  return SA_OK;
}

/* Give [off, off + len) back. Never fails: chunk_create keeps room for one
 * extent per chunk plus one. */
static void offsets_free(uint64_t off, uint64_t len) {
  size_t i = 0;
  while (i < vmm.nfree && vmm.free[i].off < off) i++;
  int joins_prev = i > 0 && vmm.free[i - 1].off + vmm.free[i - 1].len == off;
  int joins_next = i < vmm.nfree && off + len == vmm.free[i].off;
  if (joins_prev && joins_next) {
    vmm.free[i - 1].len += len + vmm.free[i].len;
    memmove(&vmm.free[i], &vmm.free[i + 1], (vmm.nfree - i - 1) * sizeof(extent));
    vmm.nfree--;
    i--;
  } else if (joins_prev) {
    vmm.free[i - 1].len += len;
    i--;
  } else if (joins_next) {
    vmm.free[i].off = off;
    vmm.free[i].len += len;
  } else {
    memmove(&vmm.free[i + 1], &vmm.free[i], (vmm.nfree - i) * sizeof(extent));
    vmm.free[i] = (extent){off, len};
    vmm.nfree++;
  }
  /* A free tail shrinks the file's live part; the next extension reuses it. */
  if (vmm.free[i].off + vmm.free[i].len == vmm.file_end) {
    vmm.file_end = vmm.free[i].off;
    vmm.nfree--;
  }
}

static int punch(uint64_t off, uint64_t len) {
  return fallocate(vmm.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
}

/* The chunk's memory goes back to the device. */
static void chunk_free(sim_chunk *c) {
  if (punch(c->off, c->size) != 0) {
    /* Only the pages stay resident; the offsets are still reusable. */
    fprintf(stderr, "streamarena host: punching a hole in the device memfd failed: %s\n",
            strerror(errno));
  }
  offsets_free(c->off, c->size);
  vmm.nchunks--;
  vmm.chunk_bytes -= c->size;
  vmm.device_chunk_bytes[c->device] -= c->size;
  free(c);
}

/* ---- reservations ------------------------------------------------------- */

sa_status sa_sim_va_reserve(size_t size, size_t alignment, uintptr_t *out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  if (size == 0 || size % G != 0) return einval("host: va_reserve size not a multiple of the granularity");
  if ((alignment & (alignment - 1)) != 0) return einval("host: va_reserve alignment not a power of two");
  size_t align = alignment > G ? alignment : G;
  if (size > SIZE_MAX - align) return sa_sim_fail(SA_ERR_OUT_OF_MEMORY, ENOMEM, "host: va_reserve size too large");
  if (grow((void **)&vmm.ranges, &vmm.ranges_cap, vmm.nranges + 1, sizeof(va_range)) != SA_OK) {
    return sa_sim_fail(SA_ERR_OUT_OF_MEMORY, ENOMEM, "host: out of host memory");
  }
  /* Over-reserve by the alignment, then trim both ends. */
  void *m = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return sa_sim_fail(SA_ERR_OUT_OF_MEMORY, errno, "host: mmap of a reservation failed");
  uintptr_t raw = (uintptr_t)m;
  uintptr_t base = (raw + align - 1) & ~(uintptr_t)(align - 1);
  size_t head = base - raw, tail = align - head;
  if ((head != 0 && munmap(m, head) != 0) || (tail != 0 && munmap((void *)(base + size), tail) != 0)) {
    int err = errno;
    (void)munmap(m, size + align); /* whatever is left of it */
    return sa_sim_fail(SA_ERR_DRIVER, err, "host: munmap while trimming a reservation failed");
  }
  size_t j = ranges_upto(base);
  memmove(&vmm.ranges[j + 1], &vmm.ranges[j], (vmm.nranges - j) * sizeof(va_range));
  vmm.ranges[j] = (va_range){base, size};
  vmm.nranges++;
  *out = base;
  return SA_OK;
}

sa_status sa_sim_va_release(uintptr_t va, size_t size) {
  size_t j = ranges_upto(va);
  if (j == 0 || vmm.ranges[j - 1].base != va || vmm.ranges[j - 1].size != size) {
    return einval("host: va_release of something that is not a whole reservation");
  }
  size_t k = maps_upto(va);
  if ((k > 0 && vmm.maps[k - 1].va == va) || (k < vmm.nmaps && vmm.maps[k].va - va < size)) {
    return sa_sim_fail(SA_ERR_DRIVER, EBUSY, "host: va_release of a reservation with mappings in it");
  }
  if (munmap((void *)va, size) != 0) return sa_sim_fail(SA_ERR_DRIVER, errno, "host: munmap of a reservation failed");
  memmove(&vmm.ranges[j - 1], &vmm.ranges[j], (vmm.nranges - j) * sizeof(va_range));
  vmm.nranges--;
  return SA_OK;
}

/* ---- chunks ------------------------------------------------------------- */

sa_status sa_sim_chunk_create(int device, size_t size, uint64_t *out) {
  if (out == NULL) return SA_ERR_INVALID_ARGUMENT;
  if (size == 0 || size % G != 0) return einval("host: chunk size not a multiple of the granularity");
  if (size > vmm.device_bytes - vmm.device_chunk_bytes[device]) {
    return sa_sim_fail(SA_ERR_OUT_OF_MEMORY, ENOMEM, "host: out of simulated device memory");
  }
  if (vmm.fd < 0) {
    vmm.fd = memfd_create("streamarena-host-device", MFD_CLOEXEC);
    if (vmm.fd < 0) return sa_sim_fail(SA_ERR_DRIVER, errno, "host: memfd_create failed");
  }
  /* Every allocation first, so that a failure changes nothing. */
  if (sa_sim_ptrset_reserve(&vmm.chunks, 1) != SA_OK ||
      grow((void **)&vmm.free, &vmm.free_cap, vmm.nchunks + 2, sizeof(extent)) != SA_OK) {
    return sa_sim_fail(SA_ERR_OUT_OF_MEMORY, ENOMEM, "host: out of host memory");
  }
  sim_chunk *c = calloc(1, sizeof *c);
  if (c == NULL) return sa_sim_fail(SA_ERR_OUT_OF_MEMORY, ENOMEM, "host: out of host memory");
  sa_status st = offsets_alloc(size, &c->off);
  if (st != SA_OK) {
    free(c);
    return st;
  }
  c->size = size;
  c->device = device;
  sa_sim_ptrset_insert(&vmm.chunks, c);
  vmm.nchunks++;
  vmm.chunk_bytes += size;
  COUNT(bytes_created, size);
  vmm.device_chunk_bytes[device] += size;
  *out = (uint64_t)(uintptr_t)c;
  return SA_OK;
}

static sim_chunk *chunk_lookup(uint64_t handle) {
  sim_chunk *c = (sim_chunk *)(uintptr_t)handle;
  return sa_sim_ptrset_contains(&vmm.chunks, c) ? c : NULL;
}

sa_status sa_sim_chunk_release(uint64_t handle) {
  sim_chunk *c = chunk_lookup(handle);
  if (c == NULL) return einval("host: chunk_release of an unknown or released chunk");
  (void)sa_sim_ptrset_remove(&vmm.chunks, c);
  COUNT(bytes_released, c->size);
  if (c->map_count > 0) {
    c->released = 1; /* CUDA frees it at the last unmap */
    return SA_OK;
  }
  chunk_free(c);
  return SA_OK;
}

/* ---- mappings ----------------------------------------------------------- */

sa_status sa_sim_map(uintptr_t va, size_t size, uint64_t handle) {
  sim_chunk *c = chunk_lookup(handle);
  if (c == NULL) return einval("host: map of an unknown or released chunk");
  if (size != c->size) return einval("host: map size differs from the chunk's size");
  if (va % G != 0) return einval("host: map address not aligned to the granularity");
  if (range_holding(va, size) == NULL) return einval("host: map outside a reserved range");
  size_t j = maps_upto(va);
  if ((j > 0 && va - vmm.maps[j - 1].va < vmm.maps[j - 1].size) ||
      (j < vmm.nmaps && vmm.maps[j].va - va < size)) {
    return sa_sim_fail(SA_ERR_DRIVER, EEXIST, "host: map over an existing mapping");
  }
  if (grow((void **)&vmm.maps, &vmm.maps_cap, vmm.nmaps + 1, sizeof(mapping)) != SA_OK) {
    return sa_sim_fail(SA_ERR_OUT_OF_MEMORY, ENOMEM, "host: out of host memory");
  }
  void *m = mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, vmm.fd, (off_t)c->off);
  if (m == MAP_FAILED) {
    int err = errno;
    /* A failed MAP_FIXED may have dropped the old range: reserve it again. */
    (void)mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return sa_sim_fail(SA_ERR_DRIVER, err, "host: mmap of a chunk failed");
  }
  memmove(&vmm.maps[j + 1], &vmm.maps[j], (vmm.nmaps - j) * sizeof(mapping));
  vmm.maps[j] = (mapping){va, size, c, 0};
  vmm.nmaps++;
  c->map_count++;
  COUNT(bytes_mapped, size);
  return SA_OK;
}

sa_status sa_sim_unmap(uintptr_t va, size_t size) {
  size_t first, end;
  if (size == 0 || !whole_mappings(va, size, &first, &end)) {
    return einval("host: unmap of a range that is not exactly whole mappings");
  }
  void *m = mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (m == MAP_FAILED) return sa_sim_fail(SA_ERR_DRIVER, errno, "host: mmap over an unmapped range failed");
  sa_sim_note_unmap(va, size);
  for (size_t k = first; k < end; k++) {
    sim_chunk *c = vmm.maps[k].chunk;
    c->map_count--;
    if (c->released && c->map_count == 0) chunk_free(c);
  }
  memmove(&vmm.maps[first], &vmm.maps[end], (vmm.nmaps - end) * sizeof(mapping));
  vmm.nmaps -= end - first;
  COUNT(bytes_unmapped, size);
  COUNT(chunks_unmapped, end - first);
  return SA_OK;
}

sa_status sa_sim_set_access(uintptr_t va, size_t size, sa_sim_devices devices) {
  size_t first, end;
  if (size == 0 || !whole_mappings(va, size, &first, &end)) {
    return einval("host: set_access of a range that is not exactly whole mappings");
  }
  int n = sa_sim_device_count();
  if (devices == 0 || (n < 64 && devices >> n != 0)) {
    return sa_sim_fail(SA_ERR_DRIVER, ENODEV, "host: set_access for no device or a device that does not exist");
  }
  for (size_t k = first; k < end; k++)
    for (int dev = 0; dev < n; dev++)
      if ((devices >> dev & 1) && !sa_sim_can_access_peer(dev, vmm.maps[k].chunk->device))
        return sa_sim_fail(SA_ERR_DRIVER, EPERM, "host: set_access for a device that cannot access the memory's device");
  if (mprotect((void *)va, size, PROT_READ | PROT_WRITE) != 0) {
    return sa_sim_fail(SA_ERR_DRIVER, errno, "host: mprotect failed");
  }
  for (size_t k = first; k < end; k++) vmm.maps[k].access |= devices;
  COUNT(bytes_access, size);
  COUNT(chunks_access, end - first);
  return SA_OK;
}

/* ---- queries ------------------------------------------------------------ */

int sa_sim_vmm_is_device(uintptr_t p, size_t size) { return range_holding(p, size) != NULL; }

int sa_sim_vmm_accessible(uintptr_t p, size_t size, int device) {
  if (size == 0) return 1;
  if (p > UINTPTR_MAX - size) return 0;
  uintptr_t end = p + size;
  size_t j = ranges_upto(p);
  int starts_inside = j > 0 && p - vmm.ranges[j - 1].base < vmm.ranges[j - 1].size;
  if (!starts_inside) {
    /* Host memory, unless it runs into a reservation. */
    return !(j < vmm.nranges && vmm.ranges[j].base < end);
  }
  size_t k = maps_upto(p);
  if (k == 0) return 0;
  uintptr_t at = p;
  for (k--; at < end; k++) {
    if (k >= vmm.nmaps) return 0;
    const mapping *m = &vmm.maps[k];
    if (m->va > at || at - m->va >= m->size || m->access == 0) return 0;
    if (device != SA_SIM_ANY_DEVICE && !(m->access >> device & 1)) return 0;
    at = m->va + m->size;
  }
  return 1;
}

int sa_sim_vmm_device_of(uintptr_t p) {
  size_t k = maps_upto(p);
  if (k == 0 || p - vmm.maps[k - 1].va >= vmm.maps[k - 1].size) return -1;
  return vmm.maps[k - 1].chunk->device;
}

size_t sa_sim_vmm_device_bytes_used(int device) { return vmm.device_chunk_bytes[device]; }

size_t sa_sim_device_bytes(void) { return vmm.device_bytes; }

sa_status sa_sim_set_device_bytes(size_t bytes) {
  if (bytes < G) return SA_ERR_INVALID_ARGUMENT;
  for (int dev = 0; dev < SA_SIM_MAX_DEVICES; dev++)
    if (bytes < vmm.device_chunk_bytes[dev]) return SA_ERR_INVALID_ARGUMENT;
  vmm.device_bytes = bytes;
  return SA_OK;
}

void sa_sim_vmm_counters(sa_host_counters *out) {
  out->va_ranges = vmm.nranges;
  out->chunks = vmm.nchunks;
  out->chunk_bytes = vmm.chunk_bytes;
  out->mappings = vmm.nmaps;
}

/* Copy the byte and mapping counts of from, not its calls. */
static void copy_counts(const sa_host_totals *from, sa_host_totals *out) {
  out->bytes_created = from->bytes_created;
  out->bytes_released = from->bytes_released;
  out->bytes_mapped = from->bytes_mapped;
  out->bytes_unmapped = from->bytes_unmapped;
  out->bytes_access = from->bytes_access;
  out->chunks_unmapped = from->chunks_unmapped;
  out->chunks_access = from->chunks_access;
}

void sa_sim_vmm_totals(sa_host_totals *out) { copy_counts(&vmm.totals, out); }

void sa_sim_vmm_thread_totals(sa_host_totals *out) { copy_counts(&thread_totals, out); }

sa_status sa_host_pointer_device(const void *p, int *device) {
  if (device == NULL) return SA_ERR_INVALID_ARGUMENT;
  sa_sim_lock();
  *device = sa_sim_vmm_device_of((uintptr_t)p);
  sa_sim_unlock();
  return *device < 0 ? SA_ERR_INVALID_POINTER : SA_OK;
}
