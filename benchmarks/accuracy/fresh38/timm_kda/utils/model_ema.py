""" Exponential Moving Average (EMA) of model updates
"""
import logging
from copy import deepcopy
from typing import Optional

import torch
import torch.nn as nn

_logger = logging.getLogger(__name__)


class ModelEmaV3(nn.Module):
    """ Model Exponential Moving Average V3

    Keep a moving average of everything in the model state_dict (parameters and buffers).

    Like timm's V3: decay warmup, ``update_after_step``, optional ``device``; ``dtype`` keeps the
    EMA copy in a narrower dtype to save memory on large models. Replay caches attached to the
    model are copied with it, so EMA weights can be evaluated in streaming decode directly.
    """

    def __init__(
            self,
            model,
            decay: float = 0.9999,
            min_decay: float = 0.0,
            update_after_step: int = 0,
            use_warmup: bool = False,
            warmup_gamma: float = 1.0,
            warmup_power: float = 2 / 3,
            device: Optional[torch.device] = None,
            dtype: Optional[torch.dtype] = None,
            foreach: bool = True,
    ):
        super().__init__()
        # make a copy of the model for accumulating moving average of weights
        self.module = deepcopy(model)
        self.module.eval()
        self.decay = decay
        self.min_decay = min_decay
        self.update_after_step = update_after_step
        self.use_warmup = use_warmup
        self.warmup_gamma = warmup_gamma
        self.warmup_power = warmup_power
        self.foreach = foreach
        self.device = device  # perform ema on different device from model if set
        if self.device is not None and device != next(model.parameters()).device:
            self.foreach = False  # cannot use foreach methods with different devices
        if device is not None or dtype is not None:
            self.module.to(device=device, dtype=dtype)  # expect-bug: module-cast

    def get_decay(self, step: Optional[int] = None) -> float:
        """ Compute the decay factor for the exponential moving average. """
        if step is None:
            return self.decay
        step = max(0, step - self.update_after_step - 1)
        if step <= 0:
            return 0.0
        if self.use_warmup:
            decay = 1 - (1 + step / self.warmup_gamma) ** -self.warmup_power
            decay = max(min(decay, self.decay), self.min_decay)
        else:
            decay = self.decay
        return decay

    @torch.no_grad()
    def update(self, model, step: Optional[int] = None):
        decay = self.get_decay(step)
        self.apply_update_(model, decay)

    def apply_update_(self, model, decay: float):
        # interpolate parameters and buffers
        ema_lerp_values, model_lerp_values = [], []
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
            if ema_v.is_floating_point():
                ema_lerp_values.append(ema_v)
                model_lerp_values.append(model_v.to(dtype=ema_v.dtype))
            else:
                ema_v.copy_(model_v)
        for ema_v, model_v in zip(ema_lerp_values, model_lerp_values):
            ema_v.lerp_(model_v, weight=1. - decay)
        # the replay caches are non-persistent: copied, never averaged
        for (name, ema_b), model_b in zip(self.module.named_buffers(), model.buffers()):
            if name.rsplit('.', 1)[-1] in ('ssm_state', 'delta_ring', 'key_ring', 'decay_log_ring', 'ring_pos'):
                ema_b.copy_(model_b)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _trained_model(**kwargs):
    from ..models import create_model
    torch.manual_seed(0)
    model = create_model('kda_vlm_tiny', replay_cache='module', replay_cache_slots=2, **kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.tensor([[1, 4, 9, 16, 25]])
    for _ in range(2):
        loss = model(ids).float().logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.prefill(0, ids[0])
    return model


def build_ema():
    """ EMA of a model with a module cache, two updates after a prefill. """
    model = _trained_model()
    ema = ModelEmaV3(model, decay=0.9, use_warmup=True)
    for step in range(1, 3):
        ema.update(model, step=step + 2)
    return ema


def build_ema_bf16():
    """ A bf16 EMA copy (to save memory) of an fp32 model with a module cache. """
    model = _trained_model()
    ema = ModelEmaV3(model, decay=0.9, dtype=torch.bfloat16)
    ema.update(model, step=3)
    return ema
