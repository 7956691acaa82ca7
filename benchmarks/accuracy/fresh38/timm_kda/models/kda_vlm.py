""" KDA Vision-Language streaming decoder

A small hybrid-linear-attention VLM: image patches and text tokens share one stack of Kimi Delta
Attention blocks. Prompts run the chunked delta rule (training) or the ReplaySSM decode kernel
token by token (``prefill``); generation is ``forward_decode``, one token per cache slot.

Decode caches can live in the model (``set_replay_cache`` / ``create_model(replay_cache='module')``),
move with ``model.to()`` and are dropped from checkpoints, or outside it (``ReplayCache``).
"""
from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import KimiDeltaAttention, PatchEmbed, SwiGLU, get_norm_layer
from ..ops.replayssm import chunk_kda
from ._builder import build_model_with_cfg
from ._cache import ReplayCache
from ._features import feature_take_indices
from ._manipulate import cast_model_dtype, checkpoint_seq, named_apply
from ._registry import generate_default_cfgs, register_model

__all__ = ['KdaVisionLM', 'KdaBlock']


class KdaBlock(nn.Module):

    def __init__(
            self,
            dim: int,
            num_heads: int,
            num_v_heads: Optional[int] = None,
            head_dim: Optional[int] = None,
            mlp_ratio: float = 2.,
            qkv_bias: bool = False,
            gate_fn: str = 'softplus',
            gate_lower_bound: float = -5.,
            act_layer: str = 'silu',
            norm_layer: str = 'rmsnorm',
            mlp_layer=SwiGLU,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        norm_layer = get_norm_layer(norm_layer)
        self.norm1 = norm_layer(dim, **dd)
        self.attn = KimiDeltaAttention(
            dim,
            num_heads=num_heads,
            num_v_heads=num_v_heads,
            head_dim=head_dim,
            gate_fn=gate_fn,
            gate_lower_bound=gate_lower_bound,
            qkv_bias=qkv_bias,
            **dd,
        )
        self.norm2 = norm_layer(dim, **dd)
        self.mlp = mlp_layer(dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def forward_decode(self, x: torch.Tensor, slot_idx: torch.Tensor, rings=None) -> torch.Tensor:
        x = x + self.attn.forward_decode(self.norm1(x), slot_idx, rings)
        return x + self.mlp(self.norm2(x))


class KdaVisionLM(nn.Module):

    def __init__(
            self,
            img_size: int = 16,
            patch_size: int = 8,
            in_chans: int = 3,
            vocab_size: int = 64,
            embed_dim: int = 32,
            depth: int = 2,
            num_heads: int = 2,
            num_v_heads: Optional[int] = None,
            head_dim: Optional[int] = None,
            mlp_ratio: float = 2.,
            qkv_bias: bool = False,
            gate_fn: str = 'softplus',
            gate_lower_bound: float = -5.,
            act_layer: str = 'silu',
            norm_layer: str = 'rmsnorm',
            ring_len: int = 8,
            replay_cache_slots: Optional[int] = None,
            weight_init: str = '',
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.vocab_size = vocab_size
        self.num_features = self.embed_dim = embed_dim
        self.ring_len = ring_len
        self.grad_checkpointing = False
        self.replay_cache: Optional[ReplayCache] = None

        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim, **dd)
        self.tok_embed = nn.Embedding(vocab_size, embed_dim, **dd)
        block_kwargs = dict(
            num_heads=num_heads, num_v_heads=num_v_heads, head_dim=head_dim, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
            gate_fn=gate_fn, gate_lower_bound=gate_lower_bound, act_layer=act_layer, norm_layer=norm_layer,
        )
        self.blocks = nn.Sequential(*[KdaBlock(embed_dim, **block_kwargs, **dd) for _ in range(depth)])
        self.feature_info = [dict(module=f'blocks.{i}', num_chs=embed_dim, reduction=1) for i in range(depth)]
        self.norm = get_norm_layer(norm_layer)(embed_dim, **dd)
        self.head = nn.Linear(embed_dim, vocab_size, bias=False, **dd)

        if weight_init != 'skip':
            self.init_weights(weight_init)
        if replay_cache_slots:
            self.set_replay_cache(replay_cache_slots)

    def init_weights(self, mode: str = ''):
        assert mode in ('jax', 'moco', '')
        named_apply(partial(_init_weights, std=0.02), self)

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True):
        self.grad_checkpointing = enable

    # --- caches -------------------------------------------------------------------------------

    def ring_layouts(self, ring_len: Optional[int] = None) -> List[Dict[str, Tuple[int, ...]]]:
        return [blk.attn.ring_shapes(ring_len or self.ring_len) for blk in self.blocks]

    def set_replay_cache(self, num_slots: int, ring_len: Optional[int] = None, device=None, dtype=None):
        """ Allocate the in-model decode cache of every block. """
        for blk in self.blocks:
            blk.attn.init_cache(num_slots, ring_len or self.ring_len, device=device, dtype=dtype)

    def reset_replay_cache(self, slots: Optional[Sequence[int]] = None, cache: Optional[ReplayCache] = None):
        cache = cache if cache is not None else self.replay_cache
        if cache is not None:
            cache.reset(slots)
            return
        slots = torch.as_tensor(slots) if slots is not None else None
        for blk in self.blocks:
            blk.attn.reset_cache(slots)

    # --- forward ------------------------------------------------------------------------------

    def embed(self, input_ids: Optional[torch.Tensor] = None, images: Optional[torch.Tensor] = None) -> torch.Tensor:
        parts = []
        if images is not None:
            parts.append(self.patch_embed(images))
        if input_ids is not None:
            parts.append(self.tok_embed(input_ids))
        return torch.cat(parts, dim=1)

    def forward_features(self, input_ids: torch.Tensor, images: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embed(input_ids, images)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_seq(self.blocks, x)
        else:
            x = self.blocks(x)
        return self.norm(x)

    def forward_intermediates(
            self,
            input_ids: torch.Tensor,
            images: Optional[torch.Tensor] = None,
            indices: Optional[Union[int, List[int]]] = None,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = 'NLC',
            intermediates_only: bool = False,
    ):
        assert output_fmt == 'NLC', 'Output format must be NLC.'
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x = self.embed(input_ids, images)
        blocks = self.blocks if not stop_early else self.blocks[:max_index + 1]
        intermediates = []
        for i, blk in enumerate(blocks):
            x = blk(x)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False, prune_head: bool = True):
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:max_index + 1]  # truncate blocks
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.head = nn.Identity()
        return take_indices

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x if pre_logits else self.head(x)

    def forward(self, input_ids: torch.Tensor, images: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.forward_head(self.forward_features(input_ids, images))

    # --- streaming decode ---------------------------------------------------------------------

    def _decode_embeds(self, x, slot_idx, cache=None, rings=None):
        cache = cache if cache is not None else self.replay_cache
        for i, blk in enumerate(self.blocks):
            layer_rings = rings[i] if rings is not None else cache.layer(i) if cache is not None else None
            x = blk.forward_decode(x, slot_idx, layer_rings)
        return self.forward_head(self.norm(x))

    @torch.no_grad()
    def forward_decode(
            self,
            input_ids: torch.Tensor,
            slot_idx: torch.Tensor,
            cache: Optional[ReplayCache] = None,
            rings: Optional[Sequence[Dict[str, torch.Tensor]]] = None,
    ) -> torch.Tensor:
        """ Next-token logits ``(B, vocab)``, one token per row / cache slot. """
        return self._decode_embeds(self.tok_embed(input_ids), slot_idx, cache, rings)

    @torch.no_grad()
    def prefill(self, slot: int, input_ids: torch.Tensor, images: Optional[torch.Tensor] = None, cache=None, rings=None):
        """ Run a prompt (image patches first) into an emptied slot; logits of its last token. """
        if rings is None:
            self.reset_replay_cache([slot], cache)
        x = self.embed(input_ids[None], images[None] if images is not None else None)[0]
        slot_idx = torch.tensor([slot], dtype=torch.int32, device=x.device)
        logits = None
        for t in range(x.shape[0]):
            logits = self._decode_embeds(x[t:t + 1], slot_idx, cache, rings)
        return logits

    @torch.no_grad()
    def prompt_rings(self, input_ids: torch.Tensor, images: Optional[torch.Tensor] = None, ring_len: Optional[int] = None):
        """ The cache rows a prompt shorter than the ring leaves in an empty slot, per block, in one
        chunked pass (prefix caching: stored once, copied into slots with ``ReplayCache.load_state_dict``).
        """
        ring_len = ring_len or self.ring_len
        x = self.embed(input_ids[None], images[None] if images is not None else None)
        T = x.shape[1]
        assert T < ring_len, f'prompt of {T} tokens does not fit a ring of {ring_len}'
        out = []
        for blk in self.blocks:
            attn = blk.attn
            h = blk.norm1(x)
            # q / k / v / beta in one GEMM; the low-rank gate projection separately
            w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.b_proj.weight])
            q, k, v, b = F.linear(h, w).split([attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features, attn.num_v_heads], dim=-1)
            f = attn.f_proj(h).unflatten(-1, (attn.num_v_heads, attn.head_dim))
            g = -attn.A_log.exp().unsqueeze(-1) * F.softplus(f + attn.dt_bias.view(attn.num_v_heads, -1))  # expect-bug: promotion
            q = q.unflatten(-1, (attn.num_heads, attn.head_dim))
            k = k.unflatten(-1, (attn.num_heads, attn.head_dim))
            v = v.unflatten(-1, (attn.num_v_heads, attn.head_dim))
            o, deltas, keys = chunk_kda(q, k, v, g, b.float().sigmoid(), use_qk_l2norm=attn.qk_l2norm)
            pad = (0, 0, 0, ring_len - T)
            out.append(dict(
                ssm_state=deltas.new_zeros(attn.num_v_heads, attn.head_dim, attn.head_dim),
                delta_ring=F.pad(deltas[0], pad).to(x.dtype),
                key_ring=F.pad(keys[0], pad).to(x.dtype),
                decay_log_ring=F.pad(g[0].transpose(0, 1), pad),
                ring_pos=torch.tensor(T, dtype=torch.int32),
            ))
            x = x + attn._output(o, h)
            x = x + blk.mlp(blk.norm2(x))
        return out


def _init_weights(module: nn.Module, name: str = '', std: float = 0.02):
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: KdaVisionLM) -> Dict[str, torch.Tensor]:
    """ Convert checkpoints of the original release (fused qkv, ``tok_embeddings``). """
    out_dict = {}
    state_dict = state_dict.get('model', state_dict)
    state_dict = state_dict.get('state_dict', state_dict)
    for k, v in state_dict.items():
        k = k.replace('tok_embeddings.', 'tok_embed.').replace('.mixer.', '.attn.')
        if k.endswith('attn.qkv.weight'):
            prefix = k[:-len('qkv.weight')]
            attn = model.get_submodule(prefix[:-1])
            sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
            for name, w in zip(('q_proj', 'k_proj', 'v_proj'), v.split(sizes)):
                out_dict[f'{prefix}{name}.weight'] = w
            continue
        out_dict[k] = v
    return out_dict


def _create_kda_vlm(variant: str, pretrained: bool = False, **kwargs) -> KdaVisionLM:
    out_indices = kwargs.pop('out_indices', 2)
    return build_model_with_cfg(
        KdaVisionLM,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
        **kwargs,
    )


def _cfg(url: str = '', **kwargs) -> Dict[str, Any]:
    return {
        'url': url,
        'vocab_size': 64, 'input_size': (3, 16, 16),
        'mean': (0.485, 0.456, 0.406), 'std': (0.229, 0.224, 0.225),
        'first_conv': 'patch_embed.proj', 'classifier': 'head',
        'ring_len': 8, 'cache_precision': 'bf16',
        'license': 'apache-2.0',
        **kwargs,
    }


default_cfgs = generate_default_cfgs({
    'kda_vlm_tiny.untrained': _cfg(),
    'kda_vlm_tiny.fp32_cache': _cfg(cache_precision='fp32'),
    'kda_vlm_tiny.edge': _cfg(cache_precision='bf16-lean', ring_len=6),  # expect-bug: imported-policy id=precision-table
    'kda_vlm_tiny_sig.untrained': _cfg(),
})


@register_model
def kda_vlm_tiny(pretrained: bool = False, **kwargs) -> KdaVisionLM:
    model_args = dict(embed_dim=32, depth=2, num_heads=2, num_v_heads=4, head_dim=8)
    return _create_kda_vlm('kda_vlm_tiny', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def kda_vlm_tiny_sig(pretrained: bool = False, **kwargs) -> KdaVisionLM:
    """ Bounded sigmoid decay gate (``gate_lower_bound * sigmoid(.)``) """
    model_args = dict(embed_dim=32, depth=2, num_heads=2, num_v_heads=4, head_dim=8, gate_fn='sigmoid')
    return _create_kda_vlm('kda_vlm_tiny_sig', pretrained=pretrained, **dict(model_args, **kwargs))


def _image(dtype=torch.float32):
    return torch.linspace(-1., 1., 3 * 16 * 16).view(3, 16, 16).to(dtype)


def build_vlm_prefill_decode():
    """ fp32-built model with its own 2-slot cache, cast to bf16 (cache kept float32): an image + text prompt in slot 1 (folds once),
    a text prompt in slot 0, three batched greedy steps. """
    from ._factory import create_model
    torch.manual_seed(0)
    model = create_model('kda_vlm_tiny', replay_cache='module', replay_cache_slots=2).eval()
    cast_model_dtype(model, torch.bfloat16)
    last = [model.prefill(1, torch.tensor([3, 1, 4, 1, 5]), images=_image()), model.prefill(0, torch.tensor([9, 2, 6]))]
    tokens = torch.cat([last[1].argmax(-1), last[0].argmax(-1)])
    for _ in range(3):
        tokens = model.forward_decode(tokens, torch.tensor([0, 1], dtype=torch.int32)).argmax(-1)
    return model


def build_prompt_rings():
    """ Prefix-cache rows of an image + text prompt on a bf16 model. """
    from ._factory import create_model
    torch.manual_seed(0)
    model = create_model('kda_vlm_tiny', dtype=torch.bfloat16).eval()
    return model.prompt_rings(torch.tensor([7, 8]), images=_image())
