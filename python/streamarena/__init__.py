"""streamarena from Python.

streamarena is a stream-ordered GPU memory allocator written in C. This
package loads its PyTorch plugin, libstreamarena_torch.so:

    import streamarena.torch
    streamarena.torch.install(conf="superblock_size=4MiB")   # before any CUDA allocation

``streamarena.torch`` imports PyTorch only inside ``install``; its ``Plugin``
class drives the plugin through ctypes without PyTorch (the CPU test does).
"""
