"""libstreamarena_python.so through ctypes: the hooks that streamarena.cupy,
streamarena.numba and streamarena.rmm share (plugins/python/
streamarena_python.h), one library per process so that they share the
default arenas. Needs neither CuPy, Numba nor RMM."""

import ctypes
import os
import threading

from streamarena import _conf, _library
from streamarena._library import StreamarenaError

LIB_NAME = "libstreamarena_python.so"
ENV_VAR = "STREAMARENA_PYTHON_LIB"
MAX_DEVICES = 64

OK, OUT_OF_MEMORY = 0, 2  # sa_status values the callers tell apart

_vp, _sz, _i32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int


class Stats(ctypes.Structure):
    """sa_hook_stats (plugins/common/hook.h), field for field."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "requested_bytes", "requested_bytes_peak", "requested_bytes_total",
        "freed_bytes_total", "alloc_count", "free_count", "record_count", "errors",
        "reserved_bytes", "reserved_bytes_peak", "live_bytes", "live_bytes_peak",
        "cached_bytes", "oom_events")] + [("fast_path_ratio", ctypes.c_double)]


class Env(ctypes.Structure):
    """sa_py_env (plugins/python/streamarena_python.h), field for field."""

    _fields_ = [("size", _sz), ("current_stream", _vp), ("call_function", _vp),
                ("set_object", _vp), ("set_string", _vp), ("decref", _vp),
                ("oom_error", _vp), ("error", _vp)]


class Hooks:
    """The library's hooks and the public API calls the package makes."""

    def __init__(self, lib=None):
        self.path = _library.find(LIB_NAME, "python", ENV_VAR, lib)
        self.lib = L = _library.load(self.path)
        for name, args, res in [
            ("sa_py_alloc", [_i32, _sz, _vp, ctypes.POINTER(_vp)], _i32),
            ("sa_py_free", [_i32, _vp, _sz, _vp], _i32),
            ("sa_py_trim", [], None),
            ("sa_py_get_stats", [_i32, ctypes.POINTER(Stats), _sz], _i32),
            ("sa_py_reset_peak", [_i32], _i32),
            ("sa_py_error_count", [], ctypes.c_uint64),
            ("sa_cupy_live_blocks", [], _sz),
            ("sa_status_string", [_i32], ctypes.c_char_p),
            ("sa_last_driver_error", [ctypes.POINTER(ctypes.c_char_p)], _i32),
        ]:
            fn = getattr(L, name)
            fn.argtypes, fn.restype = args, res

    def address(self, name):
        """The address of an exported function, as CuPy's hook takes it."""
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value

    def describe(self, status):
        """A status as text, with the driver's error where it comes from there."""
        text = self.lib.sa_status_string(status).decode()
        name = ctypes.c_char_p()
        code = self.lib.sa_last_driver_error(ctypes.byref(name))
        if code and name.value:
            text += f" (driver error {code}, {name.value.decode(errors='replace')})"
        return text

    def check(self, status, what):
        if status != OK:
            raise StreamarenaError(f"streamarena: {what}: {self.describe(status)}")

    def alloc(self, device, size, stream=0):
        """(status, pointer) of size bytes on device for work on stream."""
        p = _vp()
        st = self.lib.sa_py_alloc(device, size, stream or None, ctypes.byref(p))
        return st, (p.value or 0)

    def free(self, device, ptr, size, stream=0):
        return self.lib.sa_py_free(device, ptr, size, stream or None)

    def trim(self):
        self.lib.sa_py_trim()

    def stats(self, device=0):
        s = Stats()
        self.check(self.lib.sa_py_get_stats(device, ctypes.byref(s), ctypes.sizeof(s)),
                   f"statistics of device {device}")
        return {name: getattr(s, name) for name, _ in Stats._fields_}

    def reset_peak(self, device=0):
        self.check(self.lib.sa_py_reset_peak(device), f"reset_peak of device {device}")

    def errors(self):
        """Failed hook calls so far (each counted; the first few on stderr)."""
        return int(self.lib.sa_py_error_count())


_lock = threading.Lock()
_hooks = None  # (Hooks, the STREAMARENA_CONF it started with)


# What the hooks' arenas add to a configuration that does not name it:
# each thread keeps its last span freed on a stream for that stream's next
# request of its size (README, keep_spans), as CuPy's and Numba's arrays of
# one size come and go on one stream.
HOOKS_DEFAULTS = (("keep_spans", "keep_spans=1"),)


def with_defaults(conf):
    """conf (a STREAMARENA_CONF string) with HOOKS_DEFAULTS for the keys it
    does not name."""
    return _conf.with_defaults(conf, HOOKS_DEFAULTS)


def get(conf=None, lib=None):
    """The process's one Hooks. conf: the default arenas' configuration
    (STREAMARENA_CONF), which they read at their first allocation, so it
    must be the same for every caller of the process; HOOKS_DEFAULTS are
    added to it where it does not name them."""
    global _hooks
    with _lock:
        if conf is not None:
            conf = with_defaults(conf)
        if _hooks is None:
            os.environ["STREAMARENA_CONF"] = (
                conf if conf is not None else with_defaults(os.environ.get("STREAMARENA_CONF", "")))
            _hooks = (Hooks(lib), os.environ["STREAMARENA_CONF"])
        hooks, had = _hooks
        if conf is not None and conf != had:
            raise StreamarenaError(
                f"streamarena's arenas are configured already with STREAMARENA_CONF={had!r}; "
                f"conf={conf!r} would not apply")
        if lib is not None and _library.find(LIB_NAME, "python", ENV_VAR, lib) != hooks.path:
            raise StreamarenaError(f"{hooks.path} is loaded already, not {lib}")
        return hooks
