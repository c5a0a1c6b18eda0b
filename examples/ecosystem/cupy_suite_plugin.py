"""A pytest plugin for CuPy's own test suite, run once with CuPy's default
pool and once with streamarena (tools/gpu-ecosystem.sh):

    pytest -p cupy_suite_plugin ...      # with this folder on PYTHONPATH

STREAMARENA_CUPY=1 installs streamarena.cupy before each test that finds
another allocator current (some tests of CuPy's memory module set their
own and leave CuPy's pool behind them). ECO_OUTCOMES=FILE gets one JSON
line per test, written as each ends (a run cut short keeps what it
finished): its node id and outcome (passed, failed, error, skipped,
xfailed, xpassed). With pytest-xdist the controller writes the file, and
each process that used streamarena adds its figures to FILE.stats.
"""
import json
import os

_installed = None
_reinstalls = 0


def _want_streamarena():
    return os.environ.get("STREAMARENA_CUPY") == "1"


def pytest_runtest_setup(item):
    global _installed, _reinstalls
    if not _want_streamarena():
        return
    import cupy
    import streamarena.cupy

    if _installed is None:
        _installed = streamarena.cupy.install().malloc
    elif cupy.cuda.get_allocator() is not _installed:
        try:
            cupy.cuda.set_allocator(_installed)
            _reinstalls += 1
        except ValueError:
            pass  # inside a test's own using_allocator block: its choice


def _outcome(report):
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return "xpassed" if report.passed else "xfailed"
        return report.outcome
    if report.failed:
        return "error"
    if report.skipped:
        return "xfailed" if hasattr(report, "wasxfail") else "skipped"
    return None


_seen = {}


def pytest_runtest_logreport(report):
    path = os.environ.get("ECO_OUTCOMES")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # an xdist worker: its controller writes
    outcome = _outcome(report)
    if outcome is not None and report.nodeid not in _seen:
        _seen[report.nodeid] = outcome
    if report.when == "teardown":
        if report.failed and _seen.get(report.nodeid) == "passed":
            _seen[report.nodeid] = "error"
        with open(path, "a") as f:
            f.write(json.dumps({"test": report.nodeid,
                                "outcome": _seen.pop(report.nodeid, "passed")}) + "\n")


def pytest_sessionfinish(session):
    if not _want_streamarena() or _installed is None:
        return
    import streamarena.cupy

    s = streamarena.cupy.memory_stats()
    line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "allocations": s["alloc_count"], "errors": s["errors"],
            "reserved_peak_mib": round(s["reserved_bytes_peak"] / 2**20),
            "allocator_set_again": _reinstalls}
    path = os.environ.get("ECO_OUTCOMES")
    if path:  # each process its own line: xdist hides a worker's output
        with open(path + ".stats", "a") as f:
            f.write(json.dumps(line) + "\n")
