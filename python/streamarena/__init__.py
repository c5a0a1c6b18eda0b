"""streamarena from Python.

streamarena is a stream-ordered GPU memory allocator written in C. This
package installs it as the allocator of PyTorch, CuPy, Numba and RMM:

    import streamarena.torch
    streamarena.torch.install(conf="superblock_size=4MiB")   # before any CUDA allocation

    import streamarena.cupy
    streamarena.cupy.install()                                 # CuPy's C allocator hook

    NUMBA_CUDA_MEMORY_MANAGER=streamarena.numba                # Numba's EMM plugin

    import rmm, streamarena.rmm
    rmm.mr.set_current_device_resource(streamarena.rmm.resource())

``streamarena.torch`` installs the native backend built for the torch at
hand (``python -m streamarena.torch build``) or, without one,
libstreamarena_torch.so as a pluggable allocator (docs/TORCH.md); the others
share libstreamarena_python.so (docs/ECOSYSTEM.md). Each imports its
framework only where it is used; the classes that drive the libraries
through ctypes need none (the CPU tests use them).
"""

from streamarena._library import StreamarenaError  # noqa: F401
