"""The host simulator's API (include/streamarena/host.h) through ctypes, from
a library that exports it (libstreamarena_torch.so does): simulated streams
that run when told to, fill and check kernels, counters. For tests and
replays on machines without a GPU.
"""
import ctypes

AUTO, MANUAL = 0, 1  # sa_host_mode


class Counters(ctypes.Structure):
    """sa_host_counters."""

    _fields_ = [("va_ranges", ctypes.c_size_t), ("chunks", ctypes.c_size_t),
                ("chunk_bytes", ctypes.c_size_t), ("mappings", ctypes.c_size_t),
                ("events", ctypes.c_size_t), ("streams", ctypes.c_size_t),
                ("order_violations", ctypes.c_uint64)]


class Host:
    def __init__(self, lib):
        self.lib = lib
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        for name, args in [("sa_host_stream_create", [ctypes.c_int, ctypes.POINTER(vp)]),
                           ("sa_host_stream_step", [vp, sz, ctypes.POINTER(sz)]),
                           ("sa_host_stream_drain", [vp]),
                           ("sa_host_stream_begin_capture", [vp, ctypes.c_int]),
                           ("sa_host_stream_end_capture", [vp]),
                           ("sa_host_drain_all", []),
                           ("sa_host_set_device_memory", [sz]),
                           ("sa_host_fill", [vp, vp, sz, ctypes.c_uint32]),
                           ("sa_host_check", [vp, vp, sz, ctypes.c_uint32,
                                              ctypes.POINTER(ctypes.c_uint64)])]:
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        lib.sa_host_stream_pending.argtypes = [vp]
        lib.sa_host_stream_pending.restype = sz
        lib.sa_host_get_counters.argtypes = [ctypes.POINTER(Counters)]
        lib.sa_host_get_counters.restype = None
        self._keep = []  # check counters must outlive their kernels

    def _ok(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: status {status}")

    def stream(self, mode=AUTO):
        s = ctypes.c_void_p()
        self._ok(self.lib.sa_host_stream_create(mode, ctypes.byref(s)), "sa_host_stream_create")
        return s.value

    def step(self, stream, n=1 << 62):
        """Complete up to n queued operations of stream; returns how many ran
        (fewer where one waits on an event not yet complete)."""
        done = ctypes.c_size_t()
        self._ok(self.lib.sa_host_stream_step(stream, n, ctypes.byref(done)),
                 "sa_host_stream_step")
        return done.value

    def begin_capture(self, stream, mode=0):
        """Capture stream into a graph (mode: 0 global, 1 thread-local,
        2 relaxed), as cuStreamBeginCapture."""
        self._ok(self.lib.sa_host_stream_begin_capture(stream, mode),
                 "sa_host_stream_begin_capture")

    def end_capture(self, stream):
        """End the capture; the status (0: it stayed intact)."""
        return self.lib.sa_host_stream_end_capture(stream)

    def pending(self, stream):
        return self.lib.sa_host_stream_pending(stream)

    def drain_all(self):
        self._ok(self.lib.sa_host_drain_all(), "sa_host_drain_all")

    def set_device_memory(self, nbytes):
        self._ok(self.lib.sa_host_set_device_memory(nbytes), "sa_host_set_device_memory")

    def fill(self, stream, p, size, pattern):
        self._ok(self.lib.sa_host_fill(stream, p, size, pattern), "sa_host_fill")

    def check(self, stream, p, size, pattern):
        """A pending read of [p, p + size) on stream; the returned counter
        holds the mismatching words once it ran."""
        mismatches = ctypes.c_uint64(0)
        self._keep.append(mismatches)
        self._ok(self.lib.sa_host_check(stream, p, size, pattern, ctypes.byref(mismatches)),
                 "sa_host_check")
        return mismatches

    def counters(self):
        c = Counters()
        self.lib.sa_host_get_counters(ctypes.byref(c))
        return c
