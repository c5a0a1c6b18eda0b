# cython: language_level=3
# distutils: language = c++
"""streamarena's RMM resource for Python (streamarena._rmm): a subclass of
RMM's DeviceMemoryResource over streamarena::rmm_resource
(plugins/rmm/streamarena/rmm_resource.hpp), so RMM, and cuDF or cuML
through it, allocate with no Python per allocation. python/streamarena/rmm.py
is its front; plugins/rmm/build.sh compiles it against the RMM wheel it
is for."""

from cython.operator cimport dereference as deref
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional

from rmm.librmm.memory_resource cimport device_async_resource_ref
from rmm.pylibrmm.memory_resource._memory_resource cimport DeviceMemoryResource


cdef extern from "streamarena/streamarena.h" nogil:
    ctypedef struct sa_stats:
        size_t live_bytes, live_bytes_peak, reserved_bytes, reserved_bytes_peak
        size_t cached_bytes
        unsigned long long alloc_count, free_count, oom_events


cdef extern from "streamarena/rmm_resource.hpp" namespace "streamarena" nogil:
    cdef cppclass rmm_resource:
        rmm_resource(int device) except +
        sa_stats stats() except +


# RMM's pxd defines make_device_async_resource_ref as a C++ template for
# its own resources; this declares it for this one.
cdef extern from * nogil:
    optional[device_async_resource_ref] make_device_async_resource_ref(
        rmm_resource&) except +


cdef class StreamarenaMemoryResource(DeviceMemoryResource):
    """Device memory from streamarena's default arena of a device (one per
    device and process, shared with streamarena.cupy and .numba)."""

    cdef unique_ptr[rmm_resource] c_obj
    cdef readonly int device

    def __cinit__(self, int device):
        self.device = device
        self.c_obj.reset(new rmm_resource(device))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    def stats(self):
        """The arena's figures (sa_get_stats): bytes of live blocks and
        physical bytes held, now and at peak, cached bytes, counts."""
        cdef sa_stats s = deref(self.c_obj).stats()
        return {"live_bytes": s.live_bytes, "live_bytes_peak": s.live_bytes_peak,
                "reserved_bytes": s.reserved_bytes,
                "reserved_bytes_peak": s.reserved_bytes_peak,
                "cached_bytes": s.cached_bytes, "alloc_count": s.alloc_count,
                "free_count": s.free_count, "oom_events": s.oom_events}
