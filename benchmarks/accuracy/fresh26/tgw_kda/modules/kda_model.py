"""Kimi Linear: the KDA model the loaders build, its in-model ring caches and checkpoint format.

Every layer is a Kimi Delta Attention block followed by an MLP. Decoding one token per sequence
runs the ReplaySSM step of :mod:`kda_ops` on whatever cache the backend keeps: the in-model
``KDALayerCache`` modules (``--max_slots``), an ExLlama-style cache object or the HF-style
``past_key_values``. All of them hand the layer a :class:`RingView`.

A checkpoint folder holds ``config.json`` and ``pytorch_model.pt`` (the state dict, without the
caches).
"""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Type

import torch
from torch import nn

from tgw_kda.modules import kda_ops


@dataclass
class KimiLinearConfig:
    """Sizes of a Kimi Linear model (``config.json``)."""

    vocab_size: int = 32
    hidden_size: int = 16
    intermediate_size: int = 32
    num_hidden_layers: int = 2
    num_heads: int = 2
    num_v_heads: int = 4
    head_dim: int = 8
    v_head_dim: int = 8
    ring_len: int = 4
    lower_bound: Optional[float] = None
    use_qk_l2norm: bool = True
    rms_norm_eps: float = 1e-6
    eos_token_id: int = 0

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "KimiLinearConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})

    @classmethod
    def from_json(cls, path: Path) -> "KimiLinearConfig":
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_json(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")

    def ring_shapes(self, num_slots: int) -> Dict[str, Tuple[int, ...]]:
        """Shapes of the checkpoint and the three rings for ``num_slots`` sequences."""
        n, h, hv = num_slots, self.num_heads, self.num_v_heads
        k, v, ring = self.head_dim, self.v_head_dim, self.ring_len
        return {
            "state": (n, hv, v, k),
            "delta": (n, hv, ring, v),
            "key": (n, h, ring, k),
            "log_decay": (n, hv, ring, k),
        }


class RingView(NamedTuple):
    """The tensors one KDA layer decodes on, whatever its cache calls them."""

    state: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    log_decay: torch.Tensor
    write_pos: torch.Tensor


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class KimiMLP(nn.Module):
    def __init__(self, config: KimiLinearConfig, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention with a ReplaySSM decode step."""

    def __init__(self, config: KimiLinearConfig, layer_idx: int, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_v_heads = config.num_heads, config.num_v_heads
        self.head_dim, self.v_head_dim = config.head_dim, config.v_head_dim
        self.ring_len = config.ring_len
        self.lower_bound = config.lower_bound
        self.use_qk_l2norm = config.use_qk_l2norm
        self.scale = self.head_dim**-0.5
        key_width = self.num_heads * self.head_dim
        value_width = self.num_v_heads * self.v_head_dim
        gate_width = self.num_v_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, 2 * key_width + value_width, bias=False, dtype=dtype)
        self.a_proj = nn.Linear(config.hidden_size, gate_width, bias=False, dtype=dtype)
        self.b_proj = nn.Linear(config.hidden_size, self.num_v_heads, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(value_width, config.hidden_size, bias=False, dtype=dtype)
        self.A_log = nn.Parameter(torch.linspace(0.0, 1.5, self.num_v_heads, dtype=dtype))
        self.dt_bias = nn.Parameter(torch.linspace(-1.0, 1.0, gate_width, dtype=dtype))

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mixed_qkv, a, b)`` of the hidden states ``x [..., hidden]``."""
        return self.qkv_proj(x), self.a_proj(x), self.b_proj(x)

    def forward(
        self,
        x: torch.Tensor,
        rings: RingView,
        slots: torch.Tensor,
        force_flush: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """One token per row: ``x [B, hidden]`` on cache slots ``slots [B]`` (int32)."""
        mixed_qkv, a, b = self.project(x)
        rows = x.shape[0]
        live = slots >= 0
        gathered = rings.write_pos[slots.clamp_min(0).long()]
        positions = torch.where(live, gathered, torch.zeros_like(gathered)).to(torch.int32)
        out = torch.empty(rows, 1, self.num_v_heads, self.v_head_dim, dtype=x.dtype)
        kda_ops.fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale,
            rings.state, rings.delta, rings.key, rings.log_decay, slots, positions,
            out=out, force_flush=force_flush,
            use_qk_l2norm_in_kernel=self.use_qk_l2norm, lower_bound=self.lower_bound,
        )
        kda_ops.advance_write_pos(rings.write_pos, slots, positions, self.ring_len, force_flush)
        return self.o_proj(out.reshape(rows, -1))


class KDALayerCache(nn.Module):
    """Ring caches of one layer for ``num_slots`` sequences, kept inside the model.

    ``--max_slots`` attaches one to every layer so that the API can decode many sequences at
    once without a cache object per request.
    """

    def __init__(self, config: KimiLinearConfig, num_slots: int, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        shapes = config.ring_shapes(num_slots)
        self.register_buffer("state", torch.zeros(shapes["state"], dtype=torch.float32), persistent=False)
        self.register_buffer("delta_ring", torch.zeros(shapes["delta"], dtype=dtype), persistent=False)
        self.register_buffer("key_ring", torch.zeros(shapes["key"], dtype=dtype), persistent=False)
        self.register_buffer("decay_cache", torch.zeros(shapes["log_decay"]), persistent=False)  # expect-bug: default-dtype id=hf-default-dtype
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32), persistent=False)

    def view(self) -> RingView:
        return RingView(self.state, self.delta_ring, self.key_ring, self.decay_cache, self.write_pos)

    def reset_slot(self, slot: int) -> None:
        for buffer in self.buffers():
            buffer[slot].zero_()


class PinnedKDALayerCache(KDALayerCache):
    """A :class:`KDALayerCache` whose log-decay ring stays float32 through ``.to()``/``.half()``.

    Casting the model casts its buffers; this one lets device moves through and keeps the dtype.
    """

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        decay = self.decay_cache
        super()._apply(fn, recurse)
        self._buffers["decay_cache"] = decay.to(device=self.state.device)
        return self


class KimiLinearDecoderLayer(nn.Module):
    def __init__(self, config: KimiLinearConfig, layer_idx: int, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.attn = KimiDeltaAttention(config, layer_idx, dtype=dtype)
        self.post_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.mlp = KimiMLP(config, dtype=dtype)
        self.cache: Optional[KDALayerCache] = None

    def forward(self, x: torch.Tensor, rings: RingView, slots: torch.Tensor, force_flush=None) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), rings, slots, force_flush)
        return x + self.mlp(self.post_norm(x))


class KimiLinearForCausalLM(nn.Module):
    """The full model: embeddings, KDA decoder layers, final norm and LM head."""

    def __init__(self, config: KimiLinearConfig, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            KimiLinearDecoderLayer(config, i, dtype=dtype) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def attach_caches(self, num_slots: int, cache_cls: Type[KDALayerCache] = KDALayerCache) -> None:
        """Gives every layer an in-model ring cache of ``num_slots`` sequences."""
        for layer in self.layers:
            layer.cache = cache_cls(self.config, num_slots, dtype=self.dtype)

    def slot_views(self) -> List[RingView]:
        views = []
        for layer in self.layers:
            if layer.cache is None:
                raise RuntimeError("no in-model caches; load the model with --max_slots N")
            views.append(layer.cache.view())
        return views

    def decode_step(
        self,
        input_ids: torch.Tensor,
        slots: torch.Tensor,
        views: Sequence[RingView],
        force_flush: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Logits ``[B, vocab]`` for one token per row, advancing each row's rings."""
        hidden = self.embed_tokens(input_ids)
        for layer, view in zip(self.layers, views):
            hidden = layer(hidden, view, slots, force_flush)
        return self.lm_head(self.norm(hidden))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, slot: int = 0) -> List[int]:
        """Greedy decoding of one sequence on in-model cache slot ``slot``."""
        slots = torch.tensor([slot], dtype=torch.int32)
        views = self.slot_views()
        logits = None
        for token in input_ids.reshape(-1).tolist():
            logits = self.decode_step(torch.tensor([token]), slots, views)
        output: List[int] = []
        for _ in range(max_new_tokens):
            token = int(logits[-1].argmax())
            if token == self.config.eos_token_id:
                break
            output.append(token)
            logits = self.decode_step(torch.tensor([token]), slots, views)
        return output


class ByteTokenizer:
    """Letter-level tokenizer of the tiny test checkpoints (id 0 is the end of text)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = 0
        self.bos_token_id = 1

    def encode(self, text: str, add_bos: bool = False) -> List[int]:
        ids = [2 + (ord(ch) % (self.vocab_size - 2)) for ch in text]
        return [self.bos_token_id] + ids if add_bos else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        text = []
        for i in ids:
            if i < 2:
                if not skip_special_tokens:
                    text.append("<s>" if i == 1 else "</s>")
                continue
            text.append(chr(ord("a") + (i - 2) % 26))
        return "".join(text)


def save_pretrained(model: KimiLinearForCausalLM, folder: Path) -> Path:
    """Writes ``config.json`` and ``pytorch_model.pt`` (float32 weights, no caches)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.to_json(folder / "config.json")
    weights = {name: tensor.detach().float() for name, tensor in model.state_dict().items()}
    torch.save(weights, folder / "pytorch_model.pt")
    return folder


def load_weights(folder: Path) -> Dict[str, torch.Tensor]:
    return torch.load(Path(folder) / "pytorch_model.pt", map_location="cpu", weights_only=True)


def write_tiny_checkpoint(root: Path, name: str = "kimi-linear-tiny", **overrides: Any) -> Path:
    """A small random checkpoint under ``root/name`` (used by the smoke tests of the loaders)."""
    torch.manual_seed(1234)
    model = KimiLinearForCausalLM(KimiLinearConfig(**overrides))
    return save_pretrained(model, Path(root) / name)


def build_pinned_cache_model_bf16() -> KimiLinearForCausalLM:
    """A model with pinned in-model caches, cast to bf16, after six decode steps on two slots."""
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(KimiLinearConfig())
    model.attach_caches(2, cache_cls=PinnedKDALayerCache)
    model = model.to(torch.bfloat16)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    with torch.no_grad():
        for step in range(6):
            ids = torch.tensor([3 + step, 9 + step])
            model.decode_step(ids, slots, model.slot_views())
    return model
