"""Finding and loading streamarena's shared libraries, for the package's
modules: libstreamarena_torch.so (streamarena.torch) and
libstreamarena_python.so (streamarena.cupy, .numba, .rmm)."""

import ctypes
import os
import pathlib


class StreamarenaError(RuntimeError):
    """A streamarena call failed for a reason other than a lack of memory
    (which each library reports as its own out-of-memory error)."""


def find(name, plugin, env_var, lib=None):
    """The path of library `name` built from plugins/<plugin>: lib, $env_var,
    beside this package, or the checkout's Bazel output: first the tree a
    plain build writes (bazel-out/<cpu>-opt), then bazel-bin, which follows
    the last command (after `bazel test --config=asan` its library needs the
    ASan runtime preloaded, and python3 dies loading it)."""
    here = pathlib.Path(__file__).resolve().parent
    checkout = here.parent.parent
    built = sorted(checkout.glob(f"bazel-out/*-opt/bin/plugins/{plugin}/{name}"))
    candidates = [lib, os.environ.get(env_var), here / name, *built,
                  checkout / "bazel-bin" / "plugins" / plugin / name]
    tried = []
    for c in candidates:
        if not c:
            continue
        if pathlib.Path(c).is_file():
            return str(pathlib.Path(c).resolve())
        tried.append(str(c))
    raise FileNotFoundError(
        f"{name} not found (tried: {', '.join(tried)}); build it with "
        f"`bazel build //plugins/{plugin}:{name}`, or pass lib= or set {env_var}")


def load(path):
    """ctypes.CDLL(path), with a hint where glibc's static TLS is the cause."""
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        hint = ""
        if "static TLS" in str(e):
            hint = (" (glibc's static TLS surplus is used up by libraries loaded before it: "
                    "load it first, or set GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096)")
        raise OSError(f"cannot load {path}: {e}{hint}") from e
