"""Sequence-group metadata handed from the scheduler to the workers."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ..modeling.sampler import SamplingParams


@dataclass
class SequenceGroupMetadata:
    request_id: str
    is_prompt: bool
    seq_data: Dict[int, List[int]]
    sampling_params: SamplingParams
    block_tables: Dict[int, List[int]]


@dataclass
class ExecuteModelRequest:
    seq_group_metadata_list: List[SequenceGroupMetadata]
    blocks_to_swap_in: Dict[int, int] = field(default_factory=dict)
    blocks_to_swap_out: Dict[int, int] = field(default_factory=dict)
    blocks_to_copy: Dict[int, List[int]] = field(default_factory=dict)


@dataclass
class SamplerOutput:
    request_ids: List[str]
    next_token_ids: torch.Tensor
    logprobs: Optional[torch.Tensor] = None
