#!/usr/bin/env python3
"""The Python side of libstreamarena_python.so without CuPy, Numba or RMM
(CI has none): the package's ctypes layer on the host simulator, CuPy's
malloc hook called the way CuPy calls it (Python's error API and the env
the package lays out, an OutOfMemoryError stand-in), and the GPU script's
helpers (the CuPy suite comparison, the random-allocations summary) on
made-up results; every staged script parses.

    package_test.py PATH/libstreamarena_python.so

The source tree is found from this file (two folders up: the checkout, or
the test's runfiles). Prints one line per case and
`package_test: N passed, M failed`.
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile

LIB = os.path.abspath(sys.argv[1])
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ["STREAMARENA_CONF"] = "backend=host,check_stream_order=1,max_physical=64MiB"

from streamarena import _hooks  # noqa: E402
from streamarena import cupy as sacupy  # noqa: E402  (imports no CuPy)
from streamarena._library import StreamarenaError  # noqa: E402

MiB = 1 << 20
results = []


def case(fn):
    try:
        fn()
        results.append(True)
        print(f"[ok] {fn.__name__}")
    except Exception as e:  # noqa: BLE001  (each case reports its own failure)
        results.append(False)
        print(f"[FAILED] {fn.__name__}: {type(e).__name__}: {e}")
    return fn


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


# Child processes load no library of ours: a sanitizer's runtime that
# python_test.sh preloads for this one is not theirs (bash dies under it).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=CHILD_ENV)


@case
def hooks_allocate_free_and_count_on_the_simulator():
    h = _hooks.get(lib=LIB)
    before = h.stats(0)
    st, p = h.alloc(0, 3 * MiB)
    expect(st == _hooks.OK and p and p % 256 == 0, f"alloc: {st} {p:#x}")
    expect(h.stats(0)["requested_bytes"] == before["requested_bytes"] + 3 * MiB, "requested")
    expect(h.free(0, p, 3 * MiB) == _hooks.OK, "free")
    after = h.stats(0)
    expect(after["requested_bytes"] == before["requested_bytes"], "freed")
    expect(after["alloc_count"] == before["alloc_count"] + 1, "counted")
    st, p = h.alloc(64, 4096)
    expect(st != _hooks.OK and p == 0, "device 64 refused")
    expect("invalid argument" in h.describe(st), h.describe(st))
    try:
        h.check(st, "allocating on device 64")
        raise AssertionError("no StreamarenaError")
    except StreamarenaError as e:
        expect("device 64" in str(e), str(e))
    expect(h.alloc(0, 1 << 40)[0] == _hooks.OUT_OF_MEMORY, "OUT_OF_MEMORY")
    h.trim()


@case
def the_hooks_arenas_keep_spans_unless_told_otherwise():
    expect(_hooks.with_defaults("") == "keep_spans=1", _hooks.with_defaults(""))
    expect(_hooks.with_defaults("max_physical=1GiB") == "max_physical=1GiB,keep_spans=1",
           _hooks.with_defaults("max_physical=1GiB"))
    expect(_hooks.with_defaults("keep_spans=0,backend=host") == "keep_spans=0,backend=host",
           "a configuration that names it keeps its own")
    h = _hooks.get(lib=LIB)
    expect(h is not None and os.environ["STREAMARENA_CONF"].endswith(",keep_spans=1"),
           os.environ["STREAMARENA_CONF"])


@case
def one_library_and_one_configuration_per_process():
    expect(_hooks.get() is _hooks.get(lib=LIB), "the same Hooks")
    try:
        _hooks.get(conf="backend=host,superblock_size=4MiB")
        raise AssertionError("a second configuration was taken")
    except StreamarenaError as e:
        expect("configured already" in str(e), str(e))


class OutOfMemory(MemoryError):
    """CuPy's OutOfMemoryError's constructor: (size, total)."""

    def __init__(self, size, total):
        self.size, self.total = size, total
        super().__init__(f"out of memory allocating {size} bytes ({total} held)")


STREAM_FN = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int)


@case
def cupys_malloc_hook_raises_through_the_packages_env():
    # As CuPy calls it: holding the GIL (PyDLL), which also raises what the
    # hook set, here as CuPy's caller does on -1.
    lib = ctypes.PyDLL(LIB)
    lib.sa_cupy_malloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.sa_cupy_malloc.restype = ctypes.c_void_p
    lib.sa_cupy_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.sa_cupy_free.restype = None
    stream = STREAM_FN(lambda device: 0)  # the simulator's default stream
    env = sacupy.make_env(ctypes.cast(stream, ctypes.c_void_p).value, OutOfMemory)
    p = lib.sa_cupy_malloc(ctypes.addressof(env), MiB, 0)
    expect(p and p % 256 == 0, f"pointer {p}")
    lib.sa_cupy_free(ctypes.addressof(env), p, 0)
    try:
        lib.sa_cupy_malloc(ctypes.addressof(env), 1 << 40, 0)
        raise AssertionError("no exception")
    except OutOfMemory as e:
        expect(e.size == 1 << 40, f"size {e.size}")
    try:
        lib.sa_cupy_malloc(ctypes.addressof(env), 4096, 70)
        raise AssertionError("no exception")
    except StreamarenaError as e:
        expect("device 70" in str(e), str(e))
    expect(_hooks.get().lib.sa_cupy_live_blocks() == 0, "a block left")


def write_outcomes(path, outcomes):
    with open(path, "w") as f:
        for test, outcome in outcomes.items():
            f.write(json.dumps({"test": test, "outcome": outcome}) + "\n")


@case
def suite_comparison_lists_what_differs_and_fails_on_a_regression():
    script = os.path.join(ROOT, "examples", "ecosystem", "compare_suites.py")
    with tempfile.TemporaryDirectory() as d:
        pool, sa = os.path.join(d, "pool.jsonl"), os.path.join(d, "sa.jsonl")
        write_outcomes(pool, {"t::a": "passed", "t::b": "failed", "t::c": "passed"})
        write_outcomes(sa, {"t::a": "passed", "t::b": "failed", "t::c": "failed"})
        with open(sa, "a") as f:
            f.write('{"test": "t::d", "outc')  # a run stopped mid-line
        r = run(script, pool, sa)
        expect(r.returncode == 1, f"exit {r.returncode}: {r.stdout}{r.stderr}")
        expect("passed -> failed   t::c" in r.stdout, r.stdout)
        expect("suite-compare: 2 passed, 1 failed" in r.stdout, r.stdout)
        write_outcomes(sa, {"t::a": "passed", "t::b": "failed", "t::c": "passed"})
        r = run(script, pool, sa)
        expect(r.returncode == 0 and "outcome differs: 0" in r.stdout, r.stdout)


@case
def random_summary_holds_warm_runs_to_the_bound():
    script = os.path.join(ROOT, "examples", "ecosystem", "random_summary.py")

    # Every run after a process's first is warm, pooled: one slow warm run
    # (the 5.0) moves the median no further than the next value.
    def rows(via_rmm_warm):
        for backend, warm in (("streamarena", 1.0), ("rmm-streamarena", via_rmm_warm)):
            for run_, us in ((1, 9.0), (2, warm), (3, 5.0), (4, warm)):
                yield {"type": "result", "workload": "random", "case": "random-1MiB",
                       "backend": backend, "run": run_, "us_per_alloc": us, "truncated": False}

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.jsonl")
        for warm, want in ((1.4, 0), (1.6, 1)):
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows(warm))
            r = run(script, path)
            expect(r.returncode == want, f"warm ratio {warm}: exit {r.returncode}: {r.stdout}")
        r = run(script, os.path.join(d, "missing.jsonl"))
        expect(r.returncode == 1 and "no results" in r.stdout, r.stdout)


@case
def every_staged_script_parses():
    import py_compile

    with tempfile.TemporaryDirectory() as out:  # no .pyc beside the sources or in /tmp
        scripts = [os.path.join(ROOT, "examples", "checks.py")]
        for folder in (os.path.join(ROOT, "examples", "ecosystem"),
                       os.path.join(ROOT, "python", "streamarena")):
            scripts += [os.path.join(folder, n) for n in sorted(os.listdir(folder))
                        if n.endswith(".py")]
        for path in scripts:
            py_compile.compile(path, doraise=True,
                               cfile=os.path.join(out, os.path.basename(path) + "c"))
    for script in ("tools/gpu-ecosystem.sh", "plugins/rmm/build.sh"):
        r = subprocess.run(["bash", "-n", os.path.join(ROOT, script)], capture_output=True,
                           text=True, env=CHILD_ENV)
        expect(r.returncode == 0, f"{script}: {r.stderr}")


if __name__ == "__main__":
    passed = sum(results)
    print(f"package_test: {passed} passed, {len(results) - passed} failed")
    sys.exit(0 if passed == len(results) else 1)
