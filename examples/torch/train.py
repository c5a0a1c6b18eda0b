#!/usr/bin/env python3
"""Trains a small transformer language model (bf16 autocast) with PyTorch on
one of three allocators, and reports step time and peak memory.

    python3 examples/torch/train.py --allocator streamarena|default|expandable

The sequence length changes every step (so do the sizes of most tensors).
Data threads, each on its own CUDA stream, make the batches ahead of time:
they copy the tokens to the GPU and derive inputs and targets there; the
training thread makes its stream wait for a batch's event and calls
record_stream on its tensors, so that their memory, freed on the data
stream, is not reused while the training stream still reads it.

--check looks for memory reused too early: with streamarena every free first
fills the memory with a NaN pattern (behind every stream that may still use
it), and with every allocator the training stream sums each batch after the
backward pass and compares with the sums made on the CPU; a NaN loss, a
wrong sum or a failed allocator call is a finding, and the exit status 1.

The last lines are a table and `RESULT {json}` (examples/torch/compare.py
reads it). --device cpu is a dry run of the loop without a GPU (one data
thread, no streams; the allocator is not used).
"""
import argparse
import contextlib
import json
import math
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocators  # noqa: E402  (no torch import: it must follow prepare())

GiB = float(1 << 30)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocator", choices=allocators.ALLOCATORS, default="streamarena")
    p.add_argument("--conf", default=None,
                   help="streamarena configuration (default: $STREAMARENA_CONF, else "
                   f"{allocators.DEFAULT_CONF or 'the defaults'})")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=None,
                   help="steps left out of the step time (default: min(20, steps / 5))")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--min-seq", type=int, default=256)
    p.add_argument("--max-seq", type=int, default=2048)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--data-threads", type=int, default=2,
                   help="threads making batches, each on its own stream")
    p.add_argument("--prefetch", type=int, default=3, help="batches made ahead")
    p.add_argument("--log-every", type=int, default=10,
                   help="steps between reading the loss back (a synchronization)")
    p.add_argument("--check", action="store_true", help="look for premature reuse")
    p.add_argument("--memory-history", metavar="PICKLE",
                   help="default/expandable: save PyTorch's memory history snapshot "
                   "(tools/torch_trace.py turns it into a trace //bench:replay reads)")
    p.add_argument("--snapshot", metavar="PICKLE",
                   help="save torch.cuda.memory._snapshot() (segments and blocks) as it was "
                   "at the end of the step with the most memory reserved")
    p.add_argument("--trace", metavar="CSV",
                   help="streamarena: write the arena's own allocation trace (docs/TRACE.md)")
    p.add_argument("--model", choices=("lm", "cnn"), default="lm",
                   help="lm: the transformer; cnn: causal 1-D convolutions with "
                   "torch.backends.cudnn.benchmark on, on three sequence lengths")
    p.add_argument("--compile", choices=("none", "default", "reduce-overhead"), default="none",
                   help="torch.compile the model (reduce-overhead: CUDA graphs on the "
                   "allocator's graph pools; fixed shapes, e.g. --min-seq = --max-seq or "
                   "--model cnn, keep the graphs few)")
    p.add_argument("--device", default="0", help="CUDA device ordinal, or cpu for a dry run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    args = p.parse_args(argv)
    if args.memory_history and args.allocator == "streamarena":
        p.error("--memory-history needs PyTorch's allocator (PyTorch records it); "
                "with streamarena use --trace")
    if args.trace and args.allocator != "streamarena":
        p.error("--trace is streamarena's own trace; with PyTorch's allocator use "
                "--memory-history")
    if args.warmup is None:
        args.warmup = min(20, args.steps // 5)
    if args.conf is None:
        args.conf = os.environ.get("STREAMARENA_CONF", allocators.DEFAULT_CONF)
    return args


class Batch:
    def __init__(self, step, inputs, targets, event, sums):
        self.step, self.inputs, self.targets, self.event, self.sums = (step, inputs, targets,
                                                                       event, sums)


class Prefetcher:
    """Data threads: thread k makes the batches of steps k, k + n, k + 2n, ...
    (n threads), at most `depth` steps ahead of the training thread. On a GPU
    each thread has its own stream: it copies the pinned tokens there and
    slices inputs and targets there, and records an event."""

    def __init__(self, args, device, cuda):
        self.args, self.device, self.cuda = args, device, cuda
        self.cv = threading.Condition()
        self.ready = {}
        self.consumed = 0
        self.error = None
        self.stop = False
        n = args.data_threads if cuda else 1
        self.threads = [threading.Thread(target=self._run, args=(k, n), daemon=True,
                                         name=f"data{k}") for k in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, k, n):
        import torch
        from model import bucket, make_batch, seq_len

        a = self.args
        try:
            stream = None
            if self.cuda:
                torch.cuda.set_device(self.device)  # the current device is per thread
                stream = torch.cuda.Stream(self.device)
            for step in range(k, a.steps, n):
                with self.cv:
                    self.cv.wait_for(lambda: self.stop or step < self.consumed + a.prefetch)
                    if self.stop:
                        return
                seq = seq_len(a.seed, step, a.min_seq, a.max_seq)
                if getattr(a, "model", "lm") == "cnn":
                    seq = bucket(seq, a.min_seq, a.max_seq)
                cpu = make_batch(a.seed, step, getattr(a, "rank", 0), a.batch, seq, a.vocab)
                sums = (int(cpu[:, :-1].sum()), int(cpu[:, 1:].sum()))
                event = None
                if self.cuda:
                    cpu = cpu.pin_memory()
                    with torch.cuda.stream(stream):
                        tokens = cpu.to(self.device, non_blocking=True)
                        inputs = tokens[:, :-1].contiguous()
                        targets = tokens[:, 1:].contiguous()
                        del tokens  # freed on this stream, reused on it in order
                        event = torch.cuda.Event()
                        event.record(stream)
                else:
                    inputs, targets = cpu[:, :-1].contiguous(), cpu[:, 1:].contiguous()
                with self.cv:
                    self.ready[step] = Batch(step, inputs, targets, event, sums)
                    self.cv.notify_all()
                del inputs, targets, cpu
        except BaseException as e:  # noqa: BLE001  (reported by get())
            with self.cv:
                self.error = e
                self.cv.notify_all()

    def get(self, step):
        with self.cv:
            self.cv.wait_for(lambda: step in self.ready or self.error is not None)
            if self.error is not None:
                raise RuntimeError(f"data thread failed: {self.error!r}") from self.error
            self.consumed = step + 1
            self.cv.notify_all()
            return self.ready.pop(step)

    def close(self):
        with self.cv:
            self.stop = True
            self.cv.notify_all()
        for t in self.threads:
            t.join()


def progress_bar(args):
    if args.no_progress:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=args.steps, desc=args.allocator, unit="step", dynamic_ncols=True,
                mininterval=1.0, file=sys.stderr)


def loop(args, model, device, show_progress=True):
    """The training loop over args.steps batches from the data threads:
    model is the module to call (a DistributedDataParallel wrapper works
    too). Returns the result dict without memory figures."""
    import torch
    import torch.nn.functional as F

    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, fused=cuda)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    main_stream = torch.cuda.current_stream(device) if cuda else None
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    pending_losses, pending_sums = [], []
    losses, findings, windows = [], [], []
    bar = progress_bar(args) if show_progress else None

    def flush(step):
        """Read back the losses and sums queued since the last flush (a sync)."""
        if pending_losses:
            vals = torch.stack(pending_losses).float().cpu().tolist()
            for i, v in enumerate(vals):
                if not math.isfinite(v):
                    findings.append(f"step {step - len(vals) + 1 + i}: loss {v}")
            losses.extend(vals)
            pending_losses.clear()
        for s, got, want in pending_sums:
            got = tuple(got.cpu().tolist())
            if got != want:
                findings.append(f"step {s}: batch sums {got} on the training stream, "
                                f"{want} made on the CPU")
        pending_sums.clear()

    pf = Prefetcher(args, device, cuda)
    peak = PeakSnapshot(args.snapshot, device) if cuda and args.snapshot else None
    t_start = t_measured = t_window = None
    w_start = 0
    try:
        for step in range(args.steps):
            if step == args.warmup:
                flush(step - 1)
                if cuda:
                    torch.cuda.synchronize(device)
                t_measured = t_window = time.perf_counter()
                w_start = step
            if step == 0:
                t_start = time.perf_counter()
            b = pf.get(step)
            if cuda:
                main_stream.wait_event(b.event)
                b.inputs.record_stream(main_stream)
                b.targets.record_stream(main_stream)
            ids, tgt = b.inputs, b.targets
            if args.check:  # ids poisoned by a premature reuse must not crash the kernels
                ids, tgt = ids.remainder(args.vocab), tgt.remainder(args.vocab)
            with autocast:
                logits = model(ids)
                loss = F.cross_entropy(logits.view(-1, args.vocab), tgt.view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            pending_losses.append(loss.detach())
            if args.check:
                pending_sums.append((step, torch.stack([b.inputs.sum(), b.targets.sum()]),
                                     b.sums))
            del b, ids, tgt, logits, loss
            if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
                flush(step)
                if t_measured is not None:
                    now = time.perf_counter()
                    windows.append((now - t_window) / (step + 1 - w_start))
                    t_window, w_start = now, step + 1
                if bar is not None:
                    bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
            if peak is not None:
                peak.step()
            if bar is not None:
                bar.update(1)
    finally:
        pf.close()
        if bar is not None:
            bar.close()
    if cuda:
        torch.cuda.synchronize(device)
    t_end = time.perf_counter()
    if peak is not None:
        peak.save()
    measured = args.steps - args.warmup
    step_s = (t_end - t_measured) / measured if t_measured is not None and measured > 0 else \
        (t_end - t_start) / max(1, args.steps)
    return {"allocator": args.allocator, "device": str(device), "steps": args.steps,
            "warmup": args.warmup, "step_ms": step_s * 1e3,
            "step_ms_median_window": sorted(windows)[len(windows) // 2] * 1e3 if windows
            else step_s * 1e3, "wall_s": t_end - t_start,
            "final_loss": sum(losses[-10:]) / len(losses[-10:]), "first_loss": losses[0],
            "losses": losses, "check": args.check, "findings": findings,
            "conf": args.conf if args.allocator == "streamarena" else None}


class PeakSnapshot:
    """The allocator's segments and blocks at the end of the step that had
    the most memory reserved, for --snapshot: taken again only when the
    reserved bytes grew, so a steady loop takes none (timed steps included:
    use it apart from timing runs)."""

    def __init__(self, path, device):
        self.path, self.device, self.reserved, self.snap = path, device, -1, None

    def step(self):
        import torch
        reserved = torch.cuda.memory_reserved(self.device)
        if reserved > self.reserved:
            self.reserved, self.snap = reserved, torch.cuda.memory._snapshot()

    def save(self):
        import pickle
        with open(self.path, "wb") as f:
            pickle.dump(self.snap, f)


def add_memory(result, plugin, device):
    """The peak memory figures of device into result (allocators.peaks)."""
    pk = allocators.peaks(plugin, device.index)
    result.update({"peak_reserved": pk["reserved"], "peak_requested": pk["requested"],
                   "peak_allocated": pk["allocated"], "allocator_stats": pk})
    if pk["errors"]:
        result["findings"].append(f"{pk['errors']} failed allocator calls (see stderr)")


def train(args):
    allocators.prepare(args.allocator)
    import torch

    cuda = args.device != "cpu"
    plugin = None
    if cuda:
        plugin = allocators.install(args.allocator, args.conf, args.check, args.trace)
        device = torch.device("cuda", int(args.device))
        torch.cuda.set_device(device)
        if args.memory_history:
            torch.cuda.memory._record_memory_history("all", context=None, stacks="python",
                                                     max_entries=4_000_000)
    else:
        device = torch.device("cpu")
    from model import LM, ConvLM

    torch.manual_seed(args.seed)
    if args.model == "cnn":
        torch.backends.cudnn.benchmark = True
        model = ConvLM(args.vocab, args.d_model, args.layers).to(device)
    else:
        model = LM(args.vocab, args.d_model, args.heads, args.layers, args.max_seq).to(device)
    if args.compile != "none":
        # The compiled module shares the model's parameters.
        model = torch.compile(model, mode=args.compile, dynamic=False)
    result = loop(args, model, device)
    result.update({"model": args.model, "compile": args.compile})
    if cuda:
        add_memory(result, plugin, device)
        if args.memory_history:
            torch.cuda.memory._dump_snapshot(args.memory_history)
            torch.cuda.memory._record_memory_history(None)
            result["memory_history"] = args.memory_history
    return result


def print_result(r):
    rows = [("allocator", r["allocator"]), ("steps", f"{r['steps']} ({r['warmup']} warm-up)"),
            ("step time", f"{r['step_ms']:.1f} ms (median window "
                          f"{r['step_ms_median_window']:.1f} ms)")]
    if "peak_reserved" in r:
        rows += [("peak reserved", f"{r['peak_reserved'] / GiB:.3f} GiB"),
                 ("peak allocated", f"{r['peak_requested'] / GiB:.3f} GiB (requested bytes)"),
                 ("reserved/allocated", f"{r['peak_reserved'] / max(1, r['peak_requested']):.4f}")]
    rows += [("loss", f"{r['first_loss']:.4f} -> {r['final_loss']:.4f}")]
    if r["check"]:
        rows.append(("check", "nothing found" if not r["findings"] else
                     f"{len(r['findings'])} findings"))
    w = max(len(k) for k, _ in rows)
    print("-" * (w + 40))
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print("-" * (w + 40))
    for f in r["findings"][:20]:
        print(f"finding: {f}")


def main(argv=None):
    args = parse_args(argv)
    r = train(args)
    print_result(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f)
    print("RESULT " + json.dumps({k: v for k, v in r.items() if k != "losses"}))
    return 1 if r["findings"] else 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
