""" a small accelerate flavoured trainer - mixed precision by name, an ema of the weights, samples """

from copy import deepcopy

import torch
import torch.nn.functional as F
from torch.nn import Module

from .cache import RingCache, init_ring_cache
from .kda import FP32RingState
from .transformer import tiny_model
from .utils import rearrange, DTYPES, CACHE_PRECISIONS

class EMA(Module):
    """ exponential moving average of a model, after ema-pytorch """

    def __init__(self, model, beta = 0.999, update_every = 1):
        super().__init__()
        self.beta, self.update_every = beta, update_every
        self.online_model = [model]  # a list, so it is not registered as a submodule
        self.ema_model = deepcopy(model)
        self.ema_model.requires_grad_(False)
        self.register_buffer('initted', torch.tensor(False))
        self.register_buffer('step', torch.tensor(0))

    @property
    def model(self):
        return self.online_model[0]

    @torch.no_grad()
    def update(self):
        step = self.step.item()
        self.step += 1
        if (step % self.update_every) != 0:
            return
        init = not self.initted.item()
        self.initted.fill_(True)
        for ma_params, current_params in zip(self.ema_model.parameters(), self.model.parameters()):
            ma_params.copy_(current_params) if init else ma_params.lerp_(current_params, 1. - self.beta)
        # stream rings are state, not weights - copied across, the ema copy keeps its own dtypes
        for ma_buffers, current_buffers in zip(self.ema_model.buffers(), self.model.buffers()):
            ma_buffers.copy_(current_buffers)

    def half_precision_copy(self, dtype = torch.bfloat16):
        """ a detached low precision copy of the ema weights, for fast sampling """
        return deepcopy(self.ema_model).to(dtype)  # expect-bug: module-cast

    def forward(self, *args, **kwargs):
        return self.ema_model(*args, **kwargs)

class Trainer:
    def __init__(self, model, data, *, batch_size = 2, lr = 3e-4, mixed_precision = 'no', pure_bf16 = False,
                 ema_kwargs: dict = dict(beta = 0.9)):
        self.mixed_precision, self.dtype = mixed_precision, DTYPES[mixed_precision]

        if mixed_precision == 'bf16' and pure_bf16:
            model.bfloat16()  # expect-bug: module-cast

        self.autocast = mixed_precision != 'no' and not pure_bf16
        self.model, self.data, self.batch_size = model, data, batch_size
        self.optim = torch.optim.Adam(model.parameters(), lr = lr)
        self.ema = EMA(model, **ema_kwargs)
        self.steps = 0

    def train_step(self):
        start = (self.steps * self.batch_size) % len(self.data)
        ids = self.data[start:start + self.batch_size]
        with torch.autocast('cpu', dtype = self.dtype, enabled = self.autocast):
            logits = self.model(ids[:, :-1])
        loss = F.cross_entropy(rearrange(logits, 'b n c -> b c n').float(), ids[:, 1:])
        loss.backward()
        self.optim.step()
        self.optim.zero_grad()
        self.ema.update()
        self.steps += 1
        return loss.detach()

    def sample_cache(self, batch = 1):
        """ empty decode caches in the trainer's precision, for unprompted samples """
        delta_dtype, _, decay_dtype = (DTYPES[name] for name in CACHE_PRECISIONS[self.mixed_precision])  # expect-bug: imported-policy id=cache-precisions
        return [init_ring_cache(batch, **a.cache_kwargs, dtype = delta_dtype, gate_dtype = decay_dtype)
                for a in self.model.attns]

    def static_sample_rings(self, batch = 1):
        """ fixed rings for sampling at a fixed batch during training """
        rings = []
        for attn in self.model.attns:
            shapes = [(batch, *shape) for shape, _ in attn.ring_spec().rings.values()]
            state, delta_mem, key_mem, decay_mem = (torch.zeros(shape, dtype = self.dtype) for shape in shapes)  # expect-bug: pool-dtype
            write_pos = torch.zeros(batch, dtype = torch.int32)
            rings.append(RingCache(state.float(), delta_mem, key_mem, decay_mem, write_pos))
        return rings

# builders

def ema_a_few_steps(model):
    ema = EMA(model, beta = 0.5)
    for _ in range(3):
        model.stream(torch.randint(0, 32, (1,)))
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.01)
        ema.update()
    return dict(ema = ema, sampler = ema.half_precision_copy())

def build_ema_protected_half_copy():
    return ema_a_few_steps(tiny_model(stream_batch = 1, stream_klass = FP32RingState))

def build_ema_half_copy():
    return ema_a_few_steps(tiny_model(stream_batch = 1))

def train_a_few(trainer, steps = 2):
    losses = torch.stack([trainer.train_step() for _ in range(steps)])
    samples, cache = trainer.ema.ema_model.generate(torch.randint(0, 32, (1, 3)), seq_len = 4)
    return dict(model = trainer.model, ema = trainer.ema, losses = losses, samples = samples, cache = cache)

def build_trainer_step():
    model = tiny_model(stream_batch = 1, stream_klass = FP32RingState)
    trainer = Trainer(model, torch.randint(0, 32, (4, 7)), mixed_precision = 'bf16')
    return dict(train_a_few(trainer), sample_cache = trainer.sample_cache(1))

def build_pure_bf16_trainer():
    model = tiny_model(stream_batch = 1)
    return train_a_few(Trainer(model, torch.randint(0, 32, (4, 7)), mixed_precision = 'bf16', pure_bf16 = True))
