#!/usr/bin/env python3
"""flashcore from PyTorch: a tiny decoder that generates text for a batch of
prompts of different lengths over its own paged KV cache, each attention
call checked against torch's scaled_dot_product_attention on the cache
gathered back into contiguous tensors.

    FLASHCORE_LIBRARY=build/src/libflashcore.so python3 examples/python/generation_loop.py

(or pip install bindings/python and put libflashcore where the dynamic loader
finds it). Needs a CUDA GPU (sm_80 or newer) and torch; runs in seconds.

The cache is vLLM-style: per layer one pool of pages [num_pages, page_size,
heads_kv, head_dim] for the keys and one for the values, shared by every
sequence, and a block table whose row b lists sequence b's pages in order.
Pages are handed out from a shuffled free list as sequences grow, so no
sequence's keys are contiguous. The prompts go in with one call per layer
(packed queries, cu_seqlens_q), then each step decodes one token per
sequence.
"""

import random

import torch
import torch.nn.functional as F

import flashcore

VOCAB, D_MODEL, LAYERS = 512, 256, 2
HEADS_Q, HEADS_KV, HEAD_DIM = 8, 2, 64  # grouped-query attention, 4 query heads per K/V head
PAGE_SIZE = 16  # keys per page: a multiple of 16
PROMPT_LENGTHS = [3, 40, 17, 1]
NEW_TOKENS = 24
DTYPE = torch.float16


class PagedKVCache:
    """Key and value page pools per layer, a block table and each
    sequence's length."""

    def __init__(self, batch, max_len):
        self.max_pages = -(-max_len // PAGE_SIZE)
        num_pages = batch * self.max_pages
        pool = (LAYERS, num_pages, PAGE_SIZE, HEADS_KV, HEAD_DIM)
        self.k = torch.zeros(pool, dtype=DTYPE, device="cuda")
        self.v = torch.zeros(pool, dtype=DTYPE, device="cuda")
        self.free_pages = list(range(num_pages))
        random.Random(0).shuffle(self.free_pages)
        self.pages = [[] for _ in range(batch)]
        self.lengths = [0] * batch
        # Entries past a sequence's pages are never read: 0 will do.
        self.block_table = torch.zeros((batch, self.max_pages), dtype=torch.int32, device="cuda")

    def add_tokens(self, counts):
        """Makes room for counts[b] more tokens of each sequence b, taking
        pages from the free list as needed. Returns the (page, row) slots of
        the new tokens in packed order (sequence by sequence), for append(),
        and the new lengths as the int32 cache_seqlens flashcore reads."""
        pages, rows = [], []
        for b, count in enumerate(counts):
            for position in range(self.lengths[b], self.lengths[b] + count):
                if position % PAGE_SIZE == 0:
                    self.pages[b].append(self.free_pages.pop())
                pages.append(self.pages[b][position // PAGE_SIZE])
                rows.append(position % PAGE_SIZE)
            self.lengths[b] += count
            self.block_table[b, :len(self.pages[b])] = torch.tensor(self.pages[b], dtype=torch.int32)
        slots = (torch.tensor(pages, device="cuda"), torch.tensor(rows, device="cuda"))
        return slots, torch.tensor(self.lengths, dtype=torch.int32, device="cuda")

    def append(self, layer, slots, k, v):
        """Writes the new tokens' k and v ([tokens, heads_kv, head_dim]) into their slots."""
        self.k[layer][slots] = k
        self.v[layer][slots] = v

    def gathered(self, layer, b):
        """Sequence b's keys and values as contiguous [length, heads_kv, head_dim] tensors."""
        pages = torch.tensor(self.pages[b], device="cuda")
        n = self.lengths[b]
        return self.k[layer][pages].flatten(0, 1)[:n], self.v[layer][pages].flatten(0, 1)[:n]


def sdpa_reference(cache, layer, q, query_counts):
    """Packed [tokens, heads_q, head_dim] attention output of torch SDPA over
    the gathered caches; query i of a sequence of n keys and m new queries
    sees keys j <= i + n - m (the new tokens are the cache's last ones)."""
    outs, start = [], 0
    for b, m in enumerate(query_counts):
        k, v = cache.gathered(layer, b)
        n = k.shape[0]
        sees = torch.ones((m, n), dtype=torch.bool, device="cuda").tril(diagonal=n - m)
        group = HEADS_Q // HEADS_KV
        qb = q[start:start + m].transpose(0, 1).float()  # [heads_q, m, head_dim]
        kb = k.transpose(0, 1).float().repeat_interleave(group, 0)
        vb = v.transpose(0, 1).float().repeat_interleave(group, 0)
        outs.append(F.scaled_dot_product_attention(qb, kb, vb, attn_mask=sees).transpose(0, 1))
        start += m
    return torch.cat(outs)


def init_weights(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def w(rows, cols):
        return (torch.randn(rows, cols, generator=g, device="cuda") / rows**0.5).to(DTYPE)

    layers = [dict(q=w(D_MODEL, HEADS_Q * HEAD_DIM), k=w(D_MODEL, HEADS_KV * HEAD_DIM),
                   v=w(D_MODEL, HEADS_KV * HEAD_DIM), o=w(HEADS_Q * HEAD_DIM, D_MODEL),
                   up=w(D_MODEL, 4 * D_MODEL), down=w(4 * D_MODEL, D_MODEL)) for _ in range(LAYERS)]
    return dict(embed=w(VOCAB, D_MODEL) * D_MODEL**0.5, layers=layers, head=w(D_MODEL, VOCAB))


def rms_norm(x):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(DTYPE)


def forward(weights, cache, tokens, query_counts, worst):
    """Logits of the last new token of each sequence. tokens: the new
    tokens of every sequence, packed; query_counts[b] of them are sequence
    b's. worst[0] keeps the largest difference from SDPA seen."""
    slots, cache_seqlens = cache.add_tokens(query_counts)
    decoding = all(m == 1 for m in query_counts)
    # Prefill packs the sequences' queries (cu_seqlens_q); decoding has one
    # query per sequence, q [B, 1, heads_q, head_dim].
    cu_seqlens_q = torch.tensor([0] + query_counts, device="cuda").cumsum(0).to(torch.int32)
    h = weights["embed"][tokens]
    for layer, w in enumerate(weights["layers"]):
        x = rms_norm(h)
        q = (x @ w["q"]).view(-1, HEADS_Q, HEAD_DIM)
        k = (x @ w["k"]).view(-1, HEADS_KV, HEAD_DIM)
        v = (x @ w["v"]).view(-1, HEADS_KV, HEAD_DIM)
        cache.append(layer, slots, k, v)
        if decoding:
            out = flashcore.attention_with_kvcache(q.unsqueeze(1), cache.k[layer], cache.v[layer], cache_seqlens,
                                                   block_table=cache.block_table, causal=True).squeeze(1)
        else:
            out = flashcore.attention_with_kvcache(q, cache.k[layer], cache.v[layer], cache_seqlens,
                                                   block_table=cache.block_table, cu_seqlens_q=cu_seqlens_q,
                                                   max_seqlen_q=max(query_counts), causal=True)
        reference = sdpa_reference(cache, layer, q, query_counts)
        worst[0] = max(worst[0], (out.float() - reference).abs().max().item())
        h = h + out.reshape(-1, HEADS_Q * HEAD_DIM) @ w["o"]
        h = h + F.gelu(rms_norm(h) @ w["up"]) @ w["down"]
    last_rows = cu_seqlens_q[1:].long() - 1
    return rms_norm(h[last_rows]) @ weights["head"]


def main():
    if not torch.cuda.is_available():
        # (Before anything touches CUDA, whose own message is torch's "CUDA driver version is insufficient".)
        raise SystemExit("needs a CUDA GPU")
    torch.manual_seed(0)
    weights = init_weights()
    batch = len(PROMPT_LENGTHS)
    cache = PagedKVCache(batch, max(PROMPT_LENGTHS) + NEW_TOKENS)
    prompts = [torch.randint(VOCAB, (n,), device="cuda") for n in PROMPT_LENGTHS]
    print("flashcore %s (library %s)" % (flashcore.__version__, flashcore.library_version()))
    print("%d sequences, prompts of %s tokens; %d layers, %d/%d heads of %d; pages of %d keys"
          % (batch, PROMPT_LENGTHS, LAYERS, HEADS_Q, HEADS_KV, HEAD_DIM, PAGE_SIZE))

    worst = [0.0]
    logits = forward(weights, cache, torch.cat(prompts), PROMPT_LENGTHS, worst)
    print("prefill: max |flashcore - sdpa| = %.2e" % worst[0])
    generated = [[] for _ in range(batch)]
    for step in range(NEW_TOKENS):
        next_tokens = logits.argmax(-1)
        for b in range(batch):
            generated[b].append(int(next_tokens[b]))
        logits = forward(weights, cache, next_tokens, [1] * batch, worst)
        if step % 8 == 7 or step == NEW_TOKENS - 1:
            print("step %2d: lengths %s, pages in use %d, max |flashcore - sdpa| so far %.2e"
                  % (step + 1, cache.lengths, sum(len(p) for p in cache.pages), worst[0]))
    print("sequence 0's pages, in key order: %s" % cache.pages[0])
    print("sequence 1 generated: %s ..." % generated[1][:12])
    assert worst[0] < 2e-2, "flashcore and SDPA disagree: %.3g" % worst[0]
    print("OK")


if __name__ == "__main__":
    main()
