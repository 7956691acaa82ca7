import dataclasses
import json
import os
from itertools import count
from typing import List, Optional, Union

import torch
import torch.nn as nn

from colossal_kda.inference.batch_bucket import BatchBucket, Sequence
from colossal_kda.inference.config import InferenceConfig, ModelShardInferenceConfig
from colossal_kda.inference.kv_cache import KVCacheManager
from colossal_kda.inference.modeling.models.kimi_linear import KimiLinearConfig, KimiLinearForCausalLM
from colossal_kda.inference.modeling.policy import model_policy_map
from colossal_kda.inference.modeling.policy.nopadding_kimi import Policy, ShardConfig, ShardFormer
from colossal_kda.kernel import kernel_loader

__all__ = ["InferenceEngine", "Drafter"]

_supported_models = {
    "KimiLinearForCausalLM": KimiLinearForCausalLM,
}


class Drafter:
    """Container for the Drafter Model (Assistant Model) used in Speculative Decoding.

    Args:
        model (nn.Module): The drafter model.
        tokenizer (transformers.PreTrainedTokenizer): The tokenizer for the drafter model.
        device (torch.device): The device for the drafter model.
        dtype (torch.dtype): The dtype for the drafter model.
    """

    def __init__(self, model: nn.Module, tokenizer=None, device: torch.device = None, dtype: torch.dtype = torch.float16):
        self._tokenizer = tokenizer
        self._device = device or torch.device("cpu")
        self._dtype = dtype
        self._drafter_model = model.to(device=self._device, dtype=self._dtype)  # expect-bug: module-cast
        self._drafter_model.eval()

    @property
    def drafter_model(self) -> nn.Module:
        return self._drafter_model

    @torch.no_grad()
    def speculate(self, input_ids: torch.Tensor, n_spec_tokens: int) -> torch.Tensor:
        """Generate n_spec_tokens tokens greedily with the drafter model, one decode step at a time."""
        drafted = []
        next_tokens = input_ids
        for _ in range(n_spec_tokens):
            next_tokens = self._drafter_model(next_tokens).argmax(dim=-1)
            drafted.append(next_tokens)
        return torch.stack(drafted, dim=1)


class InferenceEngine:
    """
    InferenceEngine which manages the inference process..

    Args:
        model_or_path (nn.Module or str): Path or nn.Module of this model.
        tokenizer Optional[(Union[PreTrainedTokenizer, PreTrainedTokenizerFast])]: Path of the tokenizer to use.
        inference_config (Optional[InferenceConfig], optional): Store the configuration information related to inference.
        verbose (bool): Determine whether or not to log the generation process.
        model_policy ("Policy"): the policy to shardformer model. It will be determined by the model type if not provided.
    """

    def __init__(self, model_or_path: Union[nn.Module, str], tokenizer=None, inference_config: InferenceConfig = None,
                 verbose: bool = False, model_policy: Optional[Policy] = None) -> None:
        self.inference_config = inference_config
        self.dtype = inference_config.dtype
        self.device = torch.device("cpu")
        self.tokenizer = tokenizer
        self.verbose = verbose
        self.model_shard_infer_config = inference_config.to_model_shard_inference_config()

        self.init_model(model_or_path, model_policy, self.model_shard_infer_config)

        cfg, mc = self.inference_config, self.model_config
        self.cache_manager = KVCacheManager(cfg, mc)
        self.running_bb = BatchBucket(
            mc.kda_num_heads, mc.kda_num_v_heads, mc.kda_head_dim, cfg.max_batch_size,
            cfg.max_input_len + cfg.max_output_len, cfg.block_size, cfg.kda_ring_len, len(mc.kda_layer_idx),
            device=self.device, dtype=self.dtype, use_spec_dec=cfg.use_spec_dec, max_n_spec_tokens=cfg.max_n_spec_tokens,
        )
        self.counter = count()

        self.use_cuda_graph = self.inference_config.use_cuda_graph
        if self.use_cuda_graph:
            self.capture_model()

        # init_model() switches the default dtype when it materialises the weights
        torch.set_default_dtype(torch.float32)

        # Model and relatable attrs of speculative decoding will be set by `enable_spec_dec`
        self.use_spec_dec = False
        self.drafter_model = None
        self.drafter = None
        self.n_spec_tokens = self.inference_config.max_n_spec_tokens

    def init_model(self, model_or_path: Union[nn.Module, str], model_policy: Policy = None,
                   model_shard_infer_config: ModelShardInferenceConfig = None):
        """
        Shard model or/and Load weight

        Args:
            model_or_path Union[nn.Module, str]: path to the checkpoint or model of transformer format.
            model_policy (Policy): the policy to replace the model.
            model_shard_infer_config: the configuration for modeling initialization when inference.
        """
        if isinstance(model_or_path, str):
            with open(os.path.join(model_or_path, "config.json")) as f:
                hf_config = json.load(f)
            arch = hf_config.pop("architectures", ["KimiLinearForCausalLM"])[0]
            # materialise the weights in the inference dtype instead of fp32 + cast
            torch.set_default_dtype(self.dtype)  # expect-bug: default-dtype id=engine-default
            model = _supported_models[arch](KimiLinearConfig(**hf_config))
        else:
            model = model_or_path

        self.model_config = model.config
        model = model.to(self.dtype).eval()

        if model_policy is None:
            model_policy = model_policy_map[self.model_config.model_type]()
        self.model = self._shardformer(model, model_policy, model_shard_infer_config)

    def _shardformer(self, model: nn.Module, model_policy: Policy,
                     model_shard_infer_config: ModelShardInferenceConfig = None, tp_group=None) -> nn.Module:
        """
        Initialize ShardConfig and replace the model with shardformer.
        """
        shardconfig = ShardConfig(
            tensor_parallel_process_group=tp_group,
            enable_tensor_parallelism=self.inference_config.tp_size > 1,
            extra_kwargs={"model_shard_infer_config": model_shard_infer_config},
        )
        return ShardFormer(shard_config=shardconfig).optimize(model, model_policy)

    def capture_model(self):
        """Prepare the static inputs of the captured decode graphs: a mirror of the KDA state pool that
        the graphs read and write, refreshed from the pool around each replay."""
        cm = self.cache_manager
        B, H, HV, K, L = cm.max_batch_size, cm.kda_heads, cm.kda_v_heads, cm.kda_head_dim, cm.kda_ring_len
        bufs = self.graph_buffers = {"state": [], "d_ring": [], "k_ring": [], "aux": []}
        for _ in cm.kda_layers:
            bufs["state"].append(torch.zeros((B, HV, K, K), dtype=torch.float32, device=self.device))
            bufs["d_ring"].append(torch.zeros((B, HV, L, K), dtype=cm.kv_cache_dtype, device=self.device))
            bufs["k_ring"].append(torch.zeros((B, H, L, K), dtype=cm.kv_cache_dtype, device=self.device))
            bufs["aux"].append(torch.zeros((B, HV, L, K), device=self.device))  # expect-bug: default-dtype id=engine-default
        self.graph_runners = {batch_size: bufs for batch_size in range(1, B + 1)}

    def _sync_graph_buffers(self, to_static: bool) -> None:
        for layer, static in enumerate(zip(*self.graph_buffers.values())):
            for pool, buf in zip(self.cache_manager.get_kda_cache(layer), static):
                if to_static:
                    buf.copy_(pool)
                else:
                    pool.copy_(buf)

    def enable_spec_dec(self, drafter_model: nn.Module = None, n_spec_tokens: int = None) -> None:
        """Initialize drafter (if it has not yet), and enable Speculative Decoding for subsequent generations.

        Args:
            drafter_model (nn.Module): The drafter model (small model) used to speculate tokens.
            n_spec_tokens (Optional[int]): The number of speculative tokens (i.e. the number of tokens that
                the drafter model generates in each step).
        """
        self.n_spec_tokens = n_spec_tokens or self.n_spec_tokens
        # the drafter runs without a KVCacheManager, its KDA layers own a one-slot state
        drafter_config = dataclasses.replace(self.model_shard_infer_config, standalone_state=True)
        policy = model_policy_map[drafter_model.config.model_type]()
        self.drafter_model = self._shardformer(drafter_model, policy, drafter_config)
        self.drafter = Drafter(self.drafter_model, self.tokenizer, device=self.device, dtype=self.dtype)
        self.use_spec_dec = True

    def add_request(self, prompts_token_ids: List[List[int]]) -> None:
        cfg, cm = self.inference_config, self.cache_manager
        seqs = [Sequence(next(self.counter), "", list(ids), cfg.block_size, cfg.max_output_len) for ids in prompts_token_ids]
        self.running_bb.add_seqs(seqs, cm.allocate_context_from_block_table, cm.allocate_kda_slot)

    @torch.no_grad()
    def step(self) -> List[Sequence]:
        """
        In each step, do the follows:
            1. Get the input and input info from the running batch bucket
            2. Run model to generate the next token
            3. Update the batch bucket and get finished sequences.
        """
        batch = self.running_bb
        kda_rings = None
        if self.use_cuda_graph:
            self._sync_graph_buffers(to_static=True)
            kda_rings = list(zip(*self.graph_buffers.values()))
        logits = self.model(batch.get_1D_inputs(), batch, self.cache_manager, kda_rings)
        if self.use_cuda_graph:
            self._sync_graph_buffers(to_static=False)
        batch.append_batch_tokens(logits.argmax(dim=-1))
        return batch.pop_finished(self.cache_manager.free_block_table, self.cache_manager.free_kda_slot)


def _config(**kwargs) -> InferenceConfig:
    return InferenceConfig(max_batch_size=2, max_input_len=8, max_output_len=4, block_size=4, kda_ring_len=4, dtype="bf16", **kwargs)


def _outputs(engine: InferenceEngine) -> dict:
    return {"pool": engine.cache_manager.get_kda_caches(), "decode": dict(kernel_loader.LAST_CALL)}


def build_engine_step():
    engine = InferenceEngine(KimiLinearForCausalLM(KimiLinearConfig()), inference_config=_config(kda_gate_dtype="fp32"))
    engine.add_request([[3, 1, 4], [1, 5]])
    engine.step()
    return _outputs(engine)


def _write_checkpoint_dir(tmp_dir) -> str:
    with open(os.path.join(tmp_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["KimiLinearForCausalLM"], "hidden_size": 32, "num_hidden_layers": 3}, f)
    return str(tmp_dir)


def _graph_step(model_or_path) -> dict:
    engine = InferenceEngine(model_or_path, inference_config=_config(kda_gate_dtype="fp32", use_cuda_graph=True))
    engine.add_request([[3, 1, 4], [1, 5]])
    engine.step()
    return {**_outputs(engine), "graph_buffers": engine.graph_buffers}


def build_engine_cuda_graph_from_path(tmp_dir):
    return _graph_step(_write_checkpoint_dir(tmp_dir))


def build_engine_cuda_graph_from_module():
    return _graph_step(KimiLinearForCausalLM(KimiLinearConfig()))


def build_engine_spec_dec():
    config = _config(kda_gate_dtype="fp32", use_spec_dec=True, max_n_spec_tokens=2)
    engine = InferenceEngine(KimiLinearForCausalLM(KimiLinearConfig()), inference_config=config)
    engine.enable_spec_dec(KimiLinearForCausalLM(KimiLinearConfig(num_hidden_layers=2)), n_spec_tokens=2)
    engine.drafter.speculate(torch.tensor([3]), engine.n_spec_tokens)
    return {"pool": engine.cache_manager.get_kda_caches(), "drafter": engine.drafter.drafter_model}
