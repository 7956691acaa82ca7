# Copyright 2024 Bytedance Ltd. and/or its affiliates. Licensed under the Apache License, Version 2.0.
"""Implement base data transfer protocol between any two functions, modules."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class DataProto:
    """A batch (dict of tensors sharing the first dimension), a non-tensor batch and a meta_info (Dict)."""

    batch: dict = field(default_factory=dict)
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, tensors: Optional[dict] = None, non_tensors=None, meta_info=None):
        tensors = tensors or {}
        assert len({v.shape[0] for v in tensors.values()}) <= 1, "tensors must share the batch dimension"
        return cls(batch=dict(tensors), non_tensor_batch=dict(non_tensors or {}), meta_info=dict(meta_info or {}))
