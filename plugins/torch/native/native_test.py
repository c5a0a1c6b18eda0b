#!/usr/bin/env python3
"""streamarena.torch's choice of backend and the native build command, without
PyTorch: a stand-in torch module takes the calls install() makes, the
pluggable plugin is the real one (loading it creates nothing).

    native_test.py PATH/libstreamarena_torch.so

Prints one summary line; exit status 1 on any failure.
"""
import io
import json
import os
import subprocess
import sys
import tempfile
import types
import warnings
from contextlib import redirect_stderr

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "..", "..", "python")
sys.path.insert(0, PYTHON_DIR)
import streamarena._native_build as nb  # noqa: E402
import streamarena.torch as sat  # noqa: E402

results = []


def check(name, fn):
    try:
        fn()
        results.append(True)
        print(f"[ok] {name}")
    except Exception as e:  # noqa: BLE001  (each case reports its own failure)
        results.append(False)
        print(f"[FAILED] {name}: {type(e).__name__}: {e}")


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def fake_torch(version="2.11.0+cu130", git="abc123"):
    """What install() touches of torch, recording the allocator it is given."""
    t = types.ModuleType("torch")
    t.__version__ = version
    t.version = types.SimpleNamespace(git_version=git, cuda="13.0")
    calls = []

    class Raw:
        def __getattr__(self, name):
            if name.startswith("set_"):
                return lambda address: calls.append((name, address))
            raise AttributeError(name)

    class Pluggable:
        def __init__(self, path, alloc, free):
            calls.append(("pluggable", path, alloc, free))

        def allocator(self):
            return Raw()

    memory = types.SimpleNamespace(CUDAPluggableAllocator=Pluggable,
                                   change_current_allocator=lambda a: calls.append(("change",)))
    t.cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False,
                                   memory=memory, memory_allocated=lambda: 0)
    t.calls = calls
    return t


def with_torch(t, fn):
    saved = sys.modules.get("torch")
    sys.modules["torch"] = t
    sat._installed = None
    try:
        return fn()
    finally:
        sat._installed = None
        if saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = saved


def main():
    plugin = sys.argv[1]
    os.environ["STREAMARENA_TORCH_LIB"] = plugin
    os.environ.pop("STREAMARENA_TORCH_NATIVE", None)
    tmp = tempfile.mkdtemp()

    def sidecar_rules():
        expect(nb.compatible(None, "2.11.0", "x") == (False, "no native backend is built"), "none")
        ok, why = nb.compatible({"torch_version": "2.10.0", "torch_git_version": "y"},
                                "2.11.0", "x")
        expect(not ok and "built for torch 2.10.0 (y), this is torch 2.11.0 (x)" in why, why)
        expect(nb.compatible({"torch_version": "2.11.0", "torch_git_version": "x"},
                             "2.11.0", "x") == (True, ""), "match")

    check("a build serves only the torch it names", sidecar_rules)

    def version_file():
        d = os.path.join(tmp, "wheel", "torch")
        os.makedirs(d)
        with open(os.path.join(d, "version.py"), "w") as f:
            f.write("__version__ = '2.11.0+cu130'\ngit_version = 'g'\n"
                    "cuda: Optional[str] = '13.0'\n")
        v = nb.read_torch_version(os.path.join(tmp, "wheel"))
        expect(v == {"torch_version": "2.11.0+cu130", "torch_git_version": "g",
                     "torch_cuda": "13.0"}, v)

    check("an unpacked wheel's version is read without importing it", version_file)

    def fallback_warns():
        t = fake_torch()

        def run():
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                b = sat.install()
            expect(b.kind == "pluggable", b.kind)
            texts = [str(x.message) for x in w]
            expect(len(texts) == 1, texts)
            for part in ("native backend", "cacheInfo", "reduce-overhead",
                         "torch.OutOfMemoryError", "_record_memory_history", "MemPool"):
                expect(part in texts[0], f"{part!r} not in {texts[0]!r}")
            expect(("change",) in t.calls, t.calls)
            expect(any(c[0] == "set_record_stream_fn" for c in t.calls), t.calls)

        with_torch(t, run)

    check("without a native build install() warns what the plugin cannot do", fallback_warns)

    def stale_build():
        d = os.path.join(tmp, "stale")
        os.makedirs(d)
        lib = os.path.join(d, nb.NATIVE_LIB)
        open(lib, "w").close()
        with open(os.path.join(d, nb.SIDECAR), "w") as f:
            json.dump({"torch_version": "2.10.0", "torch_git_version": "old"}, f)

        def run():
            try:
                sat.install(native=True, native_lib=lib)
            except RuntimeError as e:
                expect("built for torch 2.10.0 (old), this is torch 2.11.0+cu130 (abc123)"
                       in str(e) and "python -m streamarena.torch build" in str(e), str(e))
                return
            raise AssertionError("install(native=True) took a build for another torch")

        with_torch(fake_torch(), run)

    check("a native build for another torch is refused, saying so", stale_build)

    def quiet_when_asked():
        def run():
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                b = sat.install(native=False)
            expect(b.kind == "pluggable" and not w, [str(x.message) for x in w])

        with_torch(fake_torch(), run)

    check("install(native=False) takes the plugin without a warning", quiet_when_asked)

    def unloadable_build():
        d = os.path.join(tmp, "broken")
        os.makedirs(d)
        lib = os.path.join(d, nb.NATIVE_LIB)
        with open(lib, "w") as f:
            f.write("not a shared library")
        with open(os.path.join(d, nb.SIDECAR), "w") as f:
            json.dump({"torch_version": "2.11.0+cu130", "torch_git_version": "abc123"}, f)

        def run():
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                b = sat.install(native_lib=lib)
            expect(b.kind == "pluggable", b.kind)
            expect(any("does not load" in str(x.message) for x in w),
                   [str(x.message) for x in w])

        with_torch(fake_torch(), run)

    check("a build that does not load falls back to the plugin, saying why", unloadable_build)

    def check_mode_is_the_plugins():
        def run():
            try:
                sat.install(native=True, check=True)
            except RuntimeError as e:
                expect("check mode" in str(e), str(e))
                return
            raise AssertionError("native check mode accepted")

        with_torch(fake_torch(), run)

    check("check mode needs the plugin", check_mode_is_the_plugins)

    def build_command_errors():
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        r = subprocess.run([sys.executable, "-m", "streamarena.torch", "build", "--torch-root",
                            os.path.join(tmp, "nowhere")], capture_output=True, text=True,
                           env=env)
        expect(r.returncode == 1 and "--torch-root names the folder" in r.stderr,
               (r.returncode, r.stderr))
        r = subprocess.run([sys.executable, "-m", "streamarena.torch", "build", "--help"],
                           capture_output=True, text=True, env=env)
        expect(r.returncode == 0 and "--torch-root" in r.stdout, r.stderr)
        r = subprocess.run([sys.executable, "-m", "streamarena.torch", "frobnicate"],
                           capture_output=True, text=True, env=env)
        expect(r.returncode == 2 and "unknown command" in r.stderr, r.stderr)

    check("the build command says what is missing", build_command_errors)

    def sources_found():
        root = nb.source_root()
        srcs = nb.sources(root)
        expect(any(s.endswith("torch/allocator.cc") for s in srcs), srcs)
        expect(sum(s.endswith(".cc") for s in srcs) >= 8, srcs)
        err = io.StringIO()
        with redirect_stderr(err):
            try:
                nb.source_root(tmp)
            except nb.BuildError as e:
                expect("sources are not under" in str(e), str(e))
                return
        raise AssertionError("an empty folder passed for sources")

    check("the build finds the backend's sources in the checkout", sources_found)

    passed = sum(results)
    print(f"native_test: {passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
