#!/usr/bin/env python3
"""What the native backend gives PyTorch, on a GPU: each row runs once under
PyTorch's own caching allocator and once under streamarena's native backend,
each in a process of its own, and prints one line with both results. A row
fails where streamarena's run fails or its result differs from PyTorch's.

    python3 examples/torch/check_native.py [--rows a,b] [--jobs N] [--json PATH]
    python3 examples/torch/check_native.py --row NAME --allocator default|streamarena

Rows:
  cudnn-benchmark   a CNN, torch.backends.cudnn.benchmark on, 3 input shapes,
                    forward and backward (cacheInfo sizes cuDNN's workspace)
  compile-default   torch.compile training, 50 steps, bf16: losses as PyTorch's
  compile-graphs    torch.compile(mode="reduce-overhead") the same: CUDA graph
                    trees on the graph pools
  cuda-graph        torch.cuda.graph capture, 100 replays exact; memory
                    allocated after the capture never inside the graph's pool
  mem-pool          torch.cuda.MemPool + use_mem_pool: the pool's blocks, its
                    use count, its memory back once released
  oom               torch.empty(10**14) raises torch.OutOfMemoryError, and the
                    process allocates and computes as before
  fraction          set_per_process_memory_fraction(0.5) caps what is held
  history           _record_memory_history + _dump_snapshot: a pickle that
                    torch.cuda._memory_viz renders (segsum, trace, plots)
  summary           memory_stats, memory_summary, max_memory_allocated, reset
                    of peaks: PyTorch's own functions, no patch
  ipc               a CUDA tensor to a child process (torch.multiprocessing,
                    spawn): works, or raises saying why

The last line is `check_native: N passed, M failed`; exit status 1 on any
failure. The streamarena runs need the native backend built for this torch
(python -m streamarena.torch build), and fail where install() would fall back.
"""
import argparse
import concurrent.futures
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = ("cudnn-benchmark", "compile-default", "compile-graphs", "cuda-graph", "mem-pool", "oom",
        "fraction", "history", "summary", "ipc")
ALLOCATORS = ("default", "streamarena")
LOSS_TOLERANCE = 0.03  # relative, per step: bf16 noise between two runs of one program
CONF = ""  # the examples' configuration (allocators.py): install()'s defaults


# --- the rows, run in a process of their own ----------------------------------


def small_lm(torch):
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(4096, 256)
            self.blocks = nn.Sequential(*[nn.Sequential(nn.LayerNorm(256), nn.Linear(256, 1024),
                                                        nn.GELU(), nn.Linear(1024, 256))
                                          for _ in range(4)])
            self.head = nn.Linear(256, 4096)

        def forward(self, ids):
            return self.head(self.blocks(self.emb(ids)))

    return Net()


def train_steps(torch, mode, steps=50):
    torch.manual_seed(0)
    model = small_lm(torch).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fn = model if mode is None else torch.compile(model, mode=mode)
    g = torch.Generator(device="cpu").manual_seed(1)
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        ids = torch.randint(0, 4096, (16, 128), generator=g).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(ids)
            loss = torch.nn.functional.cross_entropy(out.float().view(-1, 4096),
                                                     ids.roll(1, 1).view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    losses = [float(x) for x in torch.stack(losses).cpu()]
    return {"losses": losses, "s": time.perf_counter() - t0,
            "detail": f"{steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}"}


def row_cudnn_benchmark(torch):
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                        nn.Conv2d(64, 128, 3, padding=1, stride=2), nn.BatchNorm2d(128), nn.ReLU(),
                        nn.Conv2d(128, 128, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(128, 10)).cuda()
    losses = []
    for shape in ((32, 3, 64, 64), (16, 3, 96, 96), (8, 3, 160, 160)):
        g = torch.Generator(device="cpu").manual_seed(shape[0])
        x = torch.randn(shape, generator=g).cuda()
        y = torch.randint(0, 10, (shape[0],), generator=g).cuda()
        for _ in range(3):
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            losses.append(float(loss))
    return {"losses": losses, "detail": f"3 shapes x 3 steps, last loss {losses[-1]:.4f}"}


def row_compile_default(torch):
    return train_steps(torch, "default")


def row_compile_graphs(torch):
    r = train_steps(torch, "reduce-overhead")
    r["detail"] += f", {r['s']:.1f} s"
    return r


def row_cuda_graph(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    static_x = torch.randn(256, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_y = model(static_x * 2.0)
    pool = g.pool()
    ranges = []
    for seg in torch.cuda.memory_snapshot():
        if tuple(seg.get("segment_pool_id", (0, 0))) == tuple(pool):
            ranges.append((seg["address"], seg["address"] + seg["total_size"]))
    if not ranges:
        raise AssertionError(f"no segment of the graph's pool {pool} in the snapshot")
    # Memory allocated after the capture: never in the graph's pool, and
    # overwriting it does not change what the graph computes.
    clutter = [torch.full((n,), float("nan"), device="cuda")
               for n in (1, 100, 4096, 1 << 16, 1 << 20, 1 << 22) for _ in range(4)]
    for t in clutter:
        a, b = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        for lo, hi in ranges:
            if a < hi and lo < b:
                raise AssertionError(f"a tensor allocated after the capture ({a:#x}) is in "
                                     f"the graph's pool [{lo:#x}, {hi:#x})")
    bad = 0
    for i in range(100):
        x = torch.randn(256, 1024, device="cuda", generator=None)
        static_x.copy_(x)
        g.replay()
        with torch.no_grad():
            ref = model(x * 2.0)
        bad += int(not torch.equal(static_y, ref))
    if bad:
        raise AssertionError(f"{bad} of 100 replays differ from eager")
    return {"detail": f"100 replays exact, pool {tuple(pool)}: {len(ranges)} segments, "
                      f"{len(clutter)} later tensors outside it"}


def row_mem_pool(torch):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.randn(1 << 20, device="cuda")
        count_inside = pool.use_count()
    y = torch.randn(1 << 20, device="cuda")
    blocks = [(seg["address"], seg["total_size"], b) for seg in pool.snapshot()
              for b in seg["blocks"]]
    addrs = set()
    for seg in pool.snapshot():
        at = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                addrs.add(at)
            at += b["size"]
    if x.data_ptr() not in addrs:
        raise AssertionError(f"the pool's snapshot lacks the block of x ({len(blocks)} blocks)")
    if y.data_ptr() in addrs:
        raise AssertionError("a tensor allocated outside use_mem_pool is in the pool")
    reserved = torch.cuda.memory_reserved()
    del x
    pool_id = pool.id
    del pool
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    return {"detail": f"use_count {count_inside} inside, pool {pool_id}, reserved "
                      f"{reserved >> 20} -> {after >> 20} MiB after release"}


def row_oom(torch):
    x = torch.ones(1024, device="cuda")
    try:
        torch.empty(10 ** 14, device="cuda")
    except torch.OutOfMemoryError as e:
        msg = str(e)
    else:
        raise AssertionError("no torch.OutOfMemoryError")
    if "Tried to allocate" not in msg:
        raise AssertionError(f"message not PyTorch's: {msg[:200]}")
    a = torch.randn(2048, 2048, device="cuda")
    z = float((a @ a).sum()) + float(x.sum())
    if not math.isfinite(z):
        raise AssertionError("compute after the OOM")
    ooms = torch.cuda.memory_stats()["num_ooms"]
    return {"detail": f"OutOfMemoryError ({msg[:60]}...), num_ooms {ooms}, computes after"}


def row_fraction(torch):
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.5, 0)
    frac = torch.cuda.get_per_process_memory_fraction(0)
    ok = torch.empty(int(total * 0.3), dtype=torch.int8, device="cuda")
    try:
        torch.empty(int(total * 0.3), dtype=torch.int8, device="cuda")
    except torch.OutOfMemoryError as e:
        msg = str(e)
    else:
        raise AssertionError("0.6 of the device under a 0.5 fraction did not fail")
    del ok
    torch.cuda.empty_cache()
    again = torch.empty(int(total * 0.3), dtype=torch.int8, device="cuda")
    del again
    return {"detail": f"fraction {frac}, 0.3 fits, 0.3 more raises ({msg[:50]}...)"}


def row_history(torch, tmp):
    torch.cuda.memory._record_memory_history(max_entries=100000)
    xs = [torch.randn(n, device="cuda") for n in (100, 1 << 18, 1 << 22)]
    y = xs[2] * 2
    del xs[1]
    path = os.path.join(tmp, "snapshot.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(None)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    from torch.cuda import _memory_viz as viz

    actions = {}
    for e in snap["device_traces"][0]:
        actions[e["action"]] = actions.get(e["action"], 0) + 1
    for need in ("alloc", "free_requested", "free_completed"):
        if need not in actions:
            raise AssertionError(f"no {need} entry: {actions}")
    frames = sum(1 for e in snap["device_traces"][0] if e.get("frames"))
    if frames == 0:
        raise AssertionError("no entry has frames")
    viz.segsum(snap)  # asserts that blocks cover their segments exactly
    viz.trace(snap)
    html = viz.trace_plot(snap) + viz.segment_plot(snap)
    del y
    return {"detail": f"{len(snap['segments'])} segments, entries {actions}, "
                      f"{frames} with frames, plots {len(html) >> 10} KiB"}


def row_summary(torch):
    x = torch.empty(1 << 24, device="cuda")
    s = torch.cuda.memory_stats()
    for k in ("allocated_bytes.all.current", "reserved_bytes.all.current",
              "requested_bytes.all.peak", "active.all.current", "num_alloc_retries"):
        if k not in s:
            raise AssertionError(f"memory_stats lacks {k}")
    if s["allocated_bytes.all.current"] < 1 << 26:
        raise AssertionError(f"allocated_bytes {s['allocated_bytes.all.current']}")
    text = torch.cuda.memory_summary()
    if "Allocated memory" not in text:
        raise AssertionError("memory_summary")
    del x
    torch.cuda.reset_peak_memory_stats()
    if torch.cuda.max_memory_allocated() != torch.cuda.memory_allocated():
        raise AssertionError("reset_peak_memory_stats")
    torch.cuda.reset_accumulated_memory_stats()
    return {"detail": f"memory_summary {len(text)} chars, reserved "
                      f"{torch.cuda.memory_reserved() >> 20} MiB"}


def _child(inbox, outbox):
    t = inbox.get()
    outbox.put(float(t.sum()))


def row_ipc(torch):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    t = torch.ones(1000, device="cuda")
    p = ctx.Process(target=_child, args=(inbox, outbox))
    p.start()
    try:
        try:
            # A CUDA tensor is pickled with its IPC handle where it is sent.
            from multiprocessing.reduction import ForkingPickler
            import io

            ForkingPickler(io.BytesIO()).dump(t)
        except RuntimeError as e:
            if "streamarena" not in str(e) or "IPC" not in str(e):
                raise
            p.terminate()
            return {"detail": f"refused, saying why ({str(e)[:70]}...)", "refused": True}
        inbox.put(t)
        got = outbox.get(timeout=60)
        if got != 1000.0:
            raise AssertionError(f"the child read {got}")
        return {"detail": "the child read the tensor"}
    finally:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()


def run_row(name, allocator, out):
    """In this process: install the allocator, run the row, write its result."""
    result = {"row": name, "allocator": allocator}
    try:
        if allocator == "streamarena":
            sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
            import torch
            import streamarena.torch as sat

            backend = sat.install(conf=os.environ.get("STREAMARENA_CONF", CONF), native=True)
            result["backend"] = backend.kind
        else:
            import torch
        with tempfile.TemporaryDirectory() as tmp:
            fn = globals()["row_" + name.replace("-", "_")]
            r = fn(torch, tmp) if name == "history" else fn(torch)
        torch.cuda.synchronize()
        if allocator == "streamarena":
            result["errors"] = sat.errors()
        result.update(r)
        result["ok"] = True
    except Exception as e:  # noqa: BLE001  (the row's failure is its result)
        result["ok"] = False
        result["detail"] = f"{type(e).__name__}: {e}"
        result["trace"] = traceback.format_exc()[-3000:]
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


# --- the driver -----------------------------------------------------------------


def spawn(name, allocator, tmp, limit):
    out = os.path.join(tmp, f"{name}.{allocator}.json")
    log = os.path.join(tmp, f"{name}.{allocator}.log")
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run([sys.executable, os.path.abspath(__file__), "--row", name,
                                 "--allocator", allocator, "--out", out],
                                stdout=f, stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    r = {"ok": False, "detail": f"no result (exit {rc}; {log})"}
    if os.path.exists(out):
        with open(out) as fh:
            r = json.load(fh)
    r["wall_s"] = time.perf_counter() - t0
    r["log"] = log
    return r


def compare(name, ref, sa):
    """Whether streamarena's run agrees with PyTorch's: (ok, why)."""
    if not sa.get("ok"):
        return False, "streamarena's run failed"
    if sa.get("backend") != "native":
        return False, f"installed {sa.get('backend')}, not the native backend"
    if sa.get("errors"):
        return False, f"{sa['errors']} failed library calls (stderr)"
    if not ref.get("ok"):
        return True, "PyTorch's run failed, streamarena's passed"
    if "losses" in ref and "losses" in sa:
        a, b = ref["losses"], sa["losses"]
        gaps = [abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a, b)]
        worst = max(gaps) if gaps else 0.0
        if len(a) != len(b) or worst > LOSS_TOLERANCE:
            return False, f"losses differ by up to {worst:.2%} (tolerance {LOSS_TOLERANCE:.0%})"
        return True, f"losses within {worst:.2%}"
    return True, ""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--jobs", type=int, default=4, help="row processes at once")
    p.add_argument("--limit", type=int, default=240, help="seconds a row process may take")
    p.add_argument("--json", help="write every result here")
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--allocator", choices=ALLOCATORS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.row:
        return run_row(a.row, a.allocator, a.out)
    rows = [r for r in a.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown} (of {', '.join(ROWS)})")
    tmp = tempfile.mkdtemp(prefix="check_native.")
    # The fraction row sizes itself by the device's memory: it runs alone.
    alone = [r for r in rows if r == "fraction"]
    together = [r for r in rows if r != "fraction"]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
        futs = {(r, al): ex.submit(spawn, r, al, tmp, a.limit) for r in together
                for al in ALLOCATORS}
        for k, f in futs.items():
            results[k] = f.result()
    for r in alone:
        for al in ALLOCATORS:
            results[(r, al)] = spawn(r, al, tmp, a.limit)
    passed = failed = 0
    report = []
    for r in rows:
        ref, sa = results[(r, "default")], results[(r, "streamarena")]
        ok, why = compare(r, ref, sa)
        passed += ok
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {r:<16} pytorch: {ref.get('detail', '')[:110]} "
              f"({ref['wall_s']:.0f} s)")
        print(f"     {'':<16} streamarena: {sa.get('detail', '')[:110]} ({sa['wall_s']:.0f} s)"
              f"{'; ' + why if why else ''}", flush=True)
        if not ok and sa.get("trace"):
            print("      " + sa["trace"].strip().replace("\n", "\n      ")[-1500:])
        report.append({"row": r, "ok": ok, "why": why, "pytorch": ref, "streamarena": sa})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"check_native: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
