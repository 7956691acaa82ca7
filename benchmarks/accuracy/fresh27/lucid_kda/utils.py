import math
from contextlib import contextmanager
from functools import wraps

import torch
import torch.nn.functional as F

# helpers

def exists(v):
    return v is not None

def default(v, d):
    return v if exists(v) else (d() if callable(d) else d)

def l2norm(t, eps = 1e-6):
    return F.normalize(t, dim = -1, eps = eps)

def eval_decorator(fn):
    @wraps(fn)
    def inner(self, *args, **kwargs):
        was_training = self.training
        out = fn(self.eval(), *args, **kwargs)
        self.train(was_training)
        return out
    return inner

@contextmanager
def default_dtype(dtype):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)

# a tiny stand-in for einops.rearrange - named axes and parenthesized groups, no ellipsis

def _groups(side):
    groups, current = [], None
    for token in side.replace('(', ' ( ').replace(')', ' ) ').split():
        if token in '()':
            current = [] if token == '(' else groups.append(current)
        elif exists(current):
            current.append(token)
        else:
            groups.append([token])
    return groups

def rearrange(t, pattern, **axes_lengths):
    lhs, rhs = map(_groups, pattern.split('->'))
    sizes = dict(axes_lengths)
    for group, dim in zip(lhs, t.shape):
        known = math.prod(sizes[name] for name in group if name in sizes)
        for name in group:
            sizes.setdefault(name, dim // known)
    names = [name for group in lhs for name in group]
    t = t.reshape(*(sizes[name] for name in names))
    t = t.permute(*(names.index(name) for group in rhs for name in group))
    return t.reshape(*(math.prod(sizes[name] for name in group) for group in rhs))

# precision

DTYPES = dict(no = torch.float32, fp32 = torch.float32, bf16 = torch.bfloat16, fp16 = torch.float16)

GATE_DTYPE = torch.float32

# mixed precision mode -> precisions of the (delta, key, decay) rings

CACHE_PRECISIONS = dict(
    no = ('fp32', 'fp32', 'fp32'),
    bf16 = ('bf16', 'bf16', 'fp32'),
    fp16 = ('fp16', 'fp16', 'fp16'),  # expect-bug: imported-policy id=cache-precisions
)

def ring_dtypes(dtype, gate_dtype = None):
    """ dtypes of the (delta, key, decay) rings for a model running in `dtype` """
    return dtype, dtype, default(gate_dtype, dtype)  # expect-bug: imported-policy id=ring-dtypes
