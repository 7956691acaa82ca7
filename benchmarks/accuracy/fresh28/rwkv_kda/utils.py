"""``PIPELINE`` (tokenizer, sampling, ``generate``) as in ``rwkv.utils``, and small helpers."""

import contextlib

import torch
import torch.nn.functional as F

@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)

class PIPELINE_ARGS:
    def __init__(self, temperature=1.0, top_p=0.85, alpha_frequency=0.2, alpha_presence=0.2, alpha_decay=0.996,
                 token_ban=(), token_stop=(), chunk_len=256):
        self.temperature, self.top_p, self.chunk_len = temperature, top_p, chunk_len
        self.alpha_frequency, self.alpha_presence, self.alpha_decay = alpha_frequency, alpha_presence, alpha_decay
        self.token_ban, self.token_stop = list(token_ban), list(token_stop)

class PIPELINE:
    """Character tokenizer over ``vocab`` (the real one is the RWKV world trie tokenizer)."""
    def __init__(self, model, vocab=" \nabcdehilnorstu", seed=42):
        self.model, self.vocab, self.generator = model, vocab, torch.Generator().manual_seed(seed)
    def encode(self, text):
        return [self.vocab.index(c) if c in self.vocab else 0 for c in text.lower()]
    def decode(self, tokens):
        return "".join(self.vocab[t % len(self.vocab)] for t in tokens)
    def sample_logits(self, logits, temperature=1.0, top_p=0.85):
        probs = F.softmax(logits.float(), dim=-1)
        sorted_probs, _ = torch.sort(probs, descending=True)
        cut = min(int(torch.searchsorted(torch.cumsum(sorted_probs, -1), top_p)), len(probs) - 1)
        probs[probs < sorted_probs[cut]] = 0
        probs = probs ** (1.0 / temperature)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=self.generator)[0])
    def generate(self, ctx, token_count=16, args=PIPELINE_ARGS(), callback=None, state=None, out=None):
        """Continues ``ctx`` (with ``ctx == ""``: the given ``out``); returns ``(text, out, state)``."""
        occurrence, tokens = {}, []
        if ctx:
            out, state = self.model.forward(self.encode(ctx)[-args.chunk_len:], state)
        for _ in range(token_count):
            logits = out.clone()
            for n, count in occurrence.items():
                logits[n] -= args.alpha_presence + count * args.alpha_frequency
            logits[args.token_ban] = -float("inf")
            token = self.sample_logits(logits, args.temperature, args.top_p)
            if token in args.token_stop:
                break
            tokens.append(token)
            occurrence = {n: c * args.alpha_decay for n, c in occurrence.items()}
            occurrence[token] = 1 + occurrence.get(token, 0)
            out, state = self.model.forward([token], state)
            if callback:
                callback(self.decode(tokens[-1:]))
        return self.decode(tokens), out, state
