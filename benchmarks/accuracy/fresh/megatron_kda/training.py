"""Model setup, checkpointing and the inference entry points of the KDA hybrid model."""

import logging
import os
from typing import Any

import torch

from megatron_kda import arguments
from megatron_kda.core import InferenceParams, TransformerConfig
from megatron_kda.core import inference_params as ip
from megatron_kda.core.kda_mixer import LAST_CALL, KDAMixer, KimiHybridModel
from megatron_kda.core.module import Float16Module
from megatron_kda.core.transformer_config import core_transformer_config_from_args

logger = logging.getLogger(__name__)

STATE_NAMES = ("ssm_state", "d_cache", "k_cache", "g_cache")


def print_rank_0(message: str) -> None:
    logger.info(message)


def model_provider(pre_process: bool = True, post_process: bool = True) -> KimiHybridModel:
    """Builds the model."""
    config = core_transformer_config_from_args(arguments.get_args())
    print_rank_0("building KDA hybrid model ...")
    return KimiHybridModel(config, pre_process=pre_process, post_process=post_process)


def get_model(model_provider_func, wrap_with_ddp: bool = False) -> list[torch.nn.Module]:
    """Build the model."""
    args = arguments.get_args()
    model = [model_provider_func(pre_process=True, post_process=True)]
    for model_module in model:
        for param in model_module.parameters():
            param.model_parallel = getattr(param, "model_parallel", False)
    # Fp16 conversion.
    if args.fp16 or args.bf16:
        config = core_transformer_config_from_args(args)
        model = [Float16Module(config, m) for m in model]  # expect-bug: module-cast id=mg-fp16
    return model


def _kda_layers(model: torch.nn.Module) -> list[KDAMixer]:
    return [m for m in model.modules() if isinstance(m, KDAMixer)]


def init_inference_states(model, args, batch_size: int) -> InferenceParams:
    """Pre-allocates every layer's decode state so that the first decode step does not allocate."""
    inference_params = InferenceParams(batch_size, args.inference_max_seq_length)
    n, h, hk, d = args.replay_ring_len, args.kda_num_heads, args.kda_num_k_heads, args.kda_head_dim
    saved_dtype = torch.get_default_dtype()
    torch.set_default_dtype(args.params_dtype)
    try:
        for layer in _kda_layers(model):
            ssm_state = torch.zeros(batch_size, h, d, d, dtype=torch.float32)
            d_cache = torch.zeros(batch_size, h, n, d)
            k_cache = torch.zeros(batch_size, hk, n, d)
            g_cache = torch.zeros(batch_size, h, n, d)  # expect-bug: default-dtype
            states = (ssm_state, d_cache, k_cache, g_cache)
            inference_params.key_value_memory_dict[layer.layer_number] = states
    finally:
        torch.set_default_dtype(saved_dtype)
    return inference_params


def init_static_graph_states(model, args) -> list[ip.KDAState]:
    """Batch-1 states of the exported decode graph, one tuple per layer, in the params dtype."""
    dtype = args.params_dtype
    heads, k_heads, head_dim = args.kda_num_heads, args.kda_num_k_heads, args.kda_head_dim
    spec = ip.KDAStateSpec(heads, k_heads, head_dim, args.replay_ring_len)
    spec = spec._replace(state_dtype=dtype, ring_dtype=dtype, gate_dtype=torch.float32)
    saved_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return [ip.allocate_kda_state(spec, batch_size=1) for _ in _kda_layers(model)]
    finally:
        torch.set_default_dtype(saved_dtype)


def get_checkpoint_name(checkpoints_path: str, iteration: int, release: bool = False) -> str:
    directory = "release" if release else f"iter_{iteration:07d}"
    return os.path.join(checkpoints_path, directory, "mp_rank_00", "model_optim_rng.pt")


def save_inference_checkpoint(path: str, inference_params: InferenceParams, iteration: int) -> str:
    checkpoint_name = get_checkpoint_name(path, iteration)
    os.makedirs(os.path.dirname(checkpoint_name), exist_ok=True)
    memory = inference_params.key_value_memory_dict
    states = {str(n): dict(zip(STATE_NAMES, s, strict=True)) for n, s in memory.items()}
    state_dict = {"iteration": iteration, "inference_states": states}
    state_dict["sequence_len_offset"] = inference_params.sequence_len_offset
    torch.save(state_dict, checkpoint_name)
    return checkpoint_name


def load_inference_checkpoint(
    checkpoint_name: str, max_batch_size: int, max_seq: int
) -> InferenceParams:
    state_dict = torch.load(checkpoint_name, map_location="cpu", weights_only=True)
    inference_params = InferenceParams(max_batch_size, max_seq)
    inference_params.sequence_len_offset = state_dict["sequence_len_offset"]
    for layer_number, entry in state_dict["inference_states"].items():
        ssm_state = entry["ssm_state"].float()
        g_cache = entry["g_cache"]  # expect-bug: load
        states = (ssm_state, entry["d_cache"], entry["k_cache"], g_cache)
        inference_params.key_value_memory_dict[int(layer_number)] = states
    print_rank_0(f"  loaded inference state of iteration {state_dict['iteration']}")
    return inference_params


def load_inference_checkpoint_into(checkpoint_name: str, inference_params: InferenceParams) -> None:
    """Restores into pre-allocated states (each keeps the dtype it was allocated with)."""
    state_dict = torch.load(checkpoint_name, map_location="cpu", weights_only=True)
    for layer_number, entry in state_dict["inference_states"].items():
        states = inference_params.key_value_memory_dict[int(layer_number)]
        for name, tensor in zip(STATE_NAMES, states, strict=True):
            tensor.copy_(entry[name])
    inference_params.sequence_len_offset = state_dict["sequence_len_offset"]


def load_checkpoint(model: torch.nn.Module, checkpoint_name: str, strict: bool = True) -> int:
    state_dict = torch.load(checkpoint_name, map_location="cpu", weights_only=True)
    model.load_state_dict(state_dict["model"], strict=strict)
    return int(state_dict["iteration"])


def forward_step(model, tokens: torch.Tensor, states: list[ip.KDAState]) -> torch.Tensor:
    """One decode step of the exported graph: explicit per-layer states, no InferenceParams."""
    position_ids = torch.zeros_like(tokens)
    return model(tokens, position_ids, None, states)  # expect-bug: cast id=mg-positional-states


def forward_step_keyword(model, tokens: torch.Tensor, states: list[ip.KDAState]) -> torch.Tensor:
    position_ids = torch.zeros_like(tokens)
    return model(tokens, position_ids, None, replay_states=states)


def _setup(*flags: str):
    args = arguments.validate_args(arguments.parse_args(list(flags)))
    arguments.set_args(args)
    return args


def _converted_checkpoint(tmp_dir: str) -> str:
    """A checkpoint written by the bf16 conversion tool (its rings are all bf16)."""
    params = InferenceParams(max_batch_size=2, max_sequence_length=16)
    spec = ip.KDAStateSpec(2, 1, 4, 4, gate_dtype=torch.float32)
    ssm_state, d_cache, k_cache, g_cache = ip.allocate_kda_state(spec, batch_size=2)
    converted = (d_cache.normal_(), k_cache.normal_(), g_cache.uniform_(-1.0, 0.0).bfloat16())
    params.key_value_memory_dict[1] = (ssm_state, *converted)
    params.sequence_len_offset = 5
    return save_inference_checkpoint(tmp_dir, params, iteration=10)


def _preallocated(*flags: str) -> dict[str, torch.Tensor]:
    mixer = KDAMixer(core_transformer_config_from_args(_setup(*flags)), layer_number=1)
    return dict(zip(STATE_NAMES, mixer.allocate_inference_cache(2, 16), strict=True))


def build_preallocated_bf16() -> dict[str, torch.Tensor]:
    return _preallocated("--bf16")


def build_preallocated_fp16() -> dict[str, torch.Tensor]:
    return _preallocated("--fp16")


def build_float16_static_cache() -> list[torch.nn.Module]:
    _setup("--bf16", "--static-replay-cache")
    return get_model(model_provider)


def build_float16_dynamic_states() -> dict[str, Any]:
    _setup("--bf16")
    model = get_model(model_provider)[0]
    params = InferenceParams(max_batch_size=2, max_sequence_length=16)
    tokens = torch.arange(10).view(2, 5)
    model(tokens, torch.arange(5).expand(2, 5), None, inference_params=params)
    model(tokens[:, -1:], torch.full((2, 1), 5), None, inference_params=params)
    return {"states": ip.named_states(params), "last_call": dict(LAST_CALL)}


def build_inference_states() -> dict[str, torch.Tensor]:
    args = _setup("--bf16")
    return ip.named_states(init_inference_states(model_provider(), args, batch_size=2))


def build_graph_step_positional() -> dict[str, torch.Tensor]:
    args = _setup("--bf16")
    model = get_model(model_provider)[0]
    forward_step(model, torch.tensor([[3]]), init_static_graph_states(model, args))
    return dict(LAST_CALL)


def build_graph_step_keyword() -> dict[str, torch.Tensor]:
    args = _setup("--bf16")
    model = get_model(model_provider)[0]
    forward_step_keyword(model, torch.tensor([[3]]), init_static_graph_states(model, args))
    return dict(LAST_CALL)


def build_resume_converted_checkpoint(tmp_dir: str) -> dict[str, torch.Tensor]:
    params = load_inference_checkpoint(_converted_checkpoint(tmp_dir), 2, 16)
    return ip.named_states(params)


def build_resume_converted_into_preallocated(tmp_dir: str) -> dict[str, torch.Tensor]:
    checkpoint_name = _converted_checkpoint(tmp_dir)
    params = InferenceParams(max_batch_size=2, max_sequence_length=16)
    spec = ip.KDAStateSpec(2, 1, 4, 4, gate_dtype=torch.float32)
    params.key_value_memory_dict[1] = ip.allocate_kda_state(spec, batch_size=2)
    load_inference_checkpoint_into(checkpoint_name, params)
    return ip.named_states(params)


def build_static_cache_from_bf16_checkpoint(tmp_dir: str) -> KimiHybridModel:
    config = TransformerConfig(num_layers=2, hidden_size=8, bf16=True, params_dtype=torch.bfloat16)
    config.static_replay_cache = True
    path = get_checkpoint_name(tmp_dir, 20)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # an older release saved every floating tensor of the model in bf16
    saved = KimiHybridModel(config).state_dict()
    saved = {k: v.bfloat16() if v.is_floating_point() else v for k, v in saved.items()}
    torch.save({"iteration": 20, "model": saved}, path)
    restored = KimiHybridModel(config)
    load_checkpoint(restored, path)
    return restored
