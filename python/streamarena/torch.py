"""streamarena as PyTorch's CUDA allocator.

    import streamarena.torch
    streamarena.torch.install(conf="superblock_size=4MiB")

``install`` must run before PyTorch allocates CUDA memory (before CUDA is
initialized in the process). It installs one of two backends:

native      a C++ subclass of PyTorch's allocator interface
            (c10::cuda::CUDACachingAllocator::CUDAAllocator,
            plugins/torch/native/), built for the torch at hand with
            ``python -m streamarena.torch build``: everything PyTorch asks of
            its allocator reaches streamarena, torch.cuda.memory_stats,
            memory_summary, torch.OutOfMemoryError, cudnn.benchmark's
            workspace query, set_per_process_memory_fraction, memory history
            and snapshots, torch.cuda.MemPool and the graph pools of CUDA
            graphs and torch.compile(mode="reduce-overhead") included
            (docs/TORCH.md says what a capture cannot do yet).
pluggable   libstreamarena_torch.so through
            torch.cuda.memory.CUDAPluggableAllocator, which needs no build
            against torch but gets only malloc, free, record_stream,
            empty_cache and the memory fraction from PyTorch; ``install``
            replaces ``torch.cuda.memory``'s ``memory_stats_as_nested_dict`` and
            ``reset_peak_memory_stats`` with ones that read the plugin
            (``patch_stats=False`` leaves PyTorch alone).

By default the native backend is used where one is built for this torch,
and the pluggable one otherwise, with a warning naming what it cannot do.
The object ``install`` returns has the same statistics either way
(``stats(device)``, ``errors()``, ``empty_cache()``), and the ``Plugin`` class
drives the C library through ctypes without PyTorch.

    python -m streamarena.torch build [--out DIR] [--torch-root DIR]

builds the native backend (python/streamarena/_native_build.py).
"""

import ctypes
import os
import sys

from streamarena import _conf, _library
from streamarena import _native_build

# A NaN in fp32, bf16 and fp16 alike: memory reused too early poisons the loss.
CHECK_PATTERN = 0x7FC07FC0

# What install() adds to a configuration that does not name it: requests
# above 1 KiB take spans, not superblocks' size classes. A training loop's
# tensors come in many sizes between 1 KiB and 1 MiB that would each hold
# a superblock per stream partly empty; as spans they pack (docs/TORCH.md,
# Measured: 1.007 x peak allocated against 1.016 with the library's own
# threshold, superblock_size / 2). And a growth maps what its request
# misses, nothing ahead, as expandable segments map: the first step's
# climb ends at its peak with nothing mapped past it (docs/NOTES.md, Note
# [Mapping ahead]).
TORCH_DEFAULTS = (("large_threshold", "large_threshold=1KiB"), ("exact_growth", "exact_growth=1"))


def torch_conf(conf):
    """The configuration install(conf) gives the arenas: conf (None:
    $STREAMARENA_CONF) with TORCH_DEFAULTS for the keys it does not name."""
    if conf is None:
        conf = os.environ.get("STREAMARENA_CONF", "")
    return _conf.with_defaults(conf, TORCH_DEFAULTS)
LIB_NAME = "libstreamarena_torch.so"
MAX_DEVICES = 64

_STATUS_OK = 0


class _Stats(ctypes.Structure):
    """sa_torch_stats (plugins/torch/streamarena_torch.h), field for field."""

    _fields_ = [
        ("requested_bytes", ctypes.c_uint64),
        ("requested_bytes_peak", ctypes.c_uint64),
        ("requested_bytes_total", ctypes.c_uint64),
        ("freed_bytes_total", ctypes.c_uint64),
        ("alloc_count", ctypes.c_uint64),
        ("free_count", ctypes.c_uint64),
        ("record_count", ctypes.c_uint64),
        ("check_fills", ctypes.c_uint64),
        ("errors", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
        ("reserved_bytes_peak", ctypes.c_uint64),
        ("live_bytes", ctypes.c_uint64),
        ("live_bytes_peak", ctypes.c_uint64),
        ("cached_bytes", ctypes.c_uint64),
        ("oom_events", ctypes.c_uint64),
        ("fast_path_ratio", ctypes.c_double),
    ]


def find_library(lib=None):
    """The plugin's path: lib, $STREAMARENA_TORCH_LIB, beside this package, or
    the checkout's Bazel output (bazel build //:streamarena_torch); the
    order is _library.find's."""
    return _library.find(LIB_NAME, "torch", "STREAMARENA_TORCH_LIB", lib)


class Plugin:
    """libstreamarena_torch.so through ctypes: the hooks PyTorch calls, and
    statistics. Loading it creates nothing; the arena of a device is created
    at its first allocation, from $STREAMARENA_CONF."""

    kind = "pluggable"

    def __init__(self, lib=None):
        self.path = find_library(lib)
        self.lib = _library.load(self.path)
        L = self.lib
        vp, sz, i32, u32, u64 = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                 ctypes.c_uint32, ctypes.c_uint64)
        L.sa_torch_malloc.argtypes = [sz, i32, vp]
        L.sa_torch_malloc.restype = vp
        L.sa_torch_free.argtypes = [vp, sz, i32, vp]
        L.sa_torch_free.restype = None
        L.sa_torch_record_stream.argtypes = [vp, vp]
        L.sa_torch_record_stream.restype = None
        L.sa_torch_empty_cache.argtypes = []
        L.sa_torch_empty_cache.restype = None
        L.sa_torch_set_memory_fraction.argtypes = [ctypes.c_double, i32]
        L.sa_torch_set_memory_fraction.restype = None
        L.sa_torch_set_check.argtypes = [i32, u32]
        L.sa_torch_set_check.restype = i32
        L.sa_torch_get_stats.argtypes = [i32, ctypes.POINTER(_Stats), sz]
        L.sa_torch_get_stats.restype = i32
        L.sa_torch_reset_peak.argtypes = [i32]
        L.sa_torch_reset_peak.restype = i32
        L.sa_torch_error_count.argtypes = []
        L.sa_torch_error_count.restype = u64
        L.sa_status_string.argtypes = [i32]
        L.sa_status_string.restype = ctypes.c_char_p

    def address(self, name):
        """The address of an exported function, as PyTorch's setters take it."""
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value

    def _check(self, status, what):
        if status != _STATUS_OK:
            raise RuntimeError(f"streamarena: {what}: {self.lib.sa_status_string(status).decode()}")

    # The hooks, callable directly (the CPU test does; PyTorch calls the C functions).
    def malloc(self, size, device=0, stream=None):
        return self.lib.sa_torch_malloc(size, device, stream)

    def free(self, ptr, size, device=0, stream=None):
        self.lib.sa_torch_free(ptr, size, device, stream)

    def record_stream(self, ptr, stream):
        self.lib.sa_torch_record_stream(ptr, stream)

    def empty_cache(self):
        self.lib.sa_torch_empty_cache()

    def set_check(self, enabled=True, pattern=CHECK_PATTERN):
        """Fill freed memory with pattern (see streamarena_torch.h); only
        before the first allocation."""
        self._check(self.lib.sa_torch_set_check(1 if enabled else 0, pattern), "set_check")

    def stats(self, device=0):
        """The plugin's statistics of device as a dict (zeros before its first use)."""
        s = _Stats()
        self._check(self.lib.sa_torch_get_stats(device, ctypes.byref(s), ctypes.sizeof(s)),
                    f"stats of device {device}")
        return {name: getattr(s, name) for name, _ in _Stats._fields_}

    def reset_peak(self, device=0):
        self._check(self.lib.sa_torch_reset_peak(device), f"reset_peak of device {device}")

    def errors(self):
        """Failed hooks so far (each also written to stderr, the first few in full)."""
        return int(self.lib.sa_torch_error_count())


# What the pluggable path cannot do, for the warning when install() falls
# back to it (docs/TORCH.md, "Two backends").
PLUGGABLE_LIMITS = (
    "cudnn.benchmark's workspace query (cacheInfo), CUDA graphs and "
    "torch.compile(mode='reduce-overhead') (graph pools), torch.OutOfMemoryError (a failed "
    "allocation returns a NULL tensor), torch.cuda.memory._record_memory_history and "
    "_snapshot, and torch.cuda.MemPool")


class NativeBackend:
    """The native backend, installed: the same statistics as Plugin's (the
    pluggable plugin's figures, from the native backend), through the C
    library of the plugin it links."""

    kind = "native"

    def __init__(self, path, meta, plugin):
        self.path, self.meta, self.plugin = path, meta, plugin
        self.lib = _library.load(path)
        L = self.lib
        L.sa_torch_native_install.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        L.sa_torch_native_install.restype = ctypes.c_int
        L.sa_torch_native_built_for.argtypes = []
        L.sa_torch_native_built_for.restype = ctypes.c_char_p
        L.sa_torch_native_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats),
                                                ctypes.c_size_t]
        L.sa_torch_native_get_stats.restype = ctypes.c_int
        L.sa_torch_native_error_count.argtypes = []
        L.sa_torch_native_error_count.restype = ctypes.c_uint64

    def built_for(self):
        return self.lib.sa_torch_native_built_for().decode()

    def install(self):
        err = ctypes.create_string_buffer(4096)
        if self.lib.sa_torch_native_install(err, len(err)) != 0:
            raise RuntimeError(f"streamarena: installing the native backend failed: "
                               f"{err.value.decode(errors='replace')}")

    def stats(self, device=0):
        s = _Stats()
        st = self.lib.sa_torch_native_get_stats(device, ctypes.byref(s), ctypes.sizeof(s))
        if st != _STATUS_OK:
            raise RuntimeError(f"streamarena: stats of device {device}: "
                               f"{self.plugin.lib.sa_status_string(st).decode()}")
        return {name: getattr(s, name) for name, _ in _Stats._fields_}

    def reset_peak(self, device=0):
        import torch

        torch.cuda.reset_peak_memory_stats(device)

    def empty_cache(self):
        import torch

        torch.cuda.empty_cache()

    def errors(self):
        return int(self.lib.sa_torch_native_error_count())


def native_status(native_lib=None):
    """(path, metadata, reason): the native backend this process would load,
    or path None and the reason it would not (none built, built for another
    torch). Imports torch."""
    import torch

    path, meta = _native_build.find_native(native_lib, torch.__version__)
    if path is None:
        return None, None, ("no native backend is built (python -m streamarena.torch build)")
    ok, why = _native_build.compatible(meta, torch.__version__, torch.version.git_version)
    if not ok:
        return None, meta, f"{why}: rebuild it with python -m streamarena.torch build"
    return path, meta, ""


_installed = None  # (Plugin or NativeBackend, conf) once install() succeeded


def install(conf=None, *, lib=None, native=None, native_lib=None, check=False,
            pattern=CHECK_PATTERN, patch_stats=True):
    """Make streamarena PyTorch's CUDA allocator in this process.

    conf: the arenas' configuration (``key=value,...``, README's keys); None
    keeps $STREAMARENA_CONF; either way TORCH_DEFAULTS fill the keys it
    leaves out (large_threshold=1KiB, exact_growth=1), and $STREAMARENA_CONF is set to the
    result, which the arenas read. native: None uses the native backend where one
    is built for this torch and the pluggable plugin otherwise (with a
    warning); True requires the native backend, False takes the plugin.
    check: fill freed memory with pattern before it can be reused (the
    plugin's check mode; slow; for finding premature reuse). Returns the
    installed backend (NativeBackend or Plugin). Raises RuntimeError, with
    the reason, when CUDA memory may already have been allocated, when
    native=True and no native backend fits, or when this PyTorch lacks a
    hook the plugin needs."""
    global _installed
    import torch

    if _installed is not None:
        backend, had_conf = _installed
        if conf is not None and torch_conf(conf) != had_conf:
            raise RuntimeError(f"streamarena is installed already with conf={had_conf!r}")
        return backend
    if not torch.cuda.is_available():
        raise RuntimeError("streamarena.torch.install: PyTorch sees no CUDA device")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "streamarena.torch.install() must run before PyTorch initializes CUDA: "
            f"CUDA is initialized already ({torch.cuda.memory_allocated()} bytes allocated "
            "by PyTorch's own allocator), and PyTorch cannot swap the allocator of a "
            "process whose allocator has started. Call it right after `import torch`.")
    os.environ["STREAMARENA_CONF"] = torch_conf(conf)
    plugin = Plugin(lib)
    path, why = None, "native=False"
    if check and native:
        raise RuntimeError("streamarena: check mode is the pluggable plugin's; install with "
                           "native=False (or None) to use it")
    if check:
        why = "check mode is the pluggable plugin's"
    elif native is not False:
        path, meta, why = native_status(native_lib)
        if path is None and native:
            raise RuntimeError(f"streamarena: no native backend for this torch: {why}")
    if path is not None:
        try:
            backend = NativeBackend(path, meta, plugin)
        except OSError as e:
            # A build that does not load here (a library it names is
            # missing): the plugin serves, unless the native one was asked for.
            if native:
                raise
            path, why = None, f"{path} does not load ({e})"
    if path is not None:
        backend.install()
        _installed = (backend, os.environ.get("STREAMARENA_CONF", ""))
        return backend
    if native is None and not check:
        import warnings

        warnings.warn(f"streamarena: PyTorch's pluggable allocator interface is used ({why}); "
                      f"it cannot serve {PLUGGABLE_LIMITS}", RuntimeWarning, stacklevel=2)
    return _install_pluggable(torch, plugin, check, pattern, patch_stats)


def _install_pluggable(torch, plugin, check, pattern, patch_stats):
    global _installed
    if check:
        plugin.set_check(True, pattern)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(plugin.path, "sa_torch_malloc",
                                                         "sa_torch_free")
    raw = allocator.allocator()
    hooks = {
        "set_record_stream_fn": "sa_torch_record_stream",
        "set_reset_fn": "sa_torch_empty_cache",
        "set_memory_fraction_fn": "sa_torch_set_memory_fraction",
    }
    for setter, fn in hooks.items():
        if not hasattr(raw, setter):
            raise RuntimeError(
                f"this PyTorch ({torch.__version__}) has no CUDAPluggableAllocator.{setter}: "
                "without it tensor.record_stream would do nothing and memory could be reused "
                "while another stream still uses it")
        getattr(raw, setter)(plugin.address(fn))
    torch.cuda.memory.change_current_allocator(allocator)
    if patch_stats:
        _patch_torch_stats(torch, plugin)
    _installed = (plugin, os.environ.get("STREAMARENA_CONF", ""))
    return plugin


def installed():
    """The installed backend (NativeBackend or Plugin) when install() ran in
    this process, else None."""
    return _installed[0] if _installed is not None else None


def _plugin():
    if _installed is None:
        raise RuntimeError("streamarena.torch.install() has not run in this process")
    return _installed[0]


def _device_index(device):
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


def memory_stats(device=None):
    """The plugin's statistics of a device (the current one by default): bytes
    requested by PyTorch now and at peak, physical bytes reserved now and at
    peak (the arena's footprint), block bytes, cached bytes, counts, errors."""
    return _plugin().stats(_device_index(device))


def empty_cache():
    """Give cached memory of every arena back to the driver (what
    torch.cuda.empty_cache() does once installed)."""
    _plugin().empty_cache()


def trim():
    """Alias of empty_cache()."""
    empty_cache()


def errors():
    """Failed hooks so far; nonzero means an allocation failed or a free was refused."""
    return _plugin().errors()


def _nested_stats(s):
    """PyTorch's memory_stats_as_nested_dict shape, from the plugin's figures.
    allocated, active and requested bytes are the bytes PyTorch asked for
    (their allocated and freed totals too, memory_summary's Tot Alloc and Tot
    Freed), reserved bytes the arena's physical bytes; pools are not told apart (all
    of it shows as the large pool); PyTorch's segment figures have no
    counterpart and read 0."""

    def one(current=0, peak=0, allocated=0, freed=0):
        return {"current": current, "peak": peak, "allocated": allocated, "freed": freed}

    def pools(**kw):
        return {"all": one(**kw), "large_pool": one(**kw), "small_pool": one()}

    live = s["alloc_count"] - s["free_count"]
    req = dict(current=s["requested_bytes"], peak=s["requested_bytes_peak"],
               allocated=s["requested_bytes_total"], freed=s["freed_bytes_total"])
    count = dict(current=live, allocated=s["alloc_count"], freed=s["free_count"])
    return {
        "allocated_bytes": pools(**req),
        "active_bytes": pools(**req),
        "requested_bytes": pools(**req),
        "reserved_bytes": pools(current=s["reserved_bytes"], peak=s["reserved_bytes_peak"]),
        "inactive_split_bytes": pools(),
        "allocation": pools(**count),
        "active": pools(**count),
        "segment": pools(),
        "inactive_split": pools(),
        "oversize_allocations": one(),
        "oversize_segments": one(),
        "num_ooms": s["oom_events"],
        "num_alloc_retries": 0,
        "num_sync_all_streams": 0,
        "num_device_alloc": 0,
        "num_device_free": 0,
    }


def _patch_torch_stats(torch, plugin):
    """torch.cuda.memory_stats and what reads it (memory_allocated,
    max_memory_reserved, memory_summary, ...) read the plugin; so does
    reset_peak_memory_stats (the requested-bytes peak; the arena's reserved
    peak cannot be reset)."""
    mem = torch.cuda.memory

    def memory_stats_as_nested_dict(device=None):
        if not torch.cuda.is_initialized():
            return {}
        return _nested_stats(plugin.stats(_device_index(device)))

    def reset_peak_memory_stats(device=None):
        plugin.reset_peak(_device_index(device))

    mem.memory_stats_as_nested_dict = memory_stats_as_nested_dict
    for module in (mem, torch.cuda):
        if hasattr(module, "reset_peak_memory_stats"):
            module.reset_peak_memory_stats = reset_peak_memory_stats


def _main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m streamarena.torch build [options]  (build --help lists them)")
        return 0 if argv else 2
    if argv[0] != "build":
        print(f"python -m streamarena.torch: unknown command {argv[0]!r} (build)", file=sys.stderr)
        return 2
    return _native_build.main(argv[1:])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
