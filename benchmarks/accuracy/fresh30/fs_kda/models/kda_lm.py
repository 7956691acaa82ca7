"""The KDA language model: a decoder-only stack of Kimi Delta Attention layers."""

import argparse
import logging
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fs_kda import utils
from fs_kda.dataclass.configs import IncrementalStateConfig, SlotPoolConfig
from fs_kda.models import (
    FairseqIncrementalDecoder,
    FairseqLanguageModel,
    register_model,
    register_model_architecture,
)
from fs_kda.modules.kimi_delta_attention import KimiDeltaAttention, LayerShape
from fs_kda.modules.slot_state_pool import SlotStatePool

logger = logging.getLogger(__name__)

DEFAULT_MAX_TARGET_POSITIONS = 1024


class KDADecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(ln(x))``, then ``x + ffn(ln(x))``."""

    def __init__(self, args: argparse.Namespace):
        super().__init__()
        self.embed_dim = args.decoder_embed_dim
        self.self_attn = KimiDeltaAttention(
            self.embed_dim,
            num_heads=args.decoder_kda_heads,
            num_v_heads=args.decoder_kda_v_heads,
            head_dim=args.decoder_kda_head_dim,
            v_head_dim=args.decoder_kda_v_head_dim,
            ring_len=args.ring_len,
            lower_bound=args.kda_gate_lower_bound,
            state_config=IncrementalStateConfig.from_args(args),
        )
        self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim)
        self.fc1 = nn.Linear(self.embed_dim, args.decoder_ffn_embed_dim)
        self.fc2 = nn.Linear(args.decoder_ffn_embed_dim, self.embed_dim)
        self.final_layer_norm = nn.LayerNorm(self.embed_dim)

    def forward(self, x: Tensor, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None) -> Tensor:
        residual = x
        x = self.self_attn(self.self_attn_layer_norm(x), incremental_state=incremental_state)
        x = residual + x
        residual = x
        x = self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
        return residual + x

    def forward_slots(self, x: Tensor, cache: nn.Module, slots: Tensor, force_flush: Optional[Tensor] = None) -> Tensor:
        x = x + self.self_attn.step_slots(self.self_attn_layer_norm(x), cache, slots, force_flush)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class KDADecoder(FairseqIncrementalDecoder):
    def __init__(self, args: argparse.Namespace, embed_tokens: nn.Embedding):
        super().__init__(args.pad)
        self.args = args
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if args.no_scale_embedding else math.sqrt(args.decoder_embed_dim)
        self.max_target_positions = args.max_target_positions
        self.layers = nn.ModuleList([KDADecoderLayer(args) for _ in range(args.decoder_layers)])
        self.layer_norm = nn.LayerNorm(args.decoder_embed_dim)
        self.output_projection = nn.Linear(args.decoder_embed_dim, embed_tokens.num_embeddings, bias=False)
        if args.share_decoder_input_output_embed:
            self.output_projection.weight = self.embed_tokens.weight
        self.slot_pool: Optional[SlotStatePool] = None
        if getattr(args, "max_slots", 0) > 0:
            # streaming checkpoints carry their pool so that .to()/.cuda() move it with the model
            self.attach_slot_pool(SlotStatePool(SlotPoolConfig.from_args(args), self.layer_shapes()))

    # --- caches --------------------------------------------------------------------------

    def layer_shapes(self) -> List[LayerShape]:
        return [layer.self_attn.layer_shape for layer in self.layers]

    def set_state_config(self, cfg: IncrementalStateConfig) -> None:
        for layer in self.layers:
            layer.self_attn.state_config = cfg

    def attach_slot_pool(self, pool: SlotStatePool) -> None:
        if len(pool.layers) != len(self.layers):
            raise ValueError(f"the pool has {len(pool.layers)} layers, the decoder {len(self.layers)}")
        self.slot_pool = pool

    def incremental_buffers(
        self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]]
    ) -> List[Dict[str, Optional[Tensor]]]:
        """Each layer's buffer dict (the objects stored in ``incremental_state``)."""
        return [layer.self_attn._get_input_buffer(incremental_state) for layer in self.layers]

    def allocate_incremental_state(
        self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], bsz: int, dtype: torch.dtype
    ) -> None:
        """Pre-allocates the buffers of every layer for ``bsz`` sequences (``--preallocate-state``)."""
        for layer in self.layers:
            attn = layer.self_attn
            shapes = attn.buffer_shapes(bsz)
            attn._set_input_buffer(
                incremental_state,
                {
                    "prev_state": torch.zeros(shapes["prev_state"], dtype=torch.float32),
                    "prev_delta": torch.zeros(shapes["prev_delta"], dtype=dtype),
                    "prev_key": torch.zeros(shapes["prev_key"], dtype=dtype),
                    "prev_log_decay": torch.zeros(shapes["prev_log_decay"]),  # expect-bug: default-dtype id=mem-eff-default
                    "write_pos": torch.zeros(bsz, dtype=torch.int32),
                },
            )

    def extend_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], extra: int) -> None:
        for layer in self.layers:
            layer.self_attn.extend_incremental_state(incremental_state, extra)

    def _num_steps(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]]) -> int:
        saved = self.get_incremental_state(incremental_state, "decoder_state")
        if saved is None or saved.get("num_steps") is None:
            return 0
        return int(saved["num_steps"])

    # --- forward -------------------------------------------------------------------------

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out=None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        features_only: bool = False,
        **kwargs,
    ) -> Tuple[Tensor, Dict[str, List[Optional[Tensor]]]]:
        x, extra = self.extract_features(prev_output_tokens, incremental_state=incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out=None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
    ) -> Tuple[Tensor, Dict[str, List[Optional[Tensor]]]]:
        seen = 0
        if incremental_state is not None:
            # like fairseq's decoders, only the tokens not seen yet are fed
            seen = self._num_steps(incremental_state)
            prev_output_tokens = prev_output_tokens[:, seen:]
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        inner_states: List[Optional[Tensor]] = [x]
        for layer in self.layers:
            x = layer(x, incremental_state)
            inner_states.append(x)
        x = self.layer_norm(x).transpose(0, 1)
        if incremental_state is not None:
            self.set_incremental_state(
                incremental_state, "decoder_state", {"num_steps": torch.tensor(seen + prev_output_tokens.size(1))}
            )
        return x, {"inner_states": inner_states}

    def output_layer(self, features: Tensor) -> Tensor:
        return self.output_projection(features)

    def forward_slots(self, tokens: Tensor, slots: Tensor, force_flush: Optional[Tensor] = None) -> Tensor:
        """Logits ``[B, V]`` of one token per row of ``tokens [B]``, on the slots ``slots [B]``."""
        if self.slot_pool is None:
            raise RuntimeError("forward_slots needs a slot pool (--max-slots > 0)")
        x = self.embed_scale * self.embed_tokens(tokens)
        for layer, cache in zip(self.layers, self.slot_pool.layers):
            x = layer.forward_slots(x, cache, slots, force_flush)
        return self.output_layer(self.layer_norm(x))

    def max_positions(self) -> int:
        return self.max_target_positions


@register_model("kda_lm")
class KDALanguageModel(FairseqLanguageModel):
    def __init__(self, decoder: KDADecoder, args: argparse.Namespace):
        super().__init__(decoder)
        self.args = args

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        """Add model-specific arguments to the parser."""
        # fmt: off
        parser.add_argument('--decoder-embed-dim', type=int, metavar='N', help='decoder embedding dimension')
        parser.add_argument('--decoder-ffn-embed-dim', type=int, metavar='N', help='decoder embedding dimension for FFN')
        parser.add_argument('--decoder-layers', type=int, metavar='N', help='num decoder layers')
        parser.add_argument('--decoder-kda-heads', type=int, metavar='N', help='num query/key heads')
        parser.add_argument('--decoder-kda-v-heads', type=int, metavar='N', help='num value heads')
        parser.add_argument('--decoder-kda-head-dim', type=int, metavar='N', help='query/key head dimension')
        parser.add_argument('--decoder-kda-v-head-dim', type=int, metavar='N', help='value head dimension')
        parser.add_argument('--kda-gate-lower-bound', type=float, metavar='LB', help='bounded gate: log-decays in [LB, 0]')
        parser.add_argument('--ring-len', type=int, metavar='L', help='rows of the ReplaySSM rings')
        parser.add_argument('--max-slots', type=int, metavar='N', help='slots of the streaming pool (0: none)')
        parser.add_argument('--cache-dtype', type=str, metavar='DTYPE', help='storage of the delta/key rings')
        parser.add_argument('--log-decay-cache-dtype', type=str, metavar='DTYPE', help='storage of the log-decay ring')
        parser.add_argument('--share-decoder-input-output-embed', action='store_true', help='share decoder input and output embeddings')
        parser.add_argument('--no-scale-embedding', action='store_true', help='if True, dont scale embeddings')
        parser.add_argument('--vocab-size', type=int, metavar='N', help='size of the (toy) vocabulary')
        # fmt: on

    @classmethod
    def build_model(cls, args: argparse.Namespace, task=None) -> "KDALanguageModel":
        """Build a new model instance."""
        base_architecture(args)
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        embed_tokens = nn.Embedding(args.vocab_size, args.decoder_embed_dim, padding_idx=args.pad)
        return cls(KDADecoder(args, embed_tokens), args)

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.embed_tokens.weight.dtype

    def prepare_for_inference_(self, args: argparse.Namespace) -> None:
        """Applies the generation-time precision flags to the decode caches."""
        merged = utils.merge_args(self.args, args)
        self.decoder.set_state_config(IncrementalStateConfig.from_args(merged))
        if getattr(merged, "max_slots", 0) > 0 and self.decoder.slot_pool is None:
            self.decoder.attach_slot_pool(SlotStatePool(SlotPoolConfig.from_args(merged), self.decoder.layer_shapes()))
        super().prepare_for_inference_(args)


@register_model_architecture("kda_lm", "kda_lm")
def base_architecture(args: argparse.Namespace) -> None:
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 512)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 2048)
    args.decoder_layers = getattr(args, "decoder_layers", 6)
    args.decoder_kda_heads = getattr(args, "decoder_kda_heads", 8)
    args.decoder_kda_v_heads = getattr(args, "decoder_kda_v_heads", 8)
    args.decoder_kda_head_dim = getattr(args, "decoder_kda_head_dim", 64)
    args.decoder_kda_v_head_dim = getattr(args, "decoder_kda_v_head_dim", args.decoder_kda_head_dim)
    args.kda_gate_lower_bound = getattr(args, "kda_gate_lower_bound", None)
    args.ring_len = getattr(args, "ring_len", 64)
    args.max_slots = getattr(args, "max_slots", 0)
    args.cache_dtype = getattr(args, "cache_dtype", None)
    args.log_decay_cache_dtype = getattr(args, "log_decay_cache_dtype", None)
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", False)
    args.no_scale_embedding = getattr(args, "no_scale_embedding", False)
    args.vocab_size = getattr(args, "vocab_size", 32000)
    args.pad = getattr(args, "pad", 1)
    args.eos = getattr(args, "eos", 2)


@register_model_architecture("kda_lm", "kda_lm_tiny")
def kda_lm_tiny(args: argparse.Namespace) -> None:
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 32)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 64)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    args.decoder_kda_heads = getattr(args, "decoder_kda_heads", 2)
    args.decoder_kda_v_heads = getattr(args, "decoder_kda_v_heads", 4)
    args.decoder_kda_head_dim = getattr(args, "decoder_kda_head_dim", 8)
    args.ring_len = getattr(args, "ring_len", 4)
    args.vocab_size = getattr(args, "vocab_size", 24)
    base_architecture(args)


@register_model_architecture("kda_lm", "kda_lm_tiny_bounded")
def kda_lm_tiny_bounded(args: argparse.Namespace) -> None:
    args.kda_gate_lower_bound = getattr(args, "kda_gate_lower_bound", -5.0)
    kda_lm_tiny(args)


@register_model_architecture("kda_lm", "kda_lm_edge")
def kda_lm_edge(args: argparse.Namespace) -> None:
    """On-device variant: tied embeddings and every decode cache in half precision."""
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", True)
    args.cache_dtype = getattr(args, "cache_dtype", "float16")
    args.log_decay_cache_dtype = getattr(args, "log_decay_cache_dtype", args.cache_dtype)  # expect-bug: imported-policy id=edge-arch
    kda_lm_tiny(args)
