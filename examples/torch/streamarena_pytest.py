"""A pytest plugin that makes streamarena's native backend PyTorch's CUDA
allocator before any test module is imported, when STREAMARENA_TORCH=1 (and
leaves PyTorch's own allocator otherwise), so that PyTorch's own test suite
(test/test_cuda.py) runs unchanged on either:

    STREAMARENA_TORCH=1 python3 -m pytest -p streamarena_pytest test_cuda.py -k ...

with examples/torch/ on PYTHONPATH. STREAMARENA_CONF configures the arenas
as usual. A failed install stops the run: a suite that fell back to the
pluggable plugin, or to PyTorch's allocator, would say nothing of the
native backend. In both runs it gives torch's testing modules the few names
a newer test_cuda.py imports that the installed torch lacks (named in the
report's header).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


# Names a newer test_cuda.py imports from torch's testing modules that the
# installed torch may lack, each with the value torch gave it where it had
# it, computed the same way under either allocator. PyTorch's own
# test_cuda.py of a given release is not always at hand (docs/TORCH.md): a
# copy from a commit near it imports what that commit's modules have.
def _torch_testing_compat():
    from torch.testing._internal import common_utils

    if not hasattr(common_utils, "TEST_CUDAMALLOCASYNC"):
        import torch

        common_utils.TEST_CUDAMALLOCASYNC = bool(
            torch.cuda.is_available()
            and torch.cuda.get_allocator_backend() == "cudaMallocAsync")
        return ["TEST_CUDAMALLOCASYNC"]
    return []


def pytest_configure(config):
    if os.environ.get("STREAMARENA_TORCH") != "1":
        config.stash_compat = _torch_testing_compat()  # noqa: B010
        return
    python_dir = os.path.join(HERE, "..", "..", "python")
    if python_dir not in sys.path:
        sys.path.insert(0, python_dir)
    import torch  # noqa: F401  (before the backend: it links torch's libraries)
    import streamarena.torch as sat

    backend = sat.install(native=True)
    config.stash_streamarena = backend  # noqa: B010  (kept for pytest_report_header)
    config.stash_compat = _torch_testing_compat()  # noqa: B010  (after the install)


def pytest_report_header(config):
    compat = getattr(config, "stash_compat", [])
    added = f"; added to torch's testing modules: {', '.join(compat)}" if compat else ""
    backend = getattr(config, "stash_streamarena", None)
    if backend is None:
        return "CUDA allocator: PyTorch's own" + added
    return (f"CUDA allocator: streamarena native ({backend.path}, built for "
            f"{backend.built_for()})" + added)
