"""Prepares decode inputs for the KDA layers and runs the model and the sampler."""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from ..common.config import CacheConfig, DeviceConfig, LoadConfig, ModelConfig, ParallelConfig, SchedulerConfig
from ..common.logger import init_logger
from ..common.sequence import SamplerOutput, SequenceGroupMetadata
from ..modeling.model_loader import get_model
from ..modeling.sampler import Sampler, SamplingParams
from ..ops.replayssm import advance_write_pos
from .cache_engine import KDALayerCache

logger = init_logger(__name__)

_PAD_SLOT_ID = -1


@dataclass
class ModelInputForKDA:
    request_ids: List[str]
    input_tokens: torch.Tensor
    ssm_state_indices: torch.Tensor
    write_pos: torch.Tensor
    ring_kwargs: List[Dict[str, torch.Tensor]]
    sampling_params: List[SamplingParams]


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        parallel_config: ParallelConfig,
        scheduler_config: SchedulerConfig,
        device_config: DeviceConfig,
        cache_config: CacheConfig,
        load_config: LoadConfig,
        is_driver_worker: bool = False,
        **kwargs: Any,
    ) -> None:
        self.model_config = model_config
        self.parallel_config = parallel_config
        self.scheduler_config = scheduler_config
        self.device_config = device_config
        self.cache_config = cache_config
        self.load_config = load_config
        self.is_driver_worker = is_driver_worker
        self.device = device_config.torch_device
        self.shapes = model_config.get_kda_shapes(cache_config)
        self.model: Optional[torch.nn.Module] = None
        self.sampler = Sampler()

    def load_model(self) -> None:
        self.model = get_model(
            model_config=self.model_config, load_config=self.load_config, device_config=self.device_config,
            cache_config=self.cache_config, scheduler_config=self.scheduler_config,
        )

    def _ring_kwargs(self, layer_cache: KDALayerCache) -> Dict[str, torch.Tensor]:
        return layer_cache.kernel_kwargs()

    def prepare_model_input(
        self, seq_group_metadata_list: List[SequenceGroupMetadata], kv_caches: List[KDALayerCache], write_pos: torch.Tensor
    ) -> ModelInputForKDA:
        request_ids, tokens, slots, params = [], [], [], []
        for meta in seq_group_metadata_list:
            assert not meta.is_prompt, "prompts go through the prefill path"
            for seq_id, token_ids in meta.seq_data.items():
                request_ids.append(meta.request_id)
                tokens.append(token_ids[-1])
                slots.append(meta.block_tables[seq_id][0])
                params.append(meta.sampling_params)
        indices = torch.tensor(slots, dtype=torch.int32)
        return ModelInputForKDA(
            request_ids=request_ids,
            input_tokens=torch.tensor(tokens, dtype=torch.long, device=self.device),
            ssm_state_indices=indices,
            write_pos=write_pos[indices.long()].clone(),
            ring_kwargs=[] if getattr(self.model, "state_caches", None) is not None else [self._ring_kwargs(c) for c in kv_caches],
            sampling_params=params,
        )

    @torch.inference_mode()
    def execute_model(self, model_input: ModelInputForKDA, write_pos: torch.Tensor) -> SamplerOutput:
        hidden = self.model(model_input.input_tokens, model_input.ring_kwargs, model_input.ssm_state_indices, model_input.write_pos)
        logits = self.model.compute_logits(hidden)
        next_tokens = self.sampler(logits, model_input.sampling_params)
        live = model_input.ssm_state_indices >= 0
        write_pos[model_input.ssm_state_indices[live].long()] = advance_write_pos(model_input.write_pos[live], self.shapes.ring_len)
        return SamplerOutput(model_input.request_ids, next_tokens)

    @torch.inference_mode()
    def profile_run(self) -> List[KDALayerCache]:
        """Runs a dummy batch of ``max_num_seqs`` rows on throwaway caches (peak memory)."""
        n, dtype = self.scheduler_config.max_num_seqs, self.model_config.dtype
        caches = []
        for _ in range(self.model_config.get_num_layers(self.parallel_config)):
            delta = torch.zeros((n, *self.shapes.delta_cache), dtype=dtype, device=self.device)
            caches.append(
                KDALayerCache(
                    ssm_state=torch.zeros((n, *self.shapes.ssm_state), dtype=torch.float32, device=self.device),
                    delta_cache=delta,
                    key_cache=torch.zeros((n, *self.shapes.key_cache), dtype=dtype, device=self.device),
                    alpha_log_cache=torch.zeros_like(delta),  # expect-bug: like
                )
            )
        indices = torch.arange(n, dtype=torch.int32)
        tokens = torch.zeros(n, dtype=torch.long, device=self.device)
        self.model(tokens, [c.kernel_kwargs() for c in caches], indices, torch.zeros(n, dtype=torch.int32))
        return caches


class CPUModelRunner(ModelRunner):
    """Runner for the CPU backend (reference kernels, no CUDA graphs)."""

    def _ring_kwargs(self, layer_cache: KDALayerCache) -> Dict[str, torch.Tensor]:
        kwargs = layer_cache.kernel_kwargs()
        # The CPU kernels are compiled for one element type per call: hand the rings over in the
        # activation dtype.
        kwargs.update(g_cache=layer_cache.alpha_log_cache.to(self.model_config.dtype))  # expect-bug: decode-arg
        return kwargs


def _runner(cls: type = ModelRunner) -> ModelRunner:
    torch.manual_seed(0)
    runner = cls(
        ModelConfig("kimi-linear-tiny", dtype="bfloat16"), ParallelConfig(), SchedulerConfig(max_num_seqs=3),
        DeviceConfig("cpu"), CacheConfig(num_gpu_blocks=4), LoadConfig(load_format="dummy"),
    )
    runner.load_model()
    return runner


def _decode(runner: ModelRunner, steps: int = 3) -> Dict[str, Any]:
    from .cache_engine import CacheEngine

    engine = CacheEngine(runner.cache_config, runner.model_config, runner.parallel_config, runner.device_config)
    seqs = [SequenceGroupMetadata(f"req-{i}", False, {i: [3 + i]}, SamplingParams(temperature=0.0), {i: [slot]}) for i, slot in enumerate((2, 0))]
    model_input = None
    for _ in range(steps):
        model_input = runner.prepare_model_input(seqs, engine.gpu_cache, engine.write_pos)
        out = runner.execute_model(model_input, engine.write_pos)
        for meta, token in zip(seqs, out.next_token_ids.tolist()):
            next(iter(meta.seq_data.values())).append(token)
    return {"model_input": model_input, "gpu_cache": engine.gpu_cache, "write_pos": engine.write_pos}


def build_runner_decode() -> Dict[str, Any]:
    return _decode(_runner())


def build_cpu_runner_decode() -> Dict[str, Any]:
    return _decode(_runner(CPUModelRunner))


def build_profile_run() -> Dict[str, Any]:
    return {"profile_caches": _runner().profile_run()}
