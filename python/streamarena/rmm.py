"""streamarena as RMM's memory resource, for RMM and what allocates through
it (cuDF, cuML, RMM's CuPy and Numba allocators).

    import rmm
    import streamarena.rmm
    rmm.mr.set_current_device_resource(streamarena.rmm.resource())
    # or: streamarena.rmm.install()

``resource()`` is a ``rmm.mr.DeviceMemoryResource``: with the compiled
extension streamarena._rmm (plugins/rmm/build.sh builds it against the RMM
wheel), RMM calls streamarena::rmm_resource's C++ directly and no Python
runs per allocation; without it, an ``rmm.mr.CallbackMemoryResource`` calls
libstreamarena_python.so through ctypes (correct, but Python per call), with
a warning. Either way out of memory is RMM's: ``MemoryError`` in Python,
``rmm::out_of_memory`` in C++.

docs/ECOSYSTEM.md says what maps to what and what is not supported.
"""

import warnings

from streamarena import _hooks
from streamarena._library import StreamarenaError


def _device(device):
    if device is not None:
        return device
    from rmm._cuda.gpu import getDevice

    return getDevice()


def _stream_handle(stream):
    return int(stream.__cuda_stream__()[1]) if stream is not None else 0


def compiled():
    """Whether the compiled resource (streamarena._rmm) loads here."""
    try:
        _load_extension()
        return True
    except ImportError:
        return False


def _load_extension():
    # RMM's own modules load librmm.so first; ours needs it.
    import rmm  # noqa: F401
    from streamarena import _rmm

    return _rmm


def resource(device=None, *, conf=None, lib=None, compiled_only=False):
    """A DeviceMemoryResource over streamarena's default arena of device
    (the current one by default). conf: the arenas' configuration
    (STREAMARENA_CONF), read at their first use. compiled_only: raise
    instead of falling back to the ctypes resource."""
    hooks = _hooks.get(conf, lib)  # first: the extension then links to this library
    device = _device(device)
    try:
        return _load_extension().StreamarenaMemoryResource(device)
    except ImportError as e:
        if compiled_only:
            raise
        warnings.warn(f"streamarena.rmm: the compiled resource is not available ({e}); "
                      "using a ctypes resource, which runs Python at each allocation",
                      RuntimeWarning, stacklevel=2)
    return callback_resource(hooks, device)


def callback_resource(hooks, device):
    """The ctypes form: rmm.mr.CallbackMemoryResource over sa_py_alloc and
    sa_py_free (counted in streamarena's figures of the device)."""
    import rmm

    def allocate(size, stream):
        st, ptr = hooks.alloc(device, size, _stream_handle(stream))
        if st == _hooks.OUT_OF_MEMORY:
            # RMM turns a MemoryError into rmm::out_of_memory for C++ callers.
            raise MemoryError(f"streamarena: out of memory allocating {size} bytes on "
                              f"device {device} ({hooks.describe(st)})")
        hooks.check(st, f"allocating {size} bytes on device {device}")
        return ptr

    def deallocate(ptr, size, stream):
        st = hooks.free(device, ptr, size, _stream_handle(stream))
        if st != _hooks.OK:
            warnings.warn(f"streamarena.rmm: deallocate({ptr:#x}, {size}): "
                          f"{hooks.describe(st)}", RuntimeWarning, stacklevel=2)

    return rmm.mr.CallbackMemoryResource(allocate, deallocate)


def install(device=None, *, conf=None, lib=None):
    """rmm.mr.set_current_device_resource(resource(device)); returns it."""
    import rmm

    mr = resource(device, conf=conf, lib=lib)
    if device is None:
        rmm.mr.set_current_device_resource(mr)
    else:
        rmm.mr.set_per_device_resource(device, mr)
    return mr


def memory_stats(device=None):
    """The figures streamarena's hooks keep of a device: those of the ctypes
    resource's allocations (and CuPy's, Numba's). The compiled resource
    calls the arena directly: its ``stats()`` gives the arena's own."""
    return _hooks.get().stats(_device(device))


def trim():
    """Give the arenas' cached memory back to the driver."""
    _hooks.get().trim()


__all__ = ["StreamarenaError", "resource", "install", "compiled", "memory_stats", "trim",
           "callback_resource"]
