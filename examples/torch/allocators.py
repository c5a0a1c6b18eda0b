"""The three allocators the PyTorch examples compare, chosen per process.

    streamarena   streamarena's plugin (python/streamarena/torch.py)
    default       PyTorch's caching allocator as shipped
    expandable    PyTorch's caching allocator with expandable_segments:True

prepare() runs before `import torch` (PyTorch reads its allocator settings
from the environment), install() after it and before any CUDA allocation.
"""
import os
import pathlib
import sys

ALLOCATORS = ("streamarena", "default", "expandable")
# The configuration the examples run streamarena with (README's keys): none
# of their own, so streamarena.torch.install()'s (TORCH_DEFAULTS: spans from
# 1 KiB up, only requests up to 1 KiB in superblocks, nothing mapped ahead;
# docs/TORCH.md).
DEFAULT_CONF = ""

_TORCH_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
_REPO = pathlib.Path(__file__).resolve().parents[2]


def prepare(name):
    """Set PyTorch's allocator environment for name; before `import torch`."""
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r} (one of {', '.join(ALLOCATORS)})")
    for var in _TORCH_ENV:
        os.environ.pop(var, None)
    if name == "expandable":
        for var in _TORCH_ENV:  # 2.11 reads both names
            os.environ[var] = "expandable_segments:True"


def install(name, conf=DEFAULT_CONF, check=False, trace=None, native=None):
    """Make name the process's CUDA allocator; before any CUDA allocation.
    Returns streamarena's backend (its native one where built for this
    torch, else the pluggable plugin; native=True/False to insist), or None
    for PyTorch's own allocators."""
    if name != "streamarena":
        return None
    python_dir = str(_REPO / "python")
    if python_dir not in sys.path:
        sys.path.insert(0, python_dir)
    import streamarena.torch

    if trace:
        conf = f"{conf},trace={trace}" if conf else f"trace={trace}"
    return streamarena.torch.install(conf=conf, check=check, native=native)


def peaks(plugin, device):
    """Peak bytes of the run so far, the same three figures for every allocator:
    reserved (what the allocator holds from the device), requested (the sum of
    the sizes PyTorch asked for, live at once) and the allocator's own idea of
    allocated (PyTorch: blocks rounded to 512 B; streamarena: blocks rounded to
    their size class)."""
    import torch

    if plugin is not None:
        s = plugin.stats(device)
        return {"reserved": s["reserved_bytes_peak"], "requested": s["requested_bytes_peak"],
                "allocated": s["live_bytes_peak"], "errors": s["errors"],
                "fast_path_ratio": s["fast_path_ratio"], "allocs": s["alloc_count"],
                "check_fills": s["check_fills"]}
    s = torch.cuda.memory_stats(device)
    return {"reserved": s["reserved_bytes.all.peak"], "requested": s["requested_bytes.all.peak"],
            "allocated": s["allocated_bytes.all.peak"], "errors": 0,
            "allocs": s["allocation.all.allocated"], "retries": s["num_alloc_retries"]}
