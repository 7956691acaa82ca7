""" CUDA / AMP utils

NativeScaler (GradScaler wrapper) and the static buffers used for CUDA-graph decode.
"""
from typing import Dict, List, Optional

import torch

from .amp import resolve_dtype


def dispatch_clip_grad(parameters, value: float, mode: str = 'norm', norm_type: float = 2.0):
    if mode == 'norm':
        torch.nn.utils.clip_grad_norm_(parameters, value, norm_type=norm_type)
    elif mode == 'value':
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        assert False, f"Unknown clip mode ({mode})."


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self, device='cuda'):
        self._scaler = torch.amp.GradScaler(device=device)

    def __call__(
            self,
            loss,
            optimizer,
            clip_grad=None,
            clip_mode='norm',
            parameters=None,
            create_graph=False,
            need_update=True,
    ):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if need_update:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)  # unscale the gradients of optimizer's assigned params in-place
                dispatch_clip_grad(parameters, clip_grad, mode=clip_mode)
            self._scaler.step(optimizer)
            self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict):
        self._scaler.load_state_dict(state_dict)


class StaticDecodeBuffers:
    """ Fixed-address inputs and rings for capturing one decode step in a CUDA graph.

    The graph bakes in every pointer, so the rings are allocated once here, for the largest
    batch, instead of by the model.
    """

    def __init__(
            self,
            model: torch.nn.Module,
            num_slots: int,
            max_batch: int = 8,
            ring_len: Optional[int] = None,
            cache_dtype='bfloat16',
            device=None,
    ):
        self.ring_len = ring_len or model.pretrained_cfg.get('ring_len', 8)
        dtype = resolve_dtype(cache_dtype)
        self.rings: List[Dict[str, torch.Tensor]] = [
            {name: torch.zeros((num_slots, *shape), dtype=dtype, device=device) for name, shape in layout.items() if name != 'ssm_state'}  # expect-bug: pool-dtype
            for layout in model.ring_layouts(self.ring_len)
        ]
        for rings, layout in zip(self.rings, model.ring_layouts(self.ring_len)):
            rings['ssm_state'] = torch.zeros((num_slots, *layout['ssm_state']), dtype=torch.float32, device=device)
            rings['ring_pos'] = torch.zeros(num_slots, dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.slot_idx = torch.full((max_batch,), -1, dtype=torch.int32, device=device)

    @torch.no_grad()
    def step(self, model: torch.nn.Module, input_ids: torch.Tensor, slot_idx: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[0]
        self.input_ids[:n].copy_(input_ids)
        self.slot_idx.fill_(-1)
        self.slot_idx[:n].copy_(slot_idx)
        self.logits = model.forward_decode(self.input_ids, self.slot_idx, rings=self.rings)
        return self.logits[:n]


def build_static_decode_buffers():
    """ Static graph buffers for a bf16 ``kda_vlm_tiny``; three eager steps on two slots. """
    from ..models import create_model
    torch.manual_seed(0)
    model = create_model('kda_vlm_tiny', dtype=torch.bfloat16).eval()
    bufs = StaticDecodeBuffers(model, num_slots=2, max_batch=4, ring_len=4, cache_dtype='bfloat16')
    for step in range(3):
        bufs.step(model, torch.tensor([3 + step, 9 + step]), torch.tensor([1, 0], dtype=torch.int32))
    return {'rings': bufs.rings, 'logits': bufs.logits}
