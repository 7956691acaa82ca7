# Copyright (c) OpenMMLab. All rights reserved.
import glob
import os.path as osp
import tempfile
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

from ..config import ModelConfig

WEIGHT_FILE_PATTERN = '*.bin'
REPLAY_CACHE_PREFIX = 'replay_cache.'


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor):
    """Default weight loader: copy into the parameter (which converts to its dtype)."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.fill_(loaded_weight.item())
    else:
        assert param.size() == loaded_weight.size(), (f'Attempted to load weight ({loaded_weight.size()}) '
                                                       f'into parameter ({param.size()})')
        param.data.copy_(loaded_weight)


def load_weight(param: torch.Tensor, loaded_weight: torch.Tensor, **kwargs):
    """Load one weight with the ``weight_loader`` of the parameter, if it has one."""
    weight_loader = getattr(param, 'weight_loader', default_weight_loader)
    if 'shard_id' in kwargs and weight_loader is default_weight_loader:
        raise RuntimeError(f'parameter of shape {tuple(param.shape)} has no weight_loader for shards.')
    weight_loader(param, loaded_weight, **kwargs)


def load_buffer(model: nn.Module, name: str, loaded_weight: torch.Tensor):
    """Restore a buffer saved next to the weights (the replay caches of a warm restart).

    The loaded tensor is taken as the buffer instead of copied into it, so a restart does not
    hold two copies of the caches.
    """
    module_name, _, buffer_name = name.rpartition('.')
    module = model.get_submodule(module_name)
    buffer = module._buffers[buffer_name]
    if buffer.dim() != loaded_weight.dim() or buffer.shape[2:] != loaded_weight.shape[2:]:
        raise ValueError(f'{name}: saved with shape {tuple(loaded_weight.shape)}, '
                         f'the model has {tuple(buffer.shape)}.')
    module._buffers[buffer_name] = loaded_weight.to(buffer.device)  # expect-bug: load id=restored-buffer


def _get_weight_files(model_path: str) -> List[str]:
    if osp.isfile(model_path):
        return [model_path]
    files = sorted(glob.glob(osp.join(model_path, WEIGHT_FILE_PATTERN)))
    if not files:
        raise FileNotFoundError(f'No weight file found in {model_path}.')
    return files


def _iter_checkpoint(model_path: str, dtype: Optional[torch.dtype] = None) -> Iterator[Tuple[str, torch.Tensor]]:
    """Iterate the tensors of every weight file.

    Floating point tensors are converted to ``dtype`` as they are read, which keeps host memory at
    the size of the served model for float32 checkpoints.
    """
    for file in _get_weight_files(model_path):
        state_dict = torch.load(file, map_location='cpu', weights_only=True)
        for name, tensor in state_dict.items():
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)  # expect-bug: load id=restored-buffer
            yield name, tensor
        del state_dict


def load_model_weights(model: nn.Module, model_path: str, dtype: Optional[torch.dtype] = None):
    """Load the weights of ``model_path`` (a file or a folder of ``*.bin`` files) into ``model``."""
    if dtype is None:
        dtype = next(model.parameters()).dtype
    model.load_weights(_iter_checkpoint(model_path, dtype))


def export_replay_cache(model: nn.Module, dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
    """The replay caches owned by ``model``, as a state dict for :func:`load_model_weights`.

    Exported in the model dtype unless ``dtype`` is given.
    """
    if dtype is None:
        dtype = next(model.parameters()).dtype
    state_dict = dict()
    for name, buffer in model.named_buffers():
        if not name.startswith(REPLAY_CACHE_PREFIX):
            continue
        if buffer.is_floating_point():
            state_dict[name] = buffer.detach().to('cpu', dtype=dtype)  # expect-bug: cast
        else:
            state_dict[name] = buffer.detach().cpu().clone()
    return state_dict


def dummy_weights(config: ModelConfig, seed: int = 0) -> List[Tuple[str, torch.Tensor]]:
    """Random float32 weights with the hf names of a Kimi Linear checkpoint (profiling runs)."""
    generator = torch.Generator().manual_seed(seed)
    hidden = config.hidden_size
    qk_size = config.num_attention_heads * config.head_dim
    v_size = config.num_value_heads * config.v_head_dim

    def _randn(*shape, std=0.2):
        return std * torch.randn(*shape, generator=generator)

    weights = [('model.embed_tokens.weight', _randn(config.vocab_size, hidden, std=1.0))]
    for idx in range(config.num_layers):
        prefix = f'model.layers.{idx}'
        weights += [
            (f'{prefix}.self_attn.q_proj.weight', _randn(qk_size, hidden)),
            (f'{prefix}.self_attn.k_proj.weight', _randn(qk_size, hidden)),
            (f'{prefix}.self_attn.v_proj.weight', _randn(v_size, hidden)),
            (f'{prefix}.self_attn.f_proj.weight', _randn(config.num_value_heads * config.head_dim, hidden)),
            (f'{prefix}.self_attn.b_proj.weight', _randn(config.num_value_heads, hidden)),
            (f'{prefix}.self_attn.A_log', torch.log(torch.linspace(1.0, 16.0, config.num_value_heads))),
            (f'{prefix}.self_attn.dt_bias', _randn(config.num_value_heads * config.head_dim, std=0.1)),
            (f'{prefix}.self_attn.o_proj.weight', _randn(hidden, v_size)),
            (f'{prefix}.mlp.gate_proj.weight', _randn(config.intermediate_size, hidden)),
            (f'{prefix}.mlp.up_proj.weight', _randn(config.intermediate_size, hidden)),
            (f'{prefix}.mlp.down_proj.weight', _randn(hidden, config.intermediate_size)),
            (f'{prefix}.input_layernorm.weight', torch.ones(hidden)),
            (f'{prefix}.post_attention_layernorm.weight', torch.ones(hidden)),
        ]
    weights += [('model.norm.weight', torch.ones(hidden)), ('lm_head.weight', _randn(config.vocab_size, hidden))]
    return weights


def _build_model_with_cache(config: ModelConfig, num_slots: int, ring_len: int):
    from ..models.kimi_linear import KDAReplayCache
    from ..models.patch import get_patched_model
    model = get_patched_model(config, device='cpu')
    model.replay_cache = KDAReplayCache(config, num_slots, ring_len, dtype=config.dtype, device='cpu')
    return model


def build_loaded_kimi_linear():
    """Save float32 weights, load them into a bf16 model with its own caches and decode."""
    from ..models.kimi_linear import _tiny_config, decode_with_replay_cache
    torch.manual_seed(0)
    config = _tiny_config(num_value_heads=2)
    model = _build_model_with_cache(config, num_slots=2, ring_len=4)
    with tempfile.TemporaryDirectory() as tmp_dir:
        torch.save(dict(dummy_weights(config, seed=3)), osp.join(tmp_dir, 'pytorch_model.bin'))
        load_model_weights(model, tmp_dir)
    hidden = decode_with_replay_cache(model, torch.tensor([5, 9]), torch.tensor([0, 1], dtype=torch.int32), 3)
    return {'model': model, 'hidden': hidden}


def build_restored_replay_cache():
    """Decode, save the weights with the exported replay caches and restart from them."""
    from ..models.kimi_linear import _tiny_config, decode_with_replay_cache
    torch.manual_seed(0)
    config = _tiny_config(num_value_heads=2)
    weights = dict(dummy_weights(config, seed=4))
    model = _build_model_with_cache(config, num_slots=2, ring_len=4)
    model.load_weights(weights.items())
    decode_with_replay_cache(model, torch.tensor([1, 2]), torch.tensor([1, 0], dtype=torch.int32), 2)
    exported = export_replay_cache(model)
    restarted = _build_model_with_cache(config, num_slots=2, ring_len=4)
    with tempfile.TemporaryDirectory() as tmp_dir:
        torch.save({**weights, **exported}, osp.join(tmp_dir, 'pytorch_model.bin'))
        load_model_weights(restarted, tmp_dir)
    hidden = decode_with_replay_cache(restarted, torch.tensor([4, 6]), torch.tensor([1, 0], dtype=torch.int32), 1)
    return {'exported': exported, 'restarted': restarted, 'hidden': hidden}
