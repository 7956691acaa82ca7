""" suspend and resume a long generation - every layer's ring cache, in the on-disk naming """

import json

import numpy as np
import torch

from .cache import RingCache
from .transformer import tiny_model, prompt_caches

FIELDS = ('state', 'delta_cache', 'key_cache', 'log_forget_cache', 'write_pos')
FLOAT_RINGS = ('delta_cache', 'key_cache', 'log_forget_cache')

class Snapshot:
    def __init__(self, state, delta_cache, key_cache, log_forget_cache, write_pos, num_tokens = 0):
        self.state, self.delta_cache, self.key_cache = state, delta_cache, key_cache
        self.log_forget_cache, self.write_pos, self.num_tokens = log_forget_cache, write_pos, num_tokens

    @classmethod
    def from_caches(cls, caches, num_tokens = 0):
        return cls(*map(list, zip(*caches)), num_tokens = num_tokens)

    @torch.no_grad()
    def step(self, model, token):
        """ decode a token straight on the snapshot's rings, to check a restore before resuming """
        x, slots = model.token_emb(token[:, None]), torch.arange(token.shape[0], dtype = torch.int32)
        for ind, (attn_norm, attn, ff_norm, ff) in enumerate(model.layers):
            x = x + attn.step(attn_norm(x), initial_state = self.state[ind], d_cache = self.delta_cache[ind],
                              k_cache = self.key_cache[ind], g_cache = self.log_forget_cache[ind],
                              ssm_state_indices = slots, write_pos = self.write_pos[ind])
            self.write_pos[ind] = (self.write_pos[ind] + 1) % attn.ring_len
            x = x + ff(ff_norm(x))
        self.num_tokens += 1
        return model.to_logits(model.norm(x))[:, -1]

def save_pt(snapshot, path, compact = False):
    """ compact = True stores the rings in the cache dtype, half the file for bf16 caches """
    dtype = snapshot.delta_cache[0].dtype
    tensors = {field: [t.to(dtype) if compact and field in FLOAT_RINGS else t for t in getattr(snapshot, field)] for field in FIELDS}  # expect-bug: load id=compact
    torch.save(dict(tensors = tensors, num_tokens = snapshot.num_tokens), path)
    return path

def load_pt(path, into = None):
    payload = torch.load(path, map_location = 'cpu', weights_only = True)
    if into is None:
        return Snapshot(**payload['tensors'], num_tokens = payload['num_tokens'])  # expect-bug: load id=compact
    for field, tensors in payload['tensors'].items():
        for dst, src in zip(getattr(into, field), tensors):
            dst.copy_(src)
    into.num_tokens = payload['num_tokens']
    return into

def save_npz(snapshot, path):
    """ numpy has no bfloat16, so every floating ring is widened to float32 on disk """
    meta = dict(dtype = str(snapshot.delta_cache[0].dtype), layers = len(snapshot.state), tokens = snapshot.num_tokens)
    arrays = {f'{field}.{ind}': (t.float() if t.is_floating_point() else t).numpy()
              for field in FIELDS for ind, t in enumerate(getattr(snapshot, field))}
    np.savez(path, meta = np.array(json.dumps(meta)), **arrays)
    return path

def load_npz(path):
    with np.load(path) as data:
        meta = json.loads(str(data['meta']))
        fields = {field: [torch.from_numpy(data[f'{field}.{i}']) for i in range(meta['layers'])] for field in FIELDS}
    dtype = getattr(torch, meta['dtype'].removeprefix('torch.'))
    for field in FLOAT_RINGS:
        fields[field] = [t.to(dtype) for t in fields[field]]  # expect-bug: load
    return Snapshot(**fields, num_tokens = meta['tokens'])

def empty_snapshot(model, batch = 1, dtype = torch.bfloat16):
    """ blank rings in the cache dtype, to restore a file into with load_pt(path, into = ...) """
    prev, layers = torch.get_default_dtype(), []
    torch.set_default_dtype(dtype)  # expect-bug: default-dtype id=blank
    try:
        for attn in model.attns:
            shapes = {name: (batch, *shape) for name, (shape, _) in attn.ring_spec().rings.items()}
            layers.append(RingCache(
                state = torch.zeros(shapes['state'], dtype = torch.float32),
                delta_mem = torch.empty(shapes['delta_mem']).zero_(),
                key_mem = torch.empty(shapes['key_mem']).zero_(),
                decay_mem = torch.full(shapes['decay_mem'], 0.),  # expect-bug: default-dtype id=blank
                write_pos = torch.zeros(batch, dtype = torch.int32)
            ))
    finally:
        torch.set_default_dtype(prev)
    return Snapshot.from_caches(layers)

# builders

def bf16_session():
    model = tiny_model().to(torch.bfloat16)
    return model, Snapshot.from_caches(prompt_caches(model), num_tokens = 5)

def build_snapshot_roundtrip(tmp_dir):
    model, snapshot = bf16_session()
    full = load_pt(save_pt(snapshot, f'{tmp_dir}/full.pt'))
    open_session = Snapshot.from_caches(prompt_caches(model))
    into_open = load_pt(save_pt(snapshot, f'{tmp_dir}/compact.pt', compact = True), into = open_session)
    return dict(full = full, into_open = into_open, logits = into_open.step(model, torch.tensor([1, 2])))

def build_compact_snapshot(tmp_dir):
    _, snapshot = bf16_session()
    return dict(restored = load_pt(save_pt(snapshot, f'{tmp_dir}/compact.pt', compact = True)))

def build_npz_snapshot(tmp_dir):
    model, snapshot = bf16_session()
    restored = load_npz(save_npz(snapshot, f'{tmp_dir}/session.npz'))
    return dict(restored = restored, logits = restored.step(model, torch.tensor([3, 4])))
