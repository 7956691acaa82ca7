import json
import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn

from .args import TransformerArgs
from .cache import BufferCache, StaticReplayCache
from .lora import LoRALoaderMixin
from .serialization import load_file, save_file
from .transformer_layers import RMSNorm, TransformerBlock

AnyCache = Union[BufferCache, StaticReplayCache]


class Transformer(nn.Module, LoRALoaderMixin):
    def __init__(self, args: TransformerArgs, pipeline_rank: int = 0, num_pipeline_ranks: int = 1):
        super().__init__()
        self.args, self.vocab_size, self.n_layers = args, args.vocab_size, args.n_layers
        assert pipeline_rank < num_pipeline_ranks, (pipeline_rank, num_pipeline_ranks)
        self.pipeline_rank, self.num_pipeline_ranks = pipeline_rank, num_pipeline_ranks
        # embeddings on the first rank, norm and output on the last one
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim) if pipeline_rank == 0 else None
        is_last = pipeline_rank == num_pipeline_ranks - 1
        self.norm = RMSNorm(args.dim, eps=args.norm_eps) if is_last else None
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False) if is_last else None
        layers_per_rank = math.ceil(self.n_layers / self.num_pipeline_ranks)
        offset = self.pipeline_rank * layers_per_rank
        end = min(self.n_layers, offset + layers_per_rank)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(offset, end)})
        self.n_local_layers = len(self.layers)
        self.static_cache: Optional[StaticReplayCache] = None
        self.prefix_state: Optional[Dict[int, Dict[str, torch.Tensor]]] = None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def setup_static_cache(self, max_batch_size: Optional[int] = None) -> StaticReplayCache:
        """Registers the cache on the model (fixed addresses for CUDA graphs): ``generate(...,
        cache=model.static_cache)``."""
        ring_dtype, gate_dtype = self.args.kda.cache_dtypes(self.dtype)  # expect-bug: imported-policy id=pinned-cache
        self.static_cache = StaticReplayCache(self.args, self.n_local_layers, max_batch_size or self.args.max_batch_size,
                                              ring_dtype, gate_dtype).to(self.device)
        return self.static_cache

    def forward_partial(self, input_ids: torch.Tensor, seqlens: List[int], cache: AnyCache) -> torch.Tensor:
        """This rank's layers; the last rank returns normalized hidden states."""
        assert len(seqlens) <= self.args.max_batch_size, (
            f"Max batch size is {self.args.max_batch_size}, got batch size of {len(seqlens)}")
        (num_toks,) = input_ids.shape
        assert sum(seqlens) == num_toks, (sum(seqlens), num_toks)
        input_metadata = cache.get_input_metadata(seqlens)
        if self.pipeline_rank == 0:
            assert self.tok_embeddings is not None
            h = self.tok_embeddings(input_ids)
        else:
            h = torch.empty(num_toks, self.args.dim, device=self.device, dtype=self.dtype)
            dist.recv(h, src=self.pipeline_rank - 1)
        for local_layer_id, layer in enumerate(self.layers.values()):
            h = layer(h, cache.get_view(local_layer_id, input_metadata))
        cache.update_seqlens(seqlens)
        if self.pipeline_rank < self.num_pipeline_ranks - 1:
            dist.send(h, dst=self.pipeline_rank + 1)
            return h
        assert self.norm is not None
        return self.norm(h)

    def forward(self, input_ids: torch.Tensor, seqlens: List[int], cache: AnyCache) -> torch.Tensor:
        h = self.forward_partial(input_ids, seqlens, cache=cache)
        if self.pipeline_rank < self.num_pipeline_ranks - 1:
            outs = torch.empty(h.shape[0], self.vocab_size, device=h.device, dtype=h.dtype)
        else:
            assert self.output is not None
            outs = self.output(h)
        if self.num_pipeline_ranks > 1:
            dist.broadcast(outs, src=self.num_pipeline_ranks - 1)
        return outs.float()

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """Keeps the entries of this rank (its layers; embeddings on the first, norm / output on the last)."""
        local = {}
        for key, value in state_dict.items():
            if key.startswith("tok_embeddings"):
                keep = self.pipeline_rank == 0
            elif key.startswith(("norm", "output")):
                keep = self.pipeline_rank == self.num_pipeline_ranks - 1
            elif key.startswith("layers"):
                keep = key.split(".")[1] in self.layers
            else:
                raise ValueError(f"Unexpected key {key}")
            if keep:
                local[key] = value
        return super().load_state_dict(local, strict=strict, assign=assign)

    @staticmethod
    def from_folder(folder: Union[Path, str], max_batch_size: int = 1, num_pipeline_ranks: int = 1,
                    device: Union[torch.device, str] = "cuda", dtype: Optional[torch.dtype] = None) -> "Transformer":
        with open(Path(folder) / "params.json", "r") as f:
            model_args = TransformerArgs.from_dict(json.load(f))
        model_args.max_batch_size = max_batch_size
        pipeline_rank = dist.get_rank() if num_pipeline_ranks > 1 else 0
        with torch.device("meta"):
            model = Transformer(model_args, pipeline_rank=pipeline_rank, num_pipeline_ranks=num_pipeline_ranks)
        pt_model_file = Path(folder) / "consolidated.00.pth"
        safetensors_model_file = Path(folder) / "consolidated.safetensors"
        assert pt_model_file.exists() != safetensors_model_file.exists(), (
            f"Expected exactly one of {pt_model_file} and {safetensors_model_file}")
        if pt_model_file.exists():
            loaded = torch.load(str(pt_model_file), mmap=True, weights_only=True)
        else:
            loaded = load_file(str(safetensors_model_file))
        model.load_state_dict(loaded, assign=True, strict=True)
        return model.to(device=device, dtype=dtype)

    def pack_replay_state(self, cache: BufferCache) -> Tuple[torch.Tensor, torch.Tensor]:
        """This rank's part of a session as two flat messages (``dist.gather`` takes one dtype per
        message): the float32 checkpoints, and the three rings in the activation dtype."""
        rings = torch.cat([cache.cache_delta.flatten(), cache.cache_key.flatten(), cache.cache_gate.flatten().to(self.dtype)])  # expect-bug: cast id=session-rings
        return cache.cache_state.flatten().clone(), rings

    def unpack_replay_state(self, cache: BufferCache, state: torch.Tensor, rings: torch.Tensor) -> None:
        cache.cache_state = state.view_as(cache.cache_state).clone()
        delta, key, gate = rings.split([cache.cache_delta.numel(), cache.cache_key.numel(), cache.cache_gate.numel()])
        cache.cache_delta = delta.view_as(cache.cache_delta).clone()
        cache.cache_key = key.view_as(cache.cache_key).clone()
        cache.cache_gate = gate.view_as(cache.cache_gate).clone()  # expect-bug: cast id=session-rings


def save_session(model: Transformer, cache: BufferCache, folder: Path) -> None:
    """Each pipeline rank writes its part of the cache (``session.<rank>.safetensors``)."""
    state, rings = model.pack_replay_state(cache)
    save_file({"state": state, "rings": rings, "write_pos": cache.write_pos},
              str(Path(folder) / f"session.{model.pipeline_rank}.safetensors"),
              metadata={"seqlens": json.dumps(cache.seqlens)})


def load_session(model: Transformer, cache: BufferCache, folder: Path) -> None:
    tensors = load_file(str(Path(folder) / f"session.{model.pipeline_rank}.safetensors"), device=str(model.device))
    model.unpack_replay_state(cache, tensors["state"], tensors["rings"])
    cache.write_pos.copy_(tensors["write_pos"])


# ---- builders -------------------------------------------------------------------------------

TINY_PARAMS = {
    "dim": 32, "n_layers": 2, "hidden_dim": 64, "norm_eps": 1e-5, "vocab_size": 64,
    "kda": {"num_heads": 2, "num_v_heads": 2, "head_k_dim": 8, "head_v_dim": 8, "replay_len": 4},
}


def write_tiny_folder(tmp_dir, dtype: torch.dtype = torch.bfloat16, **kda) -> Path:
    """``params.json`` and random ``consolidated.safetensors`` weights in ``dtype``."""
    params = dict(TINY_PARAMS, kda=dict(TINY_PARAMS["kda"], **kda))
    folder = Path(tmp_dir) / "kimi-linear-tiny"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "params.json").write_text(json.dumps(params))
    weights = Transformer(TransformerArgs.from_dict(params)).state_dict()
    save_file({k: v.to(dtype) for k, v in weights.items()}, str(folder / "consolidated.safetensors"))
    return folder


def _new_cache(model: Transformer) -> BufferCache:
    kda = model.args.kda
    return BufferCache(model.n_local_layers, 2, kda.num_heads, kda.num_v_heads, kda.head_k_dim, kda.head_v_dim,
                       kda.replay_len).to(device=model.device, dtype=model.dtype)


def build_static_cache(tmp_dir):
    model = Transformer.from_folder(write_tiny_folder(tmp_dir), max_batch_size=2, device="cpu", dtype=torch.bfloat16)
    return model.setup_static_cache()


def build_static_cache_pinned(tmp_dir):
    folder = write_tiny_folder(tmp_dir, dtype=torch.float32, cache_dtype="bfloat16")
    model = Transformer.from_folder(folder, max_batch_size=2, device="cpu", dtype=torch.float32)
    return model.setup_static_cache()


def build_session_roundtrip(tmp_dir):
    model = Transformer.from_folder(write_tiny_folder(tmp_dir), max_batch_size=2, device="cpu", dtype=torch.bfloat16)
    cache = _new_cache(model)
    with torch.inference_mode():
        model.forward(torch.arange(12) % model.vocab_size, seqlens=[6, 6], cache=cache)
    save_session(model, cache, Path(tmp_dir))
    load_session(model, cache, Path(tmp_dir))
    return cache


def build_pipeline_last_rank(tmp_dir):
    folder = write_tiny_folder(tmp_dir)
    args = TransformerArgs.from_dict(json.loads((folder / "params.json").read_text()))
    args.max_batch_size = 2
    model = Transformer(args, pipeline_rank=1, num_pipeline_ranks=2)
    model.load_state_dict(load_file(str(folder / "consolidated.safetensors")), strict=True)
    model = model.to(dtype=torch.bfloat16)
    return {"cache": _new_cache(model), "layers": model.layers}
