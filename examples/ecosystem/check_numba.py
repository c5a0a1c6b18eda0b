#!/usr/bin/env python3
"""Checks, on a GPU, streamarena's Numba EMM plugin (streamarena.numba): run
with NUMBA_CUDA_MEMORY_MANAGER=streamarena.numba. The workload: threads,
each with a stream of its own, allocate arrays through the plugin, fill
them with a pattern of their own, check it with a kernel that starts late
(so the memory is still in use when the array is dropped), and drop them
at once, so that another thread's next array may reuse the memory: any
reuse the plugin orders wrongly shows up as corrupted words. Once with
allocating_on(stream) (stream-ordered frees) and once on Numba's default
path (frees held back until a synchronize). One line per check, then
`check_numba: N passed, M failed`.

    NUMBA_CUDA_MEMORY_MANAGER=streamarena.numba python3 check_numba.py [--threads 4] [--steps 300]
"""
import argparse
import os
import sys
import threading

import numpy as np

# numba-cuda 0.x compiles kernels through a NumPy function that NumPy 2.5
# removed (np.row_stack, an alias of np.vstack): on the GPU machine's
# packages every kernel compile failed with an AttributeError inside Numba,
# before any memory of ours was touched. The alias is put back for Numba's
# sake only; nothing of streamarena's uses it.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402
from numba.cuda.cudadrv.driver import CudaAPIError  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # checks.py: examples/, or beside when staged
from checks import check, expect, summary  # noqa: E402

import streamarena.numba as san  # noqa: E402
from streamarena._library import StreamarenaError  # noqa: E402


@cuda.jit
def fill(a, value):
    # Grid-stride: the launch caps its blocks, and an array may be larger.
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        a[i] = value


@cuda.jit
def check_late(a, value, sleeps, bad):
    # Each block's first thread sleeps, so the whole check runs late: the
    # array is dropped on the host while this is still queued or running.
    if cuda.threadIdx.x == 0:
        for _ in range(sleeps):
            cuda.nanosleep(1000)
    cuda.syncthreads()
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        if a[i] != value:
            cuda.atomic.add(bad, 0, 1)


def workload(threads, steps, scoped):
    """Corrupted words seen, and checks made, over all threads."""
    results = [None] * threads
    errors = []

    def run(t):
        try:
            s = cuda.stream()
            bad = cuda.to_device(np.zeros(1, dtype=np.uint64), stream=s)
            rng = np.random.default_rng(t)
            for step in range(steps):
                n = int(rng.integers(256, 2 << 20))  # 1 KiB to 8 MiB of uint32
                value = np.uint32((t + 1) << 24 | step)
                if scoped:
                    with san.allocating_on(s):
                        a = cuda.device_array(n, dtype=np.uint32, stream=s)
                else:
                    a = cuda.device_array(n, dtype=np.uint32, stream=s)
                blocks = min((n + 255) // 256, 1024)
                fill[blocks, 256, s](a, value)
                check_late[64, 256, s](a, value, 50, bad)
                del a  # still in use by check_late
            results[t] = (int(bad.copy_to_host(stream=s)[0]), steps)
            s.synchronize()
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(f"thread {t}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return sum(r[0] for r in results), sum(r[1] for r in results)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()

    def manager():
        mm = cuda.current_context().memory_manager
        expect(isinstance(mm, san.StreamarenaNumbaManager), f"the manager is {type(mm)}")
        return f"{type(mm).__name__}, NUMBA_CUDA_MEMORY_MANAGER=" \
               f"{os.environ.get('NUMBA_CUDA_MEMORY_MANAGER')}"

    check("Numba's memory manager is streamarena's", manager)

    def round_trip():
        before = san.memory_stats()["alloc_count"]
        x = np.arange(1 << 20, dtype=np.float32)
        d = cuda.to_device(x)
        expect(np.array_equal(d.copy_to_host(), x), "copied back")
        expect(san.memory_stats()["alloc_count"] > before, "counted by streamarena")
        return f"pointer {d.device_ctypes_pointer.value:#x}"

    check("cuda.to_device allocates from streamarena", round_trip)

    for scoped in (True, False):
        name = "allocating_on(stream)" if scoped else "Numba's default path (held frees)"

        def run(scoped=scoped):
            bad, n = workload(a.threads, a.steps, scoped)
            expect(bad == 0, f"{bad} corrupted words")
            return f"{n} arrays over {a.threads} threads, 0 corrupted words"

        check(f"{a.threads} threads, own streams, {name}", run)

    def oom():
        try:
            cuda.device_array(1 << 50, dtype=np.uint8)
        except CudaAPIError as e:
            expect("OUT_OF_MEMORY" in str(e.code), f"code {e.code}")
            return str(e)[:100]
        raise AssertionError("no error")

    check("1 PiB is Numba's CudaAPIError(CUDA_ERROR_OUT_OF_MEMORY)", oom)

    def ipc():
        d = cuda.device_array(1024, dtype=np.uint8)
        try:
            d.get_ipc_handle()
        except StreamarenaError as e:
            expect("shareable handle" in str(e), str(e))
            return "refused, saying why"
        raise AssertionError("an IPC handle was made")

    check("get_ipc_handle raises a clear error", ipc)

    def info():
        free, total = cuda.current_context().get_memory_info()
        expect(0 < free <= total, f"free {free} total {total}")
        return f"free {free >> 20} MiB of {total >> 20} MiB"

    check("get_memory_info", info)

    def deferred():
        s = cuda.stream()
        with san.allocating_on(s):
            d = cuda.device_array(1 << 20, dtype=np.uint8, stream=s)
        held = san.memory_stats()["requested_bytes"]
        with cuda.defer_cleanup():
            del d
            expect(san.memory_stats()["requested_bytes"] == held, "freed inside defer_cleanup")
        expect(san.memory_stats()["requested_bytes"] == held - (1 << 20), "not freed after it")
        s.synchronize()

    check("defer_cleanup holds frees until its end", deferred)
    st = san.memory_stats()
    print(f"streamarena: {st['alloc_count']} allocations, {st['errors']} failed calls, "
          f"peak reserved {st['reserved_bytes_peak'] >> 20} MiB")
    return summary("check_numba")


if __name__ == "__main__":
    sys.exit(main())
