"""
Our config contains various options for inference optimization, it is a unified API that wraps all the configurations for inference.
"""

from dataclasses import dataclass
from typing import Optional, Union

import torch

_DTYPE_MAPPING = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
}

_ALLOWED_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@dataclass
class InferenceConfig:
    """The inference configuration.

    Args:
        max_batch_size (int): Maximum batch size, defaults to 8.
        max_output_len (int): Maximum output length, defaults to 256.
        max_input_len (int): Maximum input length, defaults to 256.
        dtype (Union[str, torch.dtype]): The data type for weights and activations.
        kv_cache_dtype (Optional[str]): The data type of the kv cache and the KDA d/k rings, defaults to None (same as dtype).
        kda_gate_dtype (Optional[str]): The data type of the KDA gate (log-decay) ring, defaults to None.
        kda_ring_len (int): Length of the ReplaySSM rings of the KDA layers, defaults to 16.
        block_size (int): The number of blocks in a logical block, defaults to 16.
        tp_size (int): Tensor parallel size, defaults to 1.
        use_cuda_graph (bool): Whether to enforce CUDA graph execution for decoding, defaults to False.
        use_spec_dec (bool): Indicate whether to use speculative decoding, defaults to False.
        max_n_spec_tokens (int): The maximum number of speculating tokens, defaults to 5.
    """

    # runtime limit
    max_batch_size: int = 8
    max_output_len: int = 256
    max_input_len: int = 256

    # general configs
    dtype: Union[str, torch.dtype] = torch.float16
    kv_cache_dtype: Optional[str] = None
    kda_gate_dtype: Optional[str] = None
    kda_ring_len: int = 16

    # paged attention, parallelism, cuda graph, speculative decoding
    block_size: int = 16
    tp_size: int = 1
    use_cuda_graph: bool = False
    use_spec_dec: bool = False
    max_n_spec_tokens: int = 5

    def __post_init__(self):
        self._verify_config()

    def _verify_config(self) -> None:
        """
        Verify the input config
        """
        if isinstance(self.dtype, str):
            # convert string dtype to torch dtype
            assert (
                self.dtype in _DTYPE_MAPPING
            ), f"Expected the dtype string argument to be in {list(_DTYPE_MAPPING.keys())} but found an unknown dtype: {self.dtype}"
            self.dtype = _DTYPE_MAPPING[self.dtype]
        assert self.dtype in _ALLOWED_DTYPES, f"Expected dtype to be in {_ALLOWED_DTYPES} but found an unknown dtype: {self.dtype}"

        if self.kv_cache_dtype is None:
            self.kv_cache_dtype = self.dtype
        elif isinstance(self.kv_cache_dtype, str):
            self.kv_cache_dtype = _DTYPE_MAPPING[self.kv_cache_dtype]

        # the gate ring follows the activations unless it is configured explicitly
        self.kda_gate_dtype = _DTYPE_MAPPING.get(self.kda_gate_dtype, self.dtype)  # expect-bug: imported-policy id=gate-dtype

        if self.use_spec_dec:
            assert self.max_n_spec_tokens < self.kda_ring_len, "drafted tokens must fit in the KDA ring"

    def to_model_shard_inference_config(self) -> "ModelShardInferenceConfig":
        return ModelShardInferenceConfig(
            dtype=self.dtype,
            use_cuda_graph=self.use_cuda_graph,
            use_spec_dec=self.use_spec_dec,
            kda_ring_len=self.kda_ring_len,
        )


@dataclass
class ModelShardInferenceConfig:
    """
    Configurations used during init of module for inference modeling.
    """

    dtype: torch.dtype = None
    use_cuda_graph: bool = False
    use_spec_dec: bool = False
    kda_ring_len: int = 16
    standalone_state: bool = False
