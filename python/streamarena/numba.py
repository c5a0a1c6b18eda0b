"""streamarena as Numba's device memory manager (an EMM plugin).

    NUMBA_CUDA_MEMORY_MANAGER=streamarena.numba python3 app.py

or, before Numba's first CUDA call::

    from numba import cuda
    import streamarena.numba
    cuda.set_memory_manager(streamarena.numba.StreamarenaNumbaManager)

Numba gives its memory manager no stream, and expects memory it allocates
to be usable on any stream and a free to be safe whatever still runs. So by
default an allocation is made on the legacy default stream, and frees are
held back and made in batches after a synchronization of the context, as
Numba's own manager holds back cuMemFree: safe on every stream, at one
synchronization per batch.

Code that says which stream its memory is for gets stream-ordered memory
instead, with no synchronization::

    with streamarena.numba.allocating_on(stream):   # a numba.cuda stream
        a = cuda.device_array(n, stream=stream)      # allocated for work on stream
    ...                                              # a's free: in order on stream

docs/ECOSYSTEM.md says what maps to what and what is not supported (IPC,
context resets).
"""

import contextlib
import ctypes
import threading
import weakref

from numba import cuda
from numba.cuda import HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer
from numba.cuda.cudadrv import driver as _driver

from streamarena import _hooks
from streamarena._library import StreamarenaError

# Frees held back on the default path before a batch is made: Numba's own
# manager holds back 10 (CUDA_DEALLOCS_COUNT) or a fifth of the device.
BATCH_COUNT = 64
BATCH_FRACTION = 0.2

_local = threading.local()  # .streams: the allocating_on stack of this thread


@contextlib.contextmanager
def allocating_on(stream):
    """Allocations of this thread inside the block are for work on stream
    (a numba.cuda stream, or a raw CUstream handle as an int), and their
    frees are in stream order on it, whenever the arrays go: only work
    enqueued on stream may use them (record-free, as cudaMallocAsync)."""
    handle = _stream_handle(stream)
    stack = getattr(_local, "streams", None)
    if stack is None:
        stack = _local.streams = []
    stack.append(handle)
    try:
        yield
    finally:
        stack.pop()


def _stream_handle(stream):
    """A CUstream handle as an int, from an int, a numba.cuda stream or any
    stream with the CUDA stream protocol (CuPy's, PyTorch's)."""
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "handle"):  # numba.cuda
        return int(stream.handle)
    if hasattr(stream, "ptr"):  # CuPy before the stream protocol
        return int(stream.ptr)
    raise TypeError(f"allocating_on: not a stream: {stream!r}")


def _device_pointer(ptr):
    """A device pointer as this numba-cuda's MemoryPointer takes it: the
    NVIDIA bindings' CUdeviceptr, or a ctypes pointer where Numba still
    binds the driver through ctypes."""
    binding = getattr(_driver, "binding", None)
    return binding.CUdeviceptr(ptr) if binding is not None else ctypes.c_void_p(ptr)


def _out_of_memory_code():
    binding = getattr(_driver, "binding", None)
    if binding is not None:
        return binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    from numba.cuda.cudadrv import enums

    return enums.CUDA_ERROR_OUT_OF_MEMORY


def _current_stream():
    stack = getattr(_local, "streams", None)
    return stack[-1] if stack else None


class StreamarenaNumbaManager(HostOnlyCUDAMemoryManager):
    """The EMM plugin: device memory from streamarena's default arena of the
    context's device; pinned and mapped host memory as Numba's own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._held = []  # (ptr, size) freed on the default path, not yet given back
        self._held_bytes = 0
        self._deferring = 0  # defer_cleanup blocks open
        self._deferred = []  # (ptr, size, stream) freed inside one
        self._hooks = None
        self._total = None  # the device's memory, for the batch size

    @property
    def interface_version(self):
        return 1

    def initialize(self):
        self._hooks = _hooks.get()
        self._total = _driver.driver.cuMemGetInfo()[1]
        super_init = getattr(super(), "initialize", None)
        if super_init is not None and not getattr(super_init, "__isabstractmethod__", False):
            super_init()

    @property
    def _device(self):
        return self.context.device.id

    def memalloc(self, size):
        """size bytes of device memory: for work on the stream of the
        innermost allocating_on block of this thread, else on any stream."""
        if self._hooks is None:
            self.initialize()
        ctx = self.context
        if size == 0:
            return MemoryPointer(ctx, _device_pointer(0), 0)
        if self._held and self._batch_due():
            self._give_back_held()
        stream = _current_stream()
        st, ptr = self._hooks.alloc(self._device, size, stream or 0)
        if st == _hooks.OUT_OF_MEMORY and stream is None and self._held:
            # As Numba's own manager does on out of memory: give back the
            # frees held back, then try once more.
            self._give_back_held()
            st, ptr = self._hooks.alloc(self._device, size, 0)
        self._raise_for(st, size)
        finalizer = self._finalizer(ptr, size, stream)
        return MemoryPointer(weakref.proxy(ctx), _device_pointer(ptr), size,
                             finalizer=finalizer)

    def _raise_for(self, st, size):
        if st == _hooks.OK:
            return
        text = self._hooks.describe(st)
        if st == _hooks.OUT_OF_MEMORY:
            # Numba's own error for it, which its callers and users catch.
            raise _driver.CudaAPIError(
                _out_of_memory_code(),
                f"streamarena: out of memory allocating {size} bytes on device "
                f"{self._device} ({text})")
        raise StreamarenaError(
            f"streamarena: allocating {size} bytes on device {self._device}: {text}")

    def _finalizer(self, ptr, size, stream):
        manager = weakref.ref(self)
        hooks, device = self._hooks, self._device

        def finalizer():
            m = manager()
            if m is None:  # the manager went with its context: free in order now
                st = hooks.free(device, ptr, size, stream or 0)
                if st != _hooks.OK:
                    _report(hooks, "free", ptr, size, st)
                return
            m._free(ptr, size, stream)

        return finalizer

    def _free(self, ptr, size, stream):
        with self._lock:
            if self._deferring:
                self._deferred.append((ptr, size, stream))
                return
            if stream is None:
                self._held.append((ptr, size))
                self._held_bytes += size
                return
        st = self._hooks.free(self._device, ptr, size, stream)
        if st != _hooks.OK:
            _report(self._hooks, "free", ptr, size, st)

    def _batch_due(self):
        return (len(self._held) >= BATCH_COUNT
                or (self._total is not None and self._held_bytes >= BATCH_FRACTION * self._total))

    def _give_back_held(self):
        """Synchronize the context, then free what the default path held
        back: no stream can still use it."""
        with self._lock:
            held, self._held, self._held_bytes = self._held, [], 0
        if not held:
            return
        self.context.synchronize()
        for ptr, size in held:
            st = self._hooks.free(self._device, ptr, size, 0)
            if st != _hooks.OK:
                _report(self._hooks, "free", ptr, size, st)

    def get_memory_info(self):
        """(free, total) of the device, counting as free what the arena
        caches (it is Numba's to allocate)."""
        free, total = _driver.driver.cuMemGetInfo()
        cached = 0
        if self._hooks is not None:
            cached = self._hooks.stats(self._device)["cached_bytes"]
        return MemoryInfo(free=free + cached, total=total)

    def get_ipc_handle(self, memory):
        raise StreamarenaError(
            "streamarena cannot share memory with another process: its physical memory is "
            "created with no shareable handle type (CU_MEM_HANDLE_TYPE_NONE), and CUDA IPC "
            "(cuIpcGetMemHandle) does not serve memory mapped through the virtual memory API; "
            "allocate what you share with Numba's default memory manager")

    def reset(self):
        """Numba resets the context (numba.cuda.close()): give back what is
        held, and the arena's cached memory."""
        super().reset()
        with self._lock:
            deferred, self._deferred = self._deferred, []
        for ptr, size, stream in deferred:
            self._free(ptr, size, stream)
        self._give_back_held()
        if self._hooks is not None:
            self._hooks.trim()

    @contextlib.contextmanager
    def defer_cleanup(self):
        """No memory is freed while the block runs (frees wait for its end),
        with Numba's own deferral of host memory."""
        with super().defer_cleanup():
            with self._lock:
                self._deferring += 1
            try:
                yield
            finally:
                with self._lock:
                    self._deferring -= 1
                    done = self._deferring == 0
                    deferred, self._deferred = (self._deferred, []) if done else ([], self._deferred)
                for ptr, size, stream in deferred:
                    self._free(ptr, size, stream)

    def stats(self):
        """The figures of this manager's device (streamarena.cupy's too:
        one arena per device)."""
        return self._hooks.stats(self._device)


def _report(hooks, what, ptr, size, st):
    import sys

    print(f"streamarena numba: {what}({ptr:#x}, {size} bytes): {hooks.describe(st)}",
          file=sys.stderr)


def memory_stats(device=None):
    """The figures of a device (the current one by default)."""
    if device is None:
        device = cuda.get_current_device().id
    return _hooks.get().stats(device)


# NUMBA_CUDA_MEMORY_MANAGER=streamarena.numba loads this name.
_numba_memory_manager = StreamarenaNumbaManager
