"""The model and data of the PyTorch examples: a small GPT-style language
model and a synthetic, learnable token stream whose sequence length changes
every step.

Every batch is a pure function of (seed, step, rank), made on the CPU, so runs
with different allocators see the same data and, from the same seed, the same
initial weights: their loss curves differ only by floating-point noise.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model, bias=False)
        self.fc2 = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    """Token and position embeddings, pre-norm blocks, a head tied to the
    token embedding."""

    def __init__(self, vocab, d_model, heads, layers, max_seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * layers) if "fc2" in name or
                                               "proj" in name else 1.0))

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.ln(x), self.tok.weight)


class ConvLM(nn.Module):
    """The CNN variant: token embeddings, causal 1-D convolution blocks
    (cuDNN's kernels: with torch.backends.cudnn.benchmark on, cuDNN times
    its algorithms for each new input shape, sizing their workspaces by what
    the allocator says it could serve), a head tied to the embedding."""

    def __init__(self, vocab, d_model, layers, kernel=5):
        super().__init__()
        self.kernel = kernel
        self.tok = nn.Embedding(vocab, d_model)
        self.convs = nn.ModuleList(nn.Conv1d(d_model, d_model, kernel) for _ in range(layers))
        self.norms = nn.ModuleList(nn.GroupNorm(8, d_model) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, ids):
        x = self.tok(ids).transpose(1, 2)  # (batch, d_model, seq)
        for conv, norm in zip(self.convs, self.norms):
            # Padded on the left only: position t sees tokens up to t.
            x = x + F.gelu(norm(conv(F.pad(x, (self.kernel - 1, 0)))))
        return F.linear(self.ln(x.transpose(1, 2)), self.tok.weight)


def bucket(seq, min_seq, max_seq):
    """seq moved to the nearest of three lengths (min, middle, max, multiples
    of 8): the CNN variant's input shapes, so that cuDNN's benchmark and CUDA
    graphs see few of them."""
    mid = (min_seq + max_seq) // 16 * 8
    return min((min_seq, mid, max_seq), key=lambda b: abs(b - seq))


def seq_len(seed, step, min_seq, max_seq):
    """This step's sequence length: a multiple of 8 in [min_seq, max_seq]."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    lo, hi = max(1, min_seq // 8), max(1, max_seq // 8)
    return 8 * int(torch.randint(lo, hi + 1, (1,), generator=g))


_tables = {}


def _tables_for(vocab, n):
    """A Zipf distribution over the vocabulary, and the powers of the
    successor map v -> (a v + c) mod vocab (a bijection: gcd(a, vocab) = 1)
    as v -> (A[k] v + C[k]) mod vocab for k = 0 .. n - 1."""
    key = (vocab, n)
    if key not in _tables:
        zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** 1.1
        a, c = 40503 % vocab or 1, 7919 % vocab
        while math.gcd(a, vocab) != 1:
            a += 1
        A, C = [1], [0]
        for _ in range(n - 1):
            A.append(A[-1] * a % vocab)
            C.append((C[-1] * a + c) % vocab)
        _tables[key] = (zipf / zipf.sum(), torch.tensor(A), torch.tensor(C))
    return _tables[key]


def make_batch(seed, step, rank, batch, seq, vocab):
    """A (batch, seq + 1) int64 CPU tensor of a learnable Markov chain: each
    token is followed by its fixed successor (three times in four) or by a
    fresh Zipf-distributed token. A model first learns the token frequencies,
    then the successors, so the loss falls steadily."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1009 + rank + 1)
    n = seq + 1
    zipf, A, C = _tables_for(vocab, n)
    fresh = torch.multinomial(zipf, batch * n, replacement=True, generator=g).view(batch, n)
    restart = torch.rand(batch, n, generator=g) >= 0.75
    restart[:, 0] = True
    pos = torch.arange(n).expand(batch, n)
    start = torch.where(restart, pos, 0).cummax(dim=1).values  # the run each token is in
    k = pos - start
    return (A[k] * fresh.gather(1, start) + C[k]) % vocab
