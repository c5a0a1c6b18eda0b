#!/usr/bin/env python3
"""Record PyTorch's allocation history from a small training loop, as a trace.

    python3 bench/peers/record_torch_trace.py [--steps 30] OUT.csv.gz

A decoder-only transformer (attention through scaled_dot_product_attention,
bf16 autocast, AdamW) trained for --steps steps with a sequence length drawn
per step between --min-seq and --max-seq (bucketed or packed batches). The
next batch is made on a side stream, as a data loader's copy would be, and
handed to the compute stream with wait_stream and record_stream, so some
frees complete later than they are requested. The recording starts before
the model is built: weights, gradients and optimizer state are in it.

The output is PyTorch's own history (torch.cuda.memory._snapshot()'s
device_traces) as CSV, stream,action,addr,size,time_us, gzipped: the format
//bench:replay and bench/peers' peer_bench read (docs/TRACE.md), written by
bench/torch_trace.py's converter (staged beside this script). Needs a GPU.
"""
import argparse
import gzip
import os
import random
import sys
import time

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_here, os.path.join(_here, "..")]  # staged beside it, or bench/ in a checkout
from torch_trace import convert  # noqa: E402


def build(torch, layers, hidden, heads, vocab):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, hidden // heads).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, hidden))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, vocab, bias=False)

        def forward(self, ids):
            x = self.emb(ids)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return Model()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the trace to write (.csv.gz)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--min-seq", type=int, default=128)
    ap.add_argument("--max-seq", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=4)
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        sys.exit("record_torch_trace.py: no GPU (torch.cuda.is_available() is False)")
    t0 = time.time()
    rec = torch.cuda.memory._record_memory_history
    try:  # no stack traces: the addresses, sizes and streams are what a replay needs
        rec(enabled="all", context=None, stacks="python", max_entries=10_000_000)
    except TypeError:
        rec(max_entries=10_000_000)

    rng = random.Random(args.seed)
    dev = torch.device("cuda")
    model = build(torch, args.layers, args.hidden, args.heads, args.vocab).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    main_stream = torch.cuda.current_stream()

    def next_batch():
        t = rng.randint(args.min_seq, args.max_seq)
        with torch.cuda.stream(side):  # the loader's stream
            ids = torch.randint(0, args.vocab, (args.batch, t + 1), device=dev)
        return ids

    pending = next_batch()
    for _ in range(args.steps):
        main_stream.wait_stream(side)
        ids = pending
        ids.record_stream(main_stream)  # used here; freed only after this stream's work
        pending = next_batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del ids, logits, loss
    torch.cuda.synchronize()

    snap = torch.cuda.memory._snapshot()
    try:
        rec(enabled=None)
    except TypeError:
        pass
    traces = snap["device_traces"][torch.cuda.current_device()]
    with gzip.open(args.out, "wt") as f:
        st = convert(traces, f)
    print(f"record_torch_trace.py: {st['events']} events, {st['allocs']} allocs, {st['frees']} "
          f"frees, {st['streams']} streams, peak live {st['peak_live'] / 2**30:.2f} GiB; torch "
          f"{torch.__version__}, {args.steps} steps in {time.time() - t0:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
