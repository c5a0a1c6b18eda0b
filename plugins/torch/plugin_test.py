#!/usr/bin/env python3
"""The PyTorch plugin without PyTorch: libstreamarena_torch.so loaded through
ctypes (python/streamarena/torch.py's Plugin, as install() loads it) and its
hooks called the way PyTorch calls them, on the host simulator.

    plugin_test.py PATH/libstreamarena_torch.so

Each case runs in a fresh process (the plugin's arenas and check mode are
per process). The stream-order checker is on in every case, and a case fails
on any finding it did not provoke. Prints one summary line.
"""
import ctypes
import os
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import streamarena.host as sah  # noqa: E402
import streamarena.torch as sat  # noqa: E402

SA_HOST_AUTO, SA_HOST_MANUAL = sah.AUTO, sah.MANUAL
PATTERN_A, PATTERN_B = 0x11223344, 0x55667788
MiB = 1 << 20


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def words(p, size):
    return (ctypes.c_uint32 * (size // 4)).from_address(p)


def write(p, size, value):
    ctypes.memmove(p, value.to_bytes(4, "little") * (size // 4), size // 4 * 4)


def reads(p, size, value):
    return ctypes.string_at(p, size // 4 * 4) == value.to_bytes(4, "little") * (size // 4)


def stderr_of(fn):
    """fn()'s result and what it wrote to file descriptor 2 (the plugin's
    messages)."""
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            r = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        return r, f.read().decode()


def fake_libcuda():
    """test/fake_libcuda.c built (//test:libcuda_fake.so): in the test's
    runfiles, or beside a checkout's bazel-bin."""
    for p in (os.environ.get("SA_FAKE_LIBCUDA"), os.path.join(HERE, "..", "..", "test"),
              os.path.join(HERE, "..", "..", "bazel-bin", "test")):
        if p and os.path.isdir(p):
            p = os.path.join(p, "libcuda_fake.so")
        if p and os.path.isfile(p):
            return p
    raise AssertionError("libcuda_fake.so not found (bazel build //test:libcuda_fake.so)")


def setup(check=False, checker=True):
    os.environ["STREAMARENA_CONF"] = f"backend=host,check_stream_order={int(checker)}"
    plugin = sat.Plugin(LIB)
    if check:
        plugin.set_check(True, PATTERN_B)
    return plugin, sah.Host(plugin.lib)


# ---------------------------------------------------------------------------
# Cases: each returns the number of operations it made.

def case_malloc_free_counts_requested_bytes():
    plugin, host = setup()
    s = host.stream(SA_HOST_AUTO)
    sizes = [1, 1000, 4096, 3 * MiB + 5, 64 * MiB]
    ptrs = [plugin.malloc(n, 0, s) for n in sizes]
    expect(all(p and p % 256 == 0 for p in ptrs), "aligned, non-NULL pointers")
    for p, n in zip(ptrs, sizes):
        if n >= 4:
            write(p, n - n % 4, 0xABCD0000 + n % 0xFFFF)
    for p, n in zip(ptrs, sizes):
        expect(n < 4 or reads(p, n - n % 4, 0xABCD0000 + n % 0xFFFF), "contents kept")
    st = plugin.stats(0)
    expect(st["requested_bytes"] == sum(sizes), f"requested {st['requested_bytes']}")
    expect(st["reserved_bytes"] >= sum(sizes), "reserved covers the blocks")
    expect(st["alloc_count"] == len(sizes), "alloc count")
    for p, n in zip(ptrs, sizes):
        plugin.free(p, n, 0, s)
    st = plugin.stats(0)
    expect(st["requested_bytes"] == 0 and st["requested_bytes_peak"] == sum(sizes), "peak")
    expect(st["free_count"] == len(sizes) and st["errors"] == 0, "free count, no error")
    # Cumulative bytes, what memory_summary's Tot Alloc and Tot Freed read.
    expect(st["requested_bytes_total"] == sum(sizes) and st["freed_bytes_total"] == sum(sizes),
           f"totals {st['requested_bytes_total']} / {st['freed_bytes_total']}")
    plugin.reset_peak(0)
    expect(plugin.stats(0)["requested_bytes_peak"] == 0, "reset_peak")
    before = plugin.stats(0)
    expect(plugin.malloc(0, 0, s) is None, "size 0 is NULL")
    # PyTorch never frees a NULL data pointer: counting it as an allocation
    # would leave allocation.current (alloc_count - free_count) off for good.
    after = plugin.stats(0)
    expect(after["alloc_count"] == before["alloc_count"] and after["errors"] == 0,
           f"size 0 is no allocation: alloc_count {before['alloc_count']} -> "
           f"{after['alloc_count']}")
    expect(plugin.stats(1)["alloc_count"] == 0, "an unused device reads zero")
    expect(host.counters().order_violations == 0, "no stream-order finding")
    return 2 * len(sizes)


def case_threads_allocate_on_their_streams():
    plugin, host = setup()
    ops = 2000

    def worker(out, i):
        s = host.stream(SA_HOST_AUTO)
        try:
            for k in range(ops):  # ctypes drops the GIL: the calls overlap
                n = 256 + (k * 7919 + i * 104729) % (2 * MiB)
                p = plugin.malloc(n, 0, s)
                expect(p is not None, "malloc in a thread")
                plugin.free(p, n, 0, s)
        except AssertionError as e:
            out.append(e)

    errors = []
    threads = [threading.Thread(target=worker, args=(errors, i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expect(not errors, f"threads failed: {errors}")
    st = plugin.stats(0)
    expect(st["alloc_count"] == 4 * ops and st["free_count"] == 4 * ops, "counts")
    expect(st["requested_bytes"] == 0 and plugin.errors() == 0, "balanced, no error")
    expect(host.counters().order_violations == 0, "no stream-order finding")
    return 8 * ops


def recorded_reuse(record, checker=True):
    """A block allocated on s1 is read by pending work on s2 (a batch the
    data stream made, read by the compute stream), freed on s1, and its size
    is then asked for again and written on s1 (the next batch). Returns the
    words the reader on s2 saw changed, the host, and whether the block came
    back."""
    plugin, host = setup(checker=checker)
    s1, s2 = host.stream(SA_HOST_MANUAL), host.stream(SA_HOST_MANUAL)
    n = 64 * 1024
    p = plugin.malloc(n, 0, s1)
    write(p, n, PATTERN_A)
    if record:
        plugin.record_stream(p, s2)
    seen = host.check(s2, p, n, PATTERN_A)
    plugin.free(p, n, 0, s1)
    host.step(s1)
    again = [plugin.malloc(n, 0, s1) for _ in range(64)]
    for q in again:
        host.fill(s1, q, n, PATTERN_B)
    host.step(s1)   # stops at a wait for s2, if the allocator made one
    host.step(s2)   # the reader
    host.drain_all()
    for q in again:
        plugin.free(q, n, 0, s1)
    host.drain_all()
    expect(plugin.errors() == 0, "no failed hook")
    return seen.value, host, p in again


def case_record_stream_delays_reuse():
    seen, host, reused = recorded_reuse(record=True)
    expect(seen == 0, f"the reader on s2 saw {seen} words overwritten")
    expect(host.counters().order_violations == 0, "no stream-order finding")
    return 3 + 64 * 2


def case_without_record_stream_the_reader_is_overwritten():
    """The control: the same program without record_stream, and without the
    stream-order checker (which would refuse the handout), overwrites what
    the reader reads. So the case above can fail."""
    seen, host, reused = recorded_reuse(record=False, checker=False)
    expect(reused, "the block came back at once")
    expect(seen > 0, "premature reuse went unnoticed")
    return 2 + 64 * 2


def case_empty_cache_gives_memory_back():
    plugin, host = setup()
    sizes = [512, 70000, 5 * MiB, 40 * MiB]
    ptrs = [plugin.malloc(n, 0, None) for n in sizes]
    for p, n in zip(ptrs, sizes):
        plugin.free(p, n, 0, None)
    before = plugin.stats(0)["reserved_bytes"]
    expect(before > 0, "memory stays cached after the frees")
    plugin.empty_cache()
    after = plugin.stats(0)
    expect(after["reserved_bytes"] == 0, f"reserved {after['reserved_bytes']} after empty_cache")
    expect(after["reserved_bytes_peak"] >= before, "the peak stays")
    p = plugin.malloc(MiB, 0, None)
    expect(p is not None, "allocates after empty_cache")
    plugin.free(p, MiB, 0, None)
    return 2 * len(sizes) + 3


def case_bad_calls_are_counted_not_fatal():
    plugin, host = setup()
    junk = ctypes.create_string_buffer(4096)
    plugin.free(ctypes.addressof(junk), 4096, 0, None)  # not ours
    expect(plugin.errors() == 1, "a foreign free is an error")
    expect(plugin.malloc(1 << 62, 0, None) is None, "an impossible size is NULL")
    expect(plugin.errors() == 2, "and an error")
    p = plugin.malloc(4096, 0, None)
    plugin.free(p, 4096, 0, None)
    plugin.free(p, 4096, 0, None)  # double free
    plugin.record_stream(p, None)  # of a freed block
    expect(plugin.errors() == 4, f"{plugin.errors()} errors")
    expect(plugin.stats(0)["requested_bytes"] == 0, "a refused free subtracts nothing")
    expect(plugin.malloc(4096, 99, None) is None, "a device the host backend lacks")
    try:
        plugin.set_check(True)
        raise AssertionError("check mode after the first allocation")
    except RuntimeError:
        pass
    return 8


def case_cuda_not_usable_is_refused_not_host_memory():
    """PyTorch's memory must be the GPU's. Where libcuda is there but the CUDA
    backend cannot use it (a driver that lacks cuStreamGetId, as one older
    than CUDA 12 does, which PyTorch built for CUDA 11 still runs on), backend
    auto would fall back to the host simulator and hand PyTorch CPU addresses
    that its first kernel faults on, without a word. The allocation is
    refused instead, with the reason; backend=host still asks for the
    simulator (every other case does)."""
    os.environ["FAKE_CUDA_HIDE"] = "cuStreamGetId"
    ctypes.CDLL(fake_libcuda())  # the library's dlopen("libcuda.so.1") finds it by soname
    os.environ["STREAMARENA_CONF"] = ""
    plugin = sat.Plugin(LIB)
    p, err = stderr_of(lambda: plugin.malloc(4096, 0, None))
    expect(p is None, "the host simulator's memory was handed to PyTorch as CUDA memory")
    expect(plugin.errors() == 1 and "cuStreamGetId" in err and "backend=host" in err,
           f"{plugin.errors()} errors, stderr: {err!r}")
    return 1


def case_check_mode_counts_a_refused_free_once():
    """errors() counts failed hooks: a free refused in check mode (a foreign
    pointer, a double free) is one failed hook, as it is without check mode,
    not one for the fill and one for the free."""
    plugin, host = setup(check=True)
    junk = ctypes.create_string_buffer(4096)
    plugin.free(ctypes.addressof(junk), 4096, 0, None)
    expect(plugin.errors() == 1, f"a foreign free made {plugin.errors()} errors")
    p = plugin.malloc(4096, 0, None)
    plugin.free(p, 4096, 0, None)
    plugin.free(p, 4096, 0, None)
    expect(plugin.errors() == 2, f"a foreign free and a double free made {plugin.errors()} errors")
    expect(plugin.stats(0)["check_fills"] == 1, "the one good free was filled")
    return 4


def case_record_stream_counts_on_the_block_device():
    """record_stream's hook is not told the device, and PyTorch calls it on
    whatever device is current (Tensor.record_stream sets none): a block of
    device 1 recorded while device 0 is current counts on device 1, where
    memory_stats(1) reads it, and so does a refused record."""
    os.environ["STREAMARENA_HOST_DEVICES"] = "2"
    plugin, host = setup()
    lib = plugin.lib
    lib.sa_host_set_device.argtypes = [ctypes.c_int]
    expect(lib.sa_host_set_device(1) == 0, "device 1")
    s1, s2 = host.stream(SA_HOST_AUTO), host.stream(SA_HOST_AUTO)
    expect(lib.sa_host_set_device(0) == 0, "device 0 current again")
    p = plugin.malloc(4096, 1, s1)
    expect(p is not None, "an allocation on device 1")
    plugin.record_stream(p, s2)
    plugin.free(p, 4096, 1, s1)
    plugin.record_stream(p, s2)  # of a freed block: refused
    host.drain_all()
    d0, d1 = plugin.stats(0), plugin.stats(1)
    expect(d1["record_count"] == 1 and d0["record_count"] == 0,
           f"record_count: device 0 {d0['record_count']}, device 1 {d1['record_count']}")
    expect(d1["errors"] == 1 and d0["errors"] == 0,
           f"errors: device 0 {d0['errors']}, device 1 {d1['errors']}")
    return 4


def case_stream_0_is_the_legacy_stream_of_the_hooks_device():
    """PyTorch's stream 0 of device 1 is device 1's legacy stream, and its
    hooks run with whatever device is current: a tensor's deleter frees
    where the tensor dies. The library alone refuses NULL from a thread with
    another device current (it names that device's legacy stream there);
    the hooks make their device current for the call. So a block of device
    1 freed on stream 0 with device 0 current is freed, and its memory goes
    to another stream of device 1 only behind the work PyTorch queued on
    device 1's legacy stream; device 0 is current again afterwards."""
    os.environ["STREAMARENA_HOST_DEVICES"] = "2"
    plugin, host = setup()
    os.environ["STREAMARENA_CONF"] += ",max_physical=8MiB"  # read at the first malloc
    lib = plugin.lib
    lib.sa_host_set_device.argtypes = [ctypes.c_int]
    lib.sa_host_set_default_stream_mode.argtypes = [ctypes.c_int]
    expect(lib.sa_host_set_default_stream_mode(SA_HOST_MANUAL) == 0, "default streams manual")
    n = 6 * MiB  # one fits under the cap, two do not
    expect(lib.sa_host_set_device(1) == 0, "device 1")
    s1 = host.stream(SA_HOST_MANUAL)
    p = plugin.malloc(n, 1, None)
    expect(p is not None, "an allocation on stream 0 of device 1")
    host.fill(None, p, n, PATTERN_A)  # PyTorch's kernel on device 1's stream 0
    expect(lib.sa_host_set_device(0) == 0, "device 0")
    small = plugin.malloc(4096, 1, None)  # device 0 current: the hook makes 1 current
    expect(small is not None and plugin.errors() == 0,
           f"malloc on stream 0 of device 1 with device 0 current: {plugin.errors()} errors")
    plugin.free(small, 4096, 1, None)
    plugin.free(p, n, 1, None)  # the deleter, with device 0 current
    expect(plugin.errors() == 0,
           f"free on stream 0 of device 1 with device 0 current: {plugin.errors()} errors")
    expect(lib.sa_host_get_device() == 0, "the caller's device is current again")
    q = plugin.malloc(n, 1, s1)
    expect(q == p, "the cap leaves no other memory")
    host.fill(s1, q, n, PATTERN_B)
    seen = host.check(s1, q, n, PATTERN_B)
    host.step(s1)  # as far as it goes: it waits for device 1's stream 0
    expect(host.pending(s1) > 0, "s1 is not ordered after device 1's legacy stream")
    host.drain_all()
    expect(seen.value == 0, f"{seen.value} words of the new owner overwritten")
    plugin.free(q, n, 1, s1)
    expect(lib.sa_host_set_default_stream_mode(SA_HOST_AUTO) == 0, "default streams auto")
    st = plugin.stats(1)
    expect(st["alloc_count"] == st["free_count"] == 3 and plugin.errors() == 0, f"{st}")
    expect(host.counters().order_violations == 0, "no stream-order finding")
    return 6


def case_record_stream_of_an_empty_or_foreign_tensor_is_no_error():
    """CUDAPluggableAllocator::recordStream hands the plugin ptr.get() as it
    is: NULL for an empty tensor (torch.empty(0, device="cuda") has a NULL
    data pointer), and memory PyTorch did not allocate (torch.from_dlpack of
    another library's array). PyTorch's own allocator returns at once for
    both ("Empty tensor's storage().data() might be a null ptr", "If a tensor
    is not allocated by this instance, simply skip"): neither is a failure,
    and errors() must stay 0 (train.py turns errors into findings)."""
    plugin, host = setup()
    s = host.stream(SA_HOST_AUTO)
    p = plugin.malloc(4096, 0, s)  # the arena exists: the pointers below are not its
    plugin.record_stream(None, s)
    expect(plugin.errors() == 0, f"record_stream of an empty tensor: {plugin.errors()} errors")
    junk = ctypes.create_string_buffer(4096)
    plugin.record_stream(ctypes.addressof(junk), s)
    expect(plugin.errors() == 0, f"record_stream of foreign memory: {plugin.errors()} errors")
    expect(plugin.stats(0)["record_count"] == 0, "nothing recorded")
    plugin.free(p, 4096, 0, s)
    expect(plugin.errors() == 0, "no failed hook")
    return 4


def case_check_mode_fills_after_recorded_streams():
    """Check mode: the fill waits for the freeing stream and the recorded one,
    and then the memory holds the pattern."""
    plugin, host = setup(check=True)
    s1, s2 = host.stream(SA_HOST_MANUAL), host.stream(SA_HOST_MANUAL)
    n = 4096
    p = plugin.malloc(n, 0, s1)
    write(p, n, PATTERN_A)
    plugin.record_stream(p, s2)
    seen = host.check(s2, p, n, PATTERN_A)
    plugin.free(p, n, 0, s1)
    host.step(s1)
    expect(reads(p, n, PATTERN_A), "not filled while s2 may still read it")
    host.step(s2)
    host.drain_all()
    expect(seen.value == 0, "the recorded reader saw its data")
    expect(reads(p, n, PATTERN_B), "filled once s1 and s2 are done")
    st = plugin.stats(0)
    expect(st["check_fills"] == 1 and st["errors"] == 0, "one fill, no error")
    q = plugin.malloc(n, 0, s1)  # reuse is ordered after the fill
    host.fill(s1, q, n, PATTERN_A)
    host.drain_all()
    expect(reads(q, n, PATTERN_A), "the next owner's data is not overwritten by the fill")
    plugin.free(q, n, 0, s1)
    host.drain_all()
    expect(host.counters().order_violations == 0, "no stream-order finding")
    return 6


def case_check_mode_keeps_one_record_per_stream():
    """A long-lived tensor recorded on the same stream every step (a buffer
    reused across steps; NCCL's process group with record streams on): the
    fill waits for that stream once, as the allocator's own record table
    keeps it once, and the plugin's table does not grow with every call."""
    plugin, host = setup(check=True)
    s1, s2 = host.stream(SA_HOST_MANUAL), host.stream(SA_HOST_MANUAL)
    n = 4096
    p = plugin.malloc(n, 0, s1)
    steps = 2000
    for _ in range(steps):
        plugin.record_stream(p, s2)
    fn = 12  # SA_HOST_FN_STREAM_WAIT_EVENT
    plugin.lib.sa_host_call_count.argtypes = [ctypes.c_int]
    plugin.lib.sa_host_call_count.restype = ctypes.c_uint64
    before = plugin.lib.sa_host_call_count(fn)
    plugin.free(p, n, 0, s1)
    waits = plugin.lib.sa_host_call_count(fn) - before
    host.drain_all()
    expect(plugin.errors() == 0 and plugin.stats(0)["check_fills"] == 1, "one fill, no error")
    expect(waits <= 4, f"the free made {waits} stream waits for 2 streams "
           f"({steps} record_stream calls on one stream kept {steps} records)")
    return steps + 2


def case_check_mode_catches_a_missing_record_stream():
    """Check mode finds what a program that forgot record_stream reads: the
    pattern, where PyTorch's own allocator would silently hand it stale data."""
    plugin, host = setup(check=True)
    s1, s2 = host.stream(SA_HOST_MANUAL), host.stream(SA_HOST_MANUAL)
    n = 4096
    p = plugin.malloc(n, 0, s1)
    write(p, n, PATTERN_A)
    seen = host.check(s2, p, n, PATTERN_A)  # used on s2, never recorded
    plugin.free(p, n, 0, s1)
    host.step(s1)
    host.drain_all()
    expect(seen.value > 0, "the unrecorded reader saw the fill")
    return 3


def case_torch_replay_lags_the_device():
    """bench/torch_replay.py replays a trace through the hooks with the
    simulated device behind the host: it runs, and reports the peaks."""
    lines = ["thread,stream,op,id,size,time_ns"]
    for step in range(40):  # a big buffer per step whose size changes, small ones around it
        big = (8 + (step * 7) % 13) * MiB + 4096 * step
        lines.append(f"1,(nil),alloc,0x{step:x}000000,{big},0")
        for k in range(4):
            lines.append(f"1,0x5a,alloc,0x{step:x}{k}0000,{1000 + 300 * k},0")
        for k in range(4):
            lines.append(f"1,0x5a,free,0x{step:x}{k}0000,0,0")
        lines.append(f"1,(nil),free,0x{step:x}000000,0,0")
    trace = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), f"replay{os.getpid()}.csv")
    with open(trace, "w") as f:
        f.write("\n".join(lines) + "\n")
    tool = os.path.join(HERE, "..", "..", "bench", "torch_replay.py")
    out = []
    for lag in (0, 25):
        r = subprocess.run([sys.executable, tool, LIB, trace, "--lag", str(lag),
                            "--device-bytes", "2GiB"],
                           capture_output=True, text=True)
        expect(r.returncode == 0, f"torch_replay --lag {lag}: {r.stdout}{r.stderr}")
        expect(f"lag {lag}" in r.stdout and "400 ops, 2 streams" in r.stdout and
               "0 failed allocations" in r.stdout, r.stdout)
        out.append(r.stdout.strip())
    os.remove(trace)
    return 2 * 400


def case_capturing_stream_is_refused_by_both_hooks():
    """torch.cuda.graph captures through the pluggable allocator, but a
    block allocated or freed during the capture would go to other tensors
    while the graph still replays on it: both hooks refuse, and say so."""
    plugin, host = setup()
    s = host.stream(SA_HOST_AUTO)
    before = plugin.malloc(4096, 0, s)  # the stream known before the capture
    host.begin_capture(s)
    p, err = stderr_of(lambda: plugin.malloc(4096, 0, s))
    expect(p is None, "no block during the capture")
    expect("captured into a CUDA graph" in err and "PyTorch's own allocator" in err, err)
    _, err = stderr_of(lambda: plugin.free(before, 4096, 0, s))
    expect("captured into a CUDA graph" in err, err)
    expect(host.end_capture(s) == 0, "the capture stayed intact")
    st = plugin.stats(0)
    expect(st["errors"] == 2 and st["alloc_count"] - st["free_count"] == 1,
           f"two refusals, the block still live: {st}")
    plugin.free(before, 4096, 0, s)  # after the capture: freed
    st = plugin.stats(0)
    expect(st["alloc_count"] == st["free_count"] and st["errors"] == 2, f"freed: {st}")
    expect(host.counters().order_violations == 0, "no stream-order finding")
    return 4


def case_hooks_after_default_arenas_shutdown_touch_no_freed_arena():
    """The plugin exports the whole API, so an atexit handler may call
    sa_default_arenas_shutdown while PyTorch still frees tensors at
    interpreter teardown. The plugin kept each device's arena and went on
    using it after the shutdown destroyed it: ASan found a heap-use-after-free
    in the free hook (refuse_capturing), and an allocation would have carved
    the destroyed arena. Now a free of the destroyed arena's block is refused
    and counted, and the next allocation gets a fresh default arena."""
    plugin, host = setup()
    lib = plugin.lib
    lib.sa_default_arenas_shutdown.argtypes = []
    lib.sa_default_arenas_shutdown.restype = None
    s = host.stream(SA_HOST_AUTO)
    small, big = plugin.malloc(4096, 0, s), plugin.malloc(4 * MiB, 0, s)
    expect(small is not None and big is not None, "allocations before the shutdown")
    _, err = stderr_of(lib.sa_default_arenas_shutdown)
    expect("2 blocks still allocated" in err, f"the shutdown said {err!r}")
    c = host.counters()
    expect(c.chunks == 0 and c.va_ranges == 0, "the shutdown released the arena's memory")
    # Not through stderr_of: a sanitizer's report of these calls must reach
    # the case's output.
    plugin.free(small, 4096, 0, s)
    plugin.free(big, 4 * MiB, 0, s)
    expect(plugin.errors() == 2, f"{plugin.errors()} errors for two blocks of a destroyed arena")
    st = plugin.stats(0)
    expect(st["reserved_bytes"] == 0 and st["live_bytes"] == 0, f"no arena to read: {st}")
    plugin.empty_cache()  # no arena: nothing to trim
    expect(host.counters().va_ranges == 0, "empty_cache created no arena")
    sizes = [4096, 4 * MiB]
    ptrs = [plugin.malloc(n, 0, s) for n in sizes]
    expect(all(p is not None for p in ptrs), "allocations from a fresh arena")
    for p, n in zip(ptrs, sizes):
        write(p, n, PATTERN_A)
    expect(all(reads(p, n, PATTERN_A) for p, n in zip(ptrs, sizes)), "contents kept")
    st = plugin.stats(0)
    expect(st["reserved_bytes"] >= sum(sizes) and st["live_bytes"] >= sum(sizes),
           f"the fresh arena holds them: {st}")
    for p, n in zip(ptrs, sizes):
        plugin.free(p, n, 0, s)
    expect(plugin.errors() == 2, f"the fresh arena's frees failed: {plugin.errors()} errors")
    plugin.empty_cache()
    expect(plugin.stats(0)["reserved_bytes"] == 0, "empty_cache trims the fresh arena")
    host.drain_all()
    expect(host.counters().order_violations == 0, "no stream-order finding")
    return 10


def case_install_configures_spans_from_1_kib_unless_told():
    """install() gives the arenas large_threshold=1KiB and exact_growth=1
    where the user's configuration does not name them: a request above
    1 KiB takes a span,
    whose live bytes are the bytes requested (a small block would count its
    size class's)."""
    expect(sat.torch_conf("") == "large_threshold=1KiB,exact_growth=1", sat.torch_conf(""))
    expect(sat.torch_conf("max_physical=1GiB") ==
           "max_physical=1GiB,large_threshold=1KiB,exact_growth=1",
           sat.torch_conf("max_physical=1GiB"))
    expect(sat.torch_conf("large_threshold=64KiB,backend=host,exact_growth=0") ==
           "large_threshold=64KiB,backend=host,exact_growth=0",
           "a configuration that names them keeps its own")
    os.environ["STREAMARENA_CONF"] = "backend=host,check_stream_order=1"
    expect(sat.torch_conf(None) ==
           "backend=host,check_stream_order=1,large_threshold=1KiB,exact_growth=1",
           "None reads $STREAMARENA_CONF")
    os.environ["STREAMARENA_CONF"] = sat.torch_conf(None)
    plugin = sat.Plugin(LIB)
    host = sah.Host(plugin.lib)
    s = host.stream(SA_HOST_AUTO)
    sizes = [1100, 5000, 300]
    ptrs = []
    for n in sizes:
        ptrs.append(plugin.malloc(n, 0, s))
        expect(ptrs[-1], f"{n} bytes allocated")
    live = plugin.stats(0)["live_bytes"]
    expect(live > sum(sizes) and live - 1100 - 5000 <= 512,
           f"spans for 1100 and 5000 bytes, a block for 300: {live} live bytes")
    for p, n in zip(ptrs, sizes):
        plugin.free(p, n, 0, s)
    expect(plugin.stats(0)["errors"] == 0, "no error")
    host.drain_all()
    expect(host.counters().order_violations == 0, "no stream-order finding")
    return 2 * len(sizes)


def case_install_prefers_the_plain_build_to_bazel_bin():
    """A checkout after `bazel build //:streamarena_torch` and then a
    sanitizer test run: bazel-bin is the sanitizer's tree, whose plugin
    python3 cannot load; find_library takes the plain build's."""
    import shutil
    with tempfile.TemporaryDirectory() as root:
        shutil.copytree(os.path.join(HERE, "..", "..", "python", "streamarena"),
                        os.path.join(root, "python", "streamarena"))
        paths = {}
        for tree in ("bazel-out/k8-opt/bin", "bazel-out/k8-optasan/bin", "bazel-bin"):
            d = os.path.join(root, tree, "plugins", "torch")
            os.makedirs(d)
            paths[tree] = os.path.join(d, sat.LIB_NAME)
            open(paths[tree], "w").close()
        code = "import streamarena.torch as t; print(t.find_library())"
        env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"))
        env.pop("STREAMARENA_TORCH_LIB", None)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True)
        got = r.stdout.strip()
        expect(got == os.path.realpath(paths["bazel-out/k8-opt/bin"]),
               f"find_library: {got!r} {r.stderr}")
        os.remove(paths["bazel-out/k8-opt/bin"])
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True)
        got = r.stdout.strip()
        expect(got == os.path.realpath(paths["bazel-bin"]), f"then bazel-bin: {got!r}")
    return 0


CASES = {name[len("case_"):]: fn for name, fn in sorted(globals().items())
         if name.startswith("case_")}


def main():
    global LIB
    if len(sys.argv) == 3:  # one case, in this process
        LIB = os.path.abspath(sys.argv[1])
        print(CASES[sys.argv[2]]())
        return 0
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    failed, ops = 0, 0
    for name in CASES:
        r = subprocess.run([sys.executable, __file__, sys.argv[1], name], capture_output=True,
                           text=True)
        ok = r.returncode == 0
        failed += not ok
        if ok:
            ops += int(r.stdout.strip().splitlines()[-1])
        print(f"[{'ok' if ok else 'FAILED'}] {name}")
        if not ok:
            sys.stdout.write(r.stdout + r.stderr)
    print(f"plugin_test: {len(CASES)} cases, {ops} hook calls, {failed} failed")
    return 1 if failed else 0


LIB = None
if __name__ == "__main__":
    sys.exit(main())
