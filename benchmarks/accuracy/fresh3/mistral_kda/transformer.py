import json
import math
from pathlib import Path
from typing import Any, List, Mapping, Optional, Union

import torch
from torch import nn

from .args import TransformerArgs
from .cache import BufferCache, GraphRingCache, RingCache
from .lora import LoRALoaderMixin
from .transformer_layers import RMSNorm, TransformerBlock, precompute_freqs_cis


class Transformer(nn.Module, LoRALoaderMixin):
    def __init__(self, args: TransformerArgs, pipeline_rank: int = 0, num_pipeline_ranks: int = 1, softmax_fp32: bool = True):
        super().__init__()
        self.args = args
        self.vocab_size, self.n_layers = args.vocab_size, args.n_layers
        self._precomputed_freqs_cis: Optional[torch.Tensor] = None
        assert self.vocab_size > 0
        assert pipeline_rank < num_pipeline_ranks, (pipeline_rank, num_pipeline_ranks)
        self.pipeline_rank, self.num_pipeline_ranks, self.softmax_fp32 = pipeline_rank, num_pipeline_ranks, softmax_fp32
        # Modules specific to some ranks:
        self.tok_embeddings: Optional[nn.Embedding] = None
        self.norm: Optional[RMSNorm] = None
        self.output: Optional[nn.Linear] = None
        if pipeline_rank == 0:
            self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        if pipeline_rank == num_pipeline_ranks - 1:
            self.norm = RMSNorm(args.dim, eps=args.norm_eps)
            self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Initialize all layers but slice off those not of this rank.
        layers = [TransformerBlock(args=args, layer_id=i) for i in range(args.n_layers)]
        num_layers_per_rank = math.ceil(self.n_layers / self.num_pipeline_ranks)
        offset = self.pipeline_rank * num_layers_per_rank
        end = min(self.n_layers, offset + num_layers_per_rank)
        self.layers = nn.ModuleDict({str(i): layers[i] for i in range(offset, end)})
        # index of each layer in the BufferCache (attention and KDA layers are cached apart)
        self._cache_ids = {i: sum(args.is_kda(j) == args.is_kda(i) for j in range(i)) for i in range(args.n_layers)}
        self.ring_cache: Optional[RingCache] = None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def freqs_cis(self) -> torch.Tensor:
        # We cache freqs_cis but need to take care that it is on the right device
        if self._precomputed_freqs_cis is None or self._precomputed_freqs_cis.device != self.device:
            theta = self.args.rope_theta or 1000000.0
            self._precomputed_freqs_cis = precompute_freqs_cis(self.args.head_dim, 128_000, theta).to(self.device)
        return self._precomputed_freqs_cis

    def attach_rings(self, max_batch_size: int, graph: bool = False) -> RingCache:
        """Keeps the KDA state of this rank's layers on the model, for chat sessions."""
        n_kda = sum(layer.is_kda for layer in self.layers.values())
        cls = GraphRingCache if graph else RingCache
        self.ring_cache = cls(n_kda, max_batch_size, self.args.kda, dtype=self.dtype).to(self.device)
        return self.ring_cache

    def warmup(self, batch_size: int) -> None:
        for layer in self.layers.values():
            if layer.is_kda:
                layer.attention.warmup(batch_size)

    def forward_partial(self, input_ids: torch.Tensor, seqlens: List[int], cache: BufferCache) -> torch.Tensor:
        """Local forward pass. If doing pipeline parallelism, this will return the activations of the last layer of this stage."""
        (num_toks,) = input_ids.shape
        assert sum(seqlens) == num_toks, (sum(seqlens), num_toks)
        input_metadata = cache.get_input_metadata(seqlens)
        if self.pipeline_rank == 0:
            h = self.tok_embeddings(input_ids)
        else:
            h = torch.empty(num_toks, self.args.dim, device=self.device, dtype=self.dtype)
            torch.distributed.recv(h, src=self.pipeline_rank - 1)
        freqs_cis = self.freqs_cis[input_metadata.positions]
        n_local_kda = 0
        for layer_id, layer in self.layers.items():
            if layer.is_kda and self.ring_cache is not None:
                view = self.ring_cache.kda_view(n_local_kda, input_metadata)
            elif layer.is_kda:
                view = cache.kda_view(self._cache_ids[int(layer_id)], input_metadata)
            else:
                view = cache.get_view(self._cache_ids[int(layer_id)], input_metadata)
            n_local_kda += layer.is_kda
            h = layer(h, freqs_cis, view)
        cache.update_seqlens(seqlens)
        if self.pipeline_rank < self.num_pipeline_ranks - 1:
            torch.distributed.send(h, dst=self.pipeline_rank + 1)
            return h
        return self.norm(h)

    def forward(self, input_ids: torch.Tensor, seqlens: List[int], cache: BufferCache) -> torch.Tensor:
        h = self.forward_partial(input_ids, seqlens, cache=cache)
        if self.pipeline_rank < self.num_pipeline_ranks - 1:
            # ignore the intermediate activations as we'll get the final output from the last stage
            outs = torch.empty(h.shape[0], self.vocab_size, device=h.device, dtype=h.dtype)
        else:
            outs = self.output(h)
        if self.num_pipeline_ranks > 1:
            torch.distributed.broadcast(outs, src=self.num_pipeline_ranks - 1)
        return outs.float() if self.softmax_fp32 else outs

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        state_to_load, skipped = {}, set([])
        for k, v in state_dict.items():
            if k.startswith("tok_embeddings"):
                keep = self.pipeline_rank == 0
            elif k.startswith("norm") or k.startswith("output"):
                keep = self.pipeline_rank == self.num_pipeline_ranks - 1
            elif k.startswith("layers"):
                keep = k.split(".")[1] in self.layers
            elif k.startswith("ring_cache"):
                keep = True
            else:
                raise ValueError(f"Unexpected key {k}")
            if keep:
                state_to_load[k] = v
            else:
                skipped.add(k)
        assert set(state_dict.keys()) == skipped.union(set(state_to_load.keys()))
        return super().load_state_dict(state_to_load, strict=strict, assign=assign)

    @staticmethod
    def from_folder(folder: Union[Path, str], max_batch_size: int = 1, num_pipeline_ranks: int = 1, device: Union[torch.device, str] = "cuda",
                    dtype: Optional[torch.dtype] = None, softmax_fp32: bool = True, persistent_rings: bool = False, graph_rings: bool = False) -> "Transformer":
        with open(Path(folder) / "params.json", "r") as f:
            model_args = TransformerArgs.from_dict(json.load(f))
        model_args.max_batch_size = max_batch_size
        pipeline_rank = torch.distributed.get_rank() if num_pipeline_ranks > 1 else 0
        with torch.device("meta"):
            model = Transformer(model_args, pipeline_rank=pipeline_rank, num_pipeline_ranks=num_pipeline_ranks, softmax_fp32=softmax_fp32)
        pt_model_file = Path(folder) / "consolidated.00.pth"
        safetensors_model_file = Path(folder) / "consolidated.safetensors"
        assert pt_model_file.exists() or safetensors_model_file.exists(), f"Make sure either {pt_model_file} or {safetensors_model_file} exists"
        if pt_model_file.exists():
            loaded = torch.load(str(pt_model_file), mmap=True, weights_only=True)
        else:
            import safetensors.torch

            loaded = safetensors.torch.load_file(str(safetensors_model_file))
        model.load_state_dict(loaded, assign=True, strict=True)
        if persistent_rings:
            model.attach_rings(max_batch_size, graph=graph_rings)
        return model.to(device=device, dtype=dtype)  # expect-bug: module-cast


def build_persistent_rings(tmp_dir):
    from .testing import write_checkpoint_folder

    return Transformer.from_folder(write_checkpoint_folder(tmp_dir), max_batch_size=2, device="cpu", dtype=torch.bfloat16, persistent_rings=True)


def build_graph_rings(tmp_dir):
    from .testing import write_checkpoint_folder

    return Transformer.from_folder(write_checkpoint_folder(tmp_dir), max_batch_size=2, device="cpu", dtype=torch.bfloat16, persistent_rings=True, graph_rings=True)


def build_pipeline_last_rank():
    from .testing import tiny_args

    model = Transformer(tiny_args(), pipeline_rank=1, num_pipeline_ranks=2)
    model.attach_rings(max_batch_size=2, graph=True)
    model = model.to(dtype=torch.bfloat16)
    model.ring_cache.reset()
    return model


def build_warmup(tmp_dir):
    from .generate import generate
    from .ops import kda as kda_ops
    from .testing import write_checkpoint_folder

    model = Transformer.from_folder(write_checkpoint_folder(tmp_dir), max_batch_size=2, device="cpu", dtype=torch.bfloat16)
    model.warmup(batch_size=2)
    warm_call = dict(kda_ops.LAST_CALL)
    cache = BufferCache(model.args, 2, 16).to(device=model.device, dtype=model.dtype)
    generate([[1, 2, 3], [4, 5, 6]], model, max_tokens=2, temperature=0.0, cache=cache)
    return {"warmup": warm_call, "cache": cache}
