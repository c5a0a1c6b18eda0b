"""Building streamarena's native PyTorch backend against the torch at hand.

    python -m streamarena.torch build [--out DIR] [--torch-root DIR] ...

The backend (plugins/torch/native/) subclasses PyTorch's C++ allocator
interface, whose layout changes between torch versions, so it is compiled
against the torch that will load it: the headers and libraries of the
importable torch, or of an unpacked wheel (--torch-root, for CI). It links
the C library as libstreamarena_torch.so (``bazel build
//:streamarena_torch``), the pluggable plugin, which exports the public API.

Writes libstreamarena_torch_native.so and, beside it,
libstreamarena_torch_native.json: the torch it was built for, which
streamarena.torch.install() compares with the running one before loading
it. Needs a C++17 compiler (g++ by default, $CXX) and the CUDA runtime's
headers (--cuda-home, $CUDA_HOME, /usr/local/cuda, or the nvidia wheels torch
depends on). Nothing here imports torch when --torch-root is given.
"""

import argparse
import concurrent.futures
import datetime
import glob
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

from streamarena import _library

NATIVE_LIB = "libstreamarena_torch_native.so"
SIDECAR = "libstreamarena_torch_native.json"
PLUGIN_LIB = "libstreamarena_torch.so"
# The torch versions the native backend has been run against on a GPU
# (docs/TORCH.md); others build and are loaded, with a note.
TESTED_TORCH = ("2.11.0",)


class BuildError(RuntimeError):
    """The native backend could not be built; the message says what is missing."""


def source_root(root=None):
    """The checkout (or staged copy of one) holding the backend's sources."""
    here = pathlib.Path(__file__).resolve().parent
    r = pathlib.Path(root) if root else here.parent.parent
    need = ["plugins/torch/native/torch/allocator.cc", "plugins/torch/native/core/backend.h",
            "include/streamarena/streamarena.h", "src/small/size_class.h",
            "plugins/torch/streamarena_torch.h"]
    missing = [n for n in need if not (r / n).is_file()]
    if missing:
        raise BuildError(f"the native backend's sources are not under {r} (missing "
                         f"{', '.join(missing)}): build from a checkout of streamarena, or pass "
                         "--source-root")
    return r


def sources(root):
    return sorted(glob.glob(str(root / "plugins/torch/native/core/*.cc"))) + \
        [str(root / "plugins/torch/native/torch/allocator.cc")]


def read_torch_version(torch_root):
    """__version__, git_version and cuda of torch/version.py under torch_root."""
    text = (pathlib.Path(torch_root) / "torch" / "version.py").read_text()

    def field(name):
        m = re.search(rf"^{name}\s*(?::[^=]*)?=\s*'([^']*)'", text, re.M)
        return m.group(1) if m else None

    return {"torch_version": field("__version__"), "torch_git_version": field("git_version"),
            "torch_cuda": field("cuda")}


def torch_facts(torch_root=None, cxx11_abi=None):
    """Where the torch to build against keeps its headers and libraries, and
    which it is: an unpacked wheel's folder, or the importable torch."""
    if torch_root:
        root = pathlib.Path(torch_root)
        if not (root / "torch" / "include" / "c10").is_dir():
            raise BuildError(f"{root}/torch/include/c10 not found: --torch-root names the folder "
                             "holding torch/ as its wheel unpacks it")
        facts = read_torch_version(root)
        facts["cxx11_abi"] = 1 if cxx11_abi is None else int(cxx11_abi)
        facts["dir"] = root / "torch"
        facts["site"] = root
        return facts
    try:
        import torch
    except ImportError as e:
        raise BuildError(f"torch is not importable ({e}); pass --torch-root DIR") from e
    d = pathlib.Path(torch.__file__).resolve().parent
    return {"torch_version": torch.__version__, "torch_git_version": torch.version.git_version,
            "torch_cuda": torch.version.cuda,
            "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI) if cxx11_abi is None
            else int(cxx11_abi), "dir": d, "site": d.parent}


def cuda_facts(cuda_home, site):
    """The CUDA runtime's include folder and the folder of a libcudart to link."""
    cands = [cuda_home, os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    cands += [str(p) for p in sorted(pathlib.Path(site).glob("nvidia/cu*"))]
    cands += [str(pathlib.Path(site) / "nvidia" / "cuda_runtime")]
    for c in cands:
        if not c:
            continue
        inc = pathlib.Path(c) / "include"
        if not (inc / "cuda_runtime_api.h").is_file():
            continue
        for libdir in ("lib64", "lib", "targets/x86_64-linux/lib"):
            libs = sorted((pathlib.Path(c) / libdir).glob("libcudart.so*"))
            if libs:
                return inc, libs[0]
        return inc, None
    raise BuildError("the CUDA runtime's headers (cuda_runtime_api.h) were not found: pass "
                     "--cuda-home (a CUDA toolkit, or an nvidia-cuda-runtime wheel's folder)")


def default_out(facts):
    """Beside the package where it may write, else a cache folder per torch."""
    here = pathlib.Path(__file__).resolve().parent
    if os.access(here, os.W_OK):
        return here
    return cache_dir(facts["torch_version"])


def cache_dir(torch_version):
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "streamarena" / f"torch-{torch_version}"


def build(out=None, torch_root=None, plugin=None, cuda_home=None, cxx=None, jobs=None,
          source=None, link=True, werror=False, cxx11_abi=None, quiet=False):
    """Compiles (and links, unless link is False) the native backend. Returns
    the path of the library written (or of the build folder with link=False)."""
    t0 = time.monotonic()
    root = source_root(source)
    facts = torch_facts(torch_root, cxx11_abi)
    cuda_inc, cudart = cuda_facts(cuda_home, facts["site"])
    cxx = cxx or os.environ.get("CXX") or "g++"
    out = pathlib.Path(out) if out else default_out(facts)
    work = out / "build-native"
    work.mkdir(parents=True, exist_ok=True)
    tdir = facts["dir"]
    built_for = f"{facts['torch_version']} ({facts['torch_git_version']})"
    flags = [cxx, "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-D_GNU_SOURCE",
             f"-D_GLIBCXX_USE_CXX11_ABI={facts['cxx11_abi']}",
             f"-DSA_TORCH_BUILT_FOR=\"{built_for}\"",
             "-Wall", "-Wextra", "-Wno-unused-parameter",
             f"-I{root}", f"-I{root / 'include'}", f"-I{root / 'src'}",
             "-isystem", str(tdir / "include"),
             "-isystem", str(tdir / "include" / "torch" / "csrc" / "api" / "include"),
             "-isystem", str(cuda_inc)]
    if werror:
        flags.append("-Werror")

    def compile_one(src):
        obj = work / (pathlib.Path(src).stem + ".o")
        cmd = flags + ["-c", src, "-o", str(obj)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"compiling {src} failed:\n{shlex.join(cmd)}\n{r.stderr[-6000:]}")
        return obj

    srcs = sources(root)
    with concurrent.futures.ThreadPoolExecutor(jobs or min(len(srcs), os.cpu_count() or 1)) as ex:
        objs = list(ex.map(compile_one, srcs))
    if not quiet:
        print(f"compiled {len(objs)} files against torch {built_for} "
              f"in {time.monotonic() - t0:.1f} s", flush=True)
    if not link:
        return work

    plugin_path = pathlib.Path(plugin) if plugin else pathlib.Path(
        _library.find(PLUGIN_LIB, "torch", "STREAMARENA_TORCH_LIB"))
    if cudart is None:
        raise BuildError(f"no libcudart.so beside {cuda_inc}: pass --cuda-home with lib64/")
    lib = out / NATIVE_LIB
    tmp = out / (NATIVE_LIB + ".tmp")
    tlib = tdir / "lib"
    cmd = [cxx, "-shared", "-o", str(tmp), *map(str, objs),
           f"-L{tlib}", "-lc10", "-lc10_cuda", "-ltorch_cuda",
           f"-L{cudart.parent}", f"-l:{cudart.name}",
           f"-L{plugin_path.parent}", f"-l:{plugin_path.name}",
           # The libraries the process has loaded already are found by name;
           # these are for a load outside Python.
           f"-Wl,-rpath,$ORIGIN:{tlib}:{plugin_path.parent}",
           "-Wl,-z,defs"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"linking failed:\n{shlex.join(cmd)}\n{r.stderr[-6000:]}")
    os.replace(tmp, lib)
    compiler = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    sidecar = {k: facts[k] for k in ("torch_version", "torch_git_version", "torch_cuda",
                                     "cxx11_abi")}
    sidecar.update({"plugin": str(plugin_path), "compiler": compiler.splitlines()[0] if compiler
                    else cxx, "built": datetime.datetime.now(datetime.timezone.utc)
                    .strftime("%Y-%m-%dT%H:%M:%SZ"), "sources": str(root)})
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=1) + "\n")
    if not quiet:
        print(f"wrote {lib} for torch {built_for} in {time.monotonic() - t0:.1f} s", flush=True)
    return lib


def compatible(sidecar, torch_version, torch_git_version):
    """Whether a build's sidecar names the running torch; (ok, reason)."""
    if sidecar is None:
        return False, "no native backend is built"
    built = sidecar.get("torch_version"), sidecar.get("torch_git_version")
    if built != (torch_version, torch_git_version):
        return False, (f"the native backend was built for torch {built[0]} ({built[1]}), this is "
                       f"torch {torch_version} ({torch_git_version})")
    return True, ""


def find_native(lib=None, torch_version=None):
    """The native library to load: lib, $STREAMARENA_TORCH_NATIVE, beside the
    package, or the cache folder of torch_version; with its sidecar (None if
    missing). (None, None) where there is none."""
    here = pathlib.Path(__file__).resolve().parent
    cands = [lib, os.environ.get("STREAMARENA_TORCH_NATIVE"), here / NATIVE_LIB]
    if torch_version:
        cands.append(cache_dir(torch_version) / NATIVE_LIB)
    for c in cands:
        if c and pathlib.Path(c).is_file():
            p = pathlib.Path(c).resolve()
            side = p.parent / SIDECAR
            try:
                meta = json.loads(side.read_text())
            except (OSError, ValueError):
                meta = None
            return str(p), meta
    return None, None


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m streamarena.torch build",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="folder for the library (default: beside the package if "
                   "writable, else ~/.cache/streamarena/torch-VERSION)")
    p.add_argument("--torch-root", help="a folder holding torch/ as its wheel unpacks it "
                   "(default: the importable torch)")
    p.add_argument("--plugin", help=f"the {PLUGIN_LIB} to link (default: found as "
                   "streamarena.torch finds it)")
    p.add_argument("--cuda-home", help="CUDA toolkit or nvidia-cuda-runtime folder")
    p.add_argument("--cxx", help="C++ compiler (default: $CXX, else g++)")
    p.add_argument("--jobs", type=int, help="compilers at once (default: the CPUs)")
    p.add_argument("--source-root", help="the streamarena checkout (default: this package's)")
    p.add_argument("--cxx11-abi", type=int, choices=(0, 1),
                   help="torch's _GLIBCXX_USE_CXX11_ABI (with --torch-root; default 1)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile without linking (a header check)")
    p.add_argument("--werror", action="store_true", help="warnings fail the build")
    a = p.parse_args(argv)
    try:
        build(out=a.out, torch_root=a.torch_root, plugin=a.plugin, cuda_home=a.cuda_home,
              cxx=a.cxx, jobs=a.jobs, source=a.source_root, link=not a.compile_only,
              werror=a.werror, cxx11_abi=a.cxx11_abi)
    except (BuildError, FileNotFoundError) as e:
        print(f"streamarena native build: {e}", file=sys.stderr)
        return 1
    return 0
