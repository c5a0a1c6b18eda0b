"""A pytest plugin that makes streamarena's native backend PyTorch's CUDA
allocator before any test module is imported, when STREAMARENA_TORCH=1 (and
leaves PyTorch's own allocator otherwise), so that PyTorch's own test suite
(test/test_cuda.py) runs unchanged on either:

    STREAMARENA_TORCH=1 python3 -m pytest -p streamarena_pytest test_cuda.py -k ...

with examples/torch/ on PYTHONPATH. STREAMARENA_CONF configures the arenas
as usual. A failed install stops the run: a suite that fell back to the
pluggable plugin, or to PyTorch's allocator, would say nothing of the
native backend.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config):
    if os.environ.get("STREAMARENA_TORCH") != "1":
        return
    python_dir = os.path.join(HERE, "..", "..", "python")
    if python_dir not in sys.path:
        sys.path.insert(0, python_dir)
    import torch  # noqa: F401  (before the backend: it links torch's libraries)
    import streamarena.torch as sat

    backend = sat.install(native=True)
    config.stash_streamarena = backend  # noqa: B010  (kept for pytest_report_header)


def pytest_report_header(config):
    backend = getattr(config, "stash_streamarena", None)
    if backend is None:
        return "CUDA allocator: PyTorch's own"
    return f"CUDA allocator: streamarena native ({backend.path}, built for {backend.built_for()})"
