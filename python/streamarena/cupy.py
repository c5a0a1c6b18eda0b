"""streamarena as CuPy's memory allocator.

    import streamarena.cupy
    streamarena.cupy.install()            # every CuPy allocation from now on

    with streamarena.cupy.using():        # or only inside a block, this thread
        x = cupy.arange(10)

CuPy calls two C functions of libstreamarena_python.so through its C
allocator hook (``cupy.cuda.memory.CFunctionAllocator``): no Python runs per
allocation. An allocation is made for work on CuPy's current stream of the
device (asked of CuPy's C API), and its free, when the last array using the
memory goes, is in stream order on that same stream, which is where CuPy's
own pool would reuse it. Out of memory raises CuPy's ``OutOfMemoryError``;
other failures raise ``streamarena.StreamarenaError`` with the reason.

docs/ECOSYSTEM.md says what maps to what and what is not supported (CuPy's
per-thread default stream, allocations during a CUDA graph capture).
"""

import contextlib
import ctypes

from streamarena import _hooks
from streamarena._library import StreamarenaError

# CuPy's C function for a device's current stream, and the signature this
# module calls it with (Cython names it in the capsule).
_STREAM_FUNCTION = "get_stream_ptr"
_STREAM_SIGNATURE = b"intptr_t (int)"

_installed = None  # the Allocator install() made current
_allocator = None  # the process's one Allocator


class Allocator:
    """The hooks as a CuPy allocator: ``malloc`` is what
    ``cupy.cuda.set_allocator`` and ``using_allocator`` take."""

    def __init__(self, hooks):
        import cupy
        from cupy.cuda import memory

        self.hooks = hooks
        self.env = _make_env(cupy, memory)
        self.c_allocator = memory.CFunctionAllocator(
            ctypes.addressof(self.env), hooks.address("sa_cupy_malloc"),
            hooks.address("sa_cupy_free"), self)
        self.malloc = self.c_allocator.malloc


def _capsule_pointer(capsule, expected):
    """The C pointer in a Cython C-API capsule whose name (the function's C
    signature) must be expected."""
    api = ctypes.PyDLL(None)  # a handle of our own: pythonapi's prototypes stay as they are
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    name = api.PyCapsule_GetName(capsule)
    if name != expected:
        raise StreamarenaError(
            f"CuPy's {_STREAM_FUNCTION} is {name!r} in this CuPy, streamarena.cupy calls "
            f"{expected!r}: a CuPy this module does not know")
    return api.PyCapsule_GetPointer(capsule, name)


def _make_env(cupy, memory):
    """The sa_py_env the hooks get as CuPy's param: CuPy's stream function
    and Python's error API, with the exception types to raise."""
    from cupy_backends.cuda import stream as backend_stream
    from cupy_backends.cuda.api import runtime

    if backend_stream.get_default_stream_ptr() == runtime.streamPerThread:
        raise StreamarenaError(
            "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1: CuPy's default stream is then another "
            "stream on each thread, which streamarena does not serve; unset it, or make "
            "each thread use a cupy.cuda.Stream of its own")
    capi = getattr(backend_stream, "__pyx_capi__", {})
    if _STREAM_FUNCTION not in capi:
        raise StreamarenaError(
            f"this CuPy ({cupy.__version__}) exports no C function {_STREAM_FUNCTION} in "
            "cupy_backends.cuda.stream: streamarena cannot learn its current stream")
    return make_env(_capsule_pointer(capi[_STREAM_FUNCTION], _STREAM_SIGNATURE),
                    memory.OutOfMemoryError)


def make_env(current_stream, oom_error):
    """An sa_py_env: current_stream, the address of a C function
    ``intptr_t (int device)``; oom_error, the class raised as
    ``oom_error(size, total)`` when memory runs out; Python's error API.
    The classes must outlive the env (a class lives as long as its module,
    which CuPy and this package keep)."""
    api = ctypes.PyDLL(None)

    def address(fn):
        return ctypes.cast(fn, ctypes.c_void_p).value

    return _hooks.Env(
        size=ctypes.sizeof(_hooks.Env),
        current_stream=current_stream,
        call_function=address(api.PyObject_CallFunction),
        set_object=address(api.PyErr_SetObject),
        set_string=address(api.PyErr_SetString),
        decref=address(api.Py_DecRef),
        oom_error=id(oom_error),
        error=id(StreamarenaError))


def allocator(conf=None, *, lib=None):
    """The process's streamarena allocator for CuPy (made at the first call):
    its ``malloc`` is what ``cupy.cuda.set_allocator`` takes. conf: the
    arenas' configuration (README's keys), None keeps $STREAMARENA_CONF."""
    global _allocator
    hooks = _hooks.get(conf, lib)
    if _allocator is None:
        _allocator = Allocator(hooks)
    return _allocator


def install(conf=None, *, lib=None, free_pool=True):
    """Make streamarena CuPy's allocator in this process (every thread that
    is not inside a ``using_allocator`` block). free_pool: give the blocks
    CuPy's default pool caches back to the driver first. Returns the
    Allocator."""
    global _installed
    import cupy

    a = allocator(conf, lib=lib)
    if free_pool:
        cupy.get_default_memory_pool().free_all_blocks()
    cupy.cuda.set_allocator(a.malloc)
    _installed = a
    return a


def uninstall():
    """Give CuPy its default pool back (memory allocated meanwhile stays
    streamarena's until freed)."""
    global _installed
    import cupy

    if _installed is not None:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
        _installed = None


def installed():
    return _installed


@contextlib.contextmanager
def using(conf=None, *, lib=None):
    """Allocate from streamarena inside the block, on this thread only
    (``cupy.cuda.using_allocator``)."""
    import cupy

    with cupy.cuda.using_allocator(allocator(conf, lib=lib).malloc):
        yield


def memory_stats(device=None):
    """The figures of a device (the current one by default): bytes CuPy
    holds now, at peak and in total (requested), physical bytes the arena
    holds now and at peak (reserved), cached bytes, counts, errors."""
    if device is None:
        import cupy

        device = cupy.cuda.runtime.getDevice()
    return _hooks.get().stats(device)


def reset_peak(device=None):
    if device is None:
        import cupy

        device = cupy.cuda.runtime.getDevice()
    _hooks.get().reset_peak(device)


def free_all_blocks():
    """Give cached memory of every arena back to the driver once the work
    that may use it completed (what CuPy's ``MemoryPool.free_all_blocks``
    does for its pool)."""
    _hooks.get().trim()


def live_blocks():
    """CuPy blocks allocated through streamarena and not freed yet."""
    return int(_hooks.get().lib.sa_cupy_live_blocks())
