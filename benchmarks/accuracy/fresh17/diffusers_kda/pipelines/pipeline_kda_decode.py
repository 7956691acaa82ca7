"""KDADecodePipeline: batched ReplaySSM decoding with a [`KDATransformerModel`]."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import torch

from ..models.transformer_kda import KDATransformerModel, ReplayCaches, ReplayStateCache
from ..utils import BaseOutput, load_file, logging, save_file
from ..utils.torch_utils import randn_tensor, slot_index_tensor, torch_dtype_context
from .pipeline_utils import DiffusionPipeline

logger = logging.get_logger(__name__)

CACHE_NAMES = ("checkpoint_state", "delta_ring", "key_ring", "log_decay_ring")


@dataclass
class KDADecodePipelineOutput(BaseOutput):
    """
    Args:
        hidden_states (`torch.Tensor`): last hidden states of every slot, `(batch_size, hidden_size)`.
        replay_caches (`List`): the per-layer caches the call decoded with.
    """

    hidden_states: torch.Tensor
    replay_caches: Optional[List[Any]] = None


class KDADecodePipeline(DiffusionPipeline):
    r"""Decodes ``num_inference_steps`` tokens for a batch of slots.

    Args:
        transformer ([`KDATransformerModel`]): the model.
        prefix_cache ([`ReplayStateCache`], *optional*): caches of a shared prompt prefix, copied into
            fresh slots by [`~KDADecodePipeline.start_from_prefix`].
    """

    model_cpu_offload_seq = "transformer"
    _optional_components = ["prefix_cache"]

    def __init__(self, transformer: KDATransformerModel, prefix_cache: Optional[ReplayStateCache] = None) -> None:
        super().__init__()
        self.register_modules(transformer=transformer, prefix_cache=prefix_cache)

    # -- inputs ------------------------------------------------------------------------------

    def prepare_latents(self, batch_size, hidden_size, dtype, device, generator=None, latents=None) -> torch.Tensor:
        shape = (batch_size, hidden_size)
        if isinstance(generator, list) and len(generator) != batch_size:
            raise ValueError(f"You have passed a list of generators of length {len(generator)}, but requested a batch size of {batch_size}.")
        if latents is None:
            return randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        return latents.to(device=device, dtype=dtype)

    def prepare_replay_caches(self, num_slots: int, device=None) -> List[ReplayCaches]:
        """Fresh per-layer caches, each allocated in the dtype the transformer asks for."""
        device = device or self._execution_device
        shapes = self.transformer.replay_cache_shapes(num_slots)
        dtypes = self.transformer.replay_cache_dtypes
        caches = []
        for _ in range(self.transformer.config.num_layers):
            tensors = {name: torch.zeros(shape, dtype=dtypes[name], device=device) for name, shape in shapes.items()}
            caches.append(ReplayCaches(**tensors, write_pos=torch.zeros(num_slots, dtype=torch.int32, device=device)))
        return caches

    def prepare_draft_caches(self, num_slots: int, device=None) -> List[ReplayCaches]:
        """Scratch caches for speculative drafts, created in the transformer's dtype."""
        device = device or self._execution_device
        shapes = self.transformer.replay_cache_shapes(num_slots)
        caches = []
        with torch_dtype_context(self.transformer.dtype):  # expect-bug: default-dtype id=draft-dtype
            for _ in range(self.transformer.config.num_layers):
                caches.append(
                    ReplayCaches(
                        checkpoint_state=torch.zeros(shapes["checkpoint_state"], device=device),
                        delta_ring=torch.zeros(shapes["delta_ring"], device=device),
                        key_ring=torch.zeros(shapes["key_ring"], device=device),
                        log_decay_ring=torch.zeros(shapes["log_decay_ring"], device=device),  # expect-bug: default-dtype id=draft-dtype
                        write_pos=torch.zeros(num_slots, dtype=torch.int32, device=device),
                    )
                )
        return caches

    def start_from_prefix(self, caches: List[Any], slots: List[int]) -> None:
        """Copies the prefix caches into ``slots`` of every layer (same prefix for every layer here)."""
        if self.prefix_cache is None:
            raise ValueError("the pipeline has no `prefix_cache`")
        for layer in caches:
            for slot in slots:
                for name in CACHE_NAMES:
                    getattr(layer, name)[slot].copy_(getattr(self.prefix_cache, name)[0])
                layer.write_pos[slot] = self.prefix_cache.write_pos[0]

    # -- replay state I/O --------------------------------------------------------------------

    @staticmethod
    def export_replay_state(caches: List[Any]) -> List[Dict[str, torch.Tensor]]:
        return [{name: getattr(layer, name).detach().clone() for name in (*CACHE_NAMES, "write_pos")} for layer in caches]

    def adopt_replay_state(self, replay_state: List[Dict[str, torch.Tensor]], device=None) -> List[ReplayCaches]:
        """Caches for this pipeline's transformer from state exported by another pipeline."""
        device = device or self._execution_device
        dtype = self.transformer.dtype
        caches = []
        for layer in replay_state:
            caches.append(
                ReplayCaches(
                    checkpoint_state=layer["checkpoint_state"].to(device=device, dtype=dtype),
                    delta_ring=layer["delta_ring"].to(device=device, dtype=dtype),
                    key_ring=layer["key_ring"].to(device=device, dtype=dtype),
                    log_decay_ring=layer["log_decay_ring"].to(device=device, dtype=dtype),  # expect-bug: cast
                    write_pos=layer["write_pos"].to(device=device),
                )
            )
        return caches

    def save_replay_state(self, caches: List[Any], save_path: Union[str, os.PathLike], variant: Optional[str] = None) -> None:
        """Writes the caches to one file; ``variant="fp16"`` stores the floating caches in float16."""
        tensors = {}
        for index, layer in enumerate(caches):
            for name in (*CACHE_NAMES, "write_pos"):
                tensor = getattr(layer, name).detach().cpu()
                if variant == "fp16" and tensor.is_floating_point():
                    tensor = tensor.to(torch.float16)
                tensors[f"{index}.{name}"] = tensor
        save_file(tensors, os.fspath(save_path), metadata={"variant": variant or "default"})

    def restore_replay_state(self, save_path: Union[str, os.PathLike], caches: Optional[List[Any]] = None) -> List[Any]:
        """Reads a file written by ``save_replay_state``: into ``caches`` when given (each cache keeps
        its dtype), else into new caches in the transformer's dtype."""
        tensors = load_file(os.fspath(save_path))
        num_layers = 1 + max(int(key.split(".", 1)[0]) for key in tensors)
        if caches is not None:
            for index, layer in enumerate(caches):
                for name in (*CACHE_NAMES, "write_pos"):
                    getattr(layer, name).copy_(tensors[f"{index}.{name}"])
            return caches
        dtype, device = self.transformer.dtype, self._execution_device
        restored = []
        for index in range(num_layers):
            restored.append(
                ReplayCaches(
                    checkpoint_state=tensors[f"{index}.checkpoint_state"].to(device=device, dtype=dtype),
                    delta_ring=tensors[f"{index}.delta_ring"].to(device=device, dtype=dtype),
                    key_ring=tensors[f"{index}.key_ring"].to(device=device, dtype=dtype),
                    log_decay_ring=tensors[f"{index}.log_decay_ring"].to(device=device),  # expect-bug: load
                    write_pos=tensors[f"{index}.write_pos"].to(device=device, dtype=torch.int32),
                )
            )
        return restored

    # -- call --------------------------------------------------------------------------------

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 2,
        num_inference_steps: int = 2,
        generator: Optional[Union[torch.Generator, List[torch.Generator]]] = None,
        latents: Optional[torch.Tensor] = None,
        replay_caches: Optional[List[Any]] = None,
        slot_ids: Optional[torch.Tensor] = None,
        flush_every: Optional[int] = None,
        return_dict: bool = True,
    ) -> Union[KDADecodePipelineOutput, tuple]:
        r"""
        Args:
            batch_size (`int`): rows decoded per step.
            num_inference_steps (`int`): tokens to decode.
            generator: makes the initial hidden states reproducible.
            latents (`torch.Tensor`, *optional*): initial hidden states.
            replay_caches (*optional*): per-layer caches; the transformer's built-in caches by default.
            slot_ids (`torch.Tensor`, *optional*): the slot of each row (``int32``, ``-1`` for padding).
            flush_every (`int`, *optional*): force a checkpoint every ``flush_every`` steps.
        """
        device = self._execution_device
        dtype = self.transformer.dtype
        hidden_size = self.transformer.config.hidden_size
        latents = self.prepare_latents(batch_size, hidden_size, dtype, device, generator, latents)
        if slot_ids is None:
            slot_ids = slot_index_tensor(batch_size, device=device)
        for step in self.progress_bar(range(num_inference_steps)):
            force_flush = None
            if flush_every:
                force_flush = torch.full_like(slot_ids, int((step + 1) % flush_every == 0))
            latents = self.transformer(latents, slot_ids, replay_caches=replay_caches, force_flush=force_flush).sample
        self.maybe_free_model_hooks()
        caches = list(replay_caches) if replay_caches is not None else list(self.transformer.replay_caches)
        if not return_dict:
            return (latents, caches)
        return KDADecodePipelineOutput(hidden_states=latents, replay_caches=caches)


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------


def _bf16_pipeline(num_slots: int = 2, **pipeline_kwargs: Any) -> KDADecodePipeline:
    transformer = KDATransformerModel(num_slots=num_slots).to(torch.bfloat16)
    return KDADecodePipeline(transformer=transformer, **pipeline_kwargs)


def build_decode_pipeline():
    """bf16 pipeline with the transformer's built-in caches, moved, offloaded between calls and run twice."""
    torch.manual_seed(0)
    pipe = _bf16_pipeline(num_slots=3)
    pipe.to("cpu")
    pipe.enable_model_cpu_offload(device="cpu")
    generator = torch.Generator().manual_seed(0)
    first = pipe(batch_size=3, num_inference_steps=2, generator=generator, flush_every=2)
    second = pipe(latents=first.hidden_states, batch_size=3, num_inference_steps=1)
    return {"pipeline": pipe, "output": second}


def build_offloaded_pipeline():
    """A bf16 pipeline with a float32 prompt-prefix cache, converted as a whole and offloaded compactly."""
    torch.manual_seed(0)
    transformer = KDATransformerModel(num_slots=2)
    prefix_cache = ReplayStateCache(1, 2, 4, 8, transformer.config.ring_len)
    pipe = KDADecodePipeline(transformer=transformer, prefix_cache=prefix_cache)
    pipe.to(torch.bfloat16)
    pipe.enable_model_cpu_offload(device="cpu", host_dtype=torch.bfloat16)
    pipe.start_from_prefix(list(transformer.replay_caches), slots=[1])
    output = pipe(batch_size=2, num_inference_steps=2, generator=torch.Generator().manual_seed(0))
    return {"pipeline": pipe, "output": output}


def build_draft_pipeline():
    """Fresh external caches for the main decode and speculative draft caches, both decoded with."""
    torch.manual_seed(0)
    pipe = _bf16_pipeline()
    caches = pipe.prepare_replay_caches(2)
    main = pipe(batch_size=2, num_inference_steps=2, replay_caches=caches, generator=torch.Generator().manual_seed(0))
    drafts = pipe.prepare_draft_caches(2)
    draft = pipe(latents=main.hidden_states, batch_size=2, num_inference_steps=1, replay_caches=drafts)
    return {"main": main, "draft": draft}


def build_warm_started_pipeline(tmp_dir):
    """Decode in a float32 pipeline, continue in a bf16 one, and round-trip an fp16 state file."""
    torch.manual_seed(0)
    source = KDADecodePipeline(transformer=KDATransformerModel(num_slots=2))
    warm = source(batch_size=2, num_inference_steps=2, generator=torch.Generator().manual_seed(0))
    target = _bf16_pipeline()
    adopted = target.adopt_replay_state(target.export_replay_state(warm.replay_caches))
    continued = target(latents=warm.hidden_states, batch_size=2, num_inference_steps=1, replay_caches=adopted)
    path = os.path.join(tmp_dir, "replay_state.safetensors")
    target.save_replay_state(adopted, path, variant="fp16")
    restored = target.restore_replay_state(path)
    resumed = target(latents=continued.hidden_states, batch_size=2, num_inference_steps=1, replay_caches=restored)
    return {"continued": continued, "resumed": resumed}


def build_restored_pipeline(tmp_dir):
    """Checkpoint a bf16 pipeline's caches to an fp16 file and restore them into the live caches."""
    torch.manual_seed(0)
    pipe = _bf16_pipeline()
    first = pipe(batch_size=2, num_inference_steps=3, generator=torch.Generator().manual_seed(0), flush_every=3)
    path = os.path.join(tmp_dir, "replay_state.safetensors")
    pipe.save_replay_state(first.replay_caches, path, variant="fp16")
    pipe(latents=first.hidden_states, batch_size=2, num_inference_steps=1)
    restored = pipe.restore_replay_state(path, caches=list(pipe.transformer.replay_caches))
    source = KDADecodePipeline(transformer=KDATransformerModel(num_slots=2))
    adopted = source.adopt_replay_state(source.export_replay_state(restored))
    return {"pipeline": pipe, "restored": restored, "adopted": adopted}
