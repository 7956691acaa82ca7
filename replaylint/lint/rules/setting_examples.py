"""RL002's examples of gate-dtype settings and dtype tables (its docs and tests, with the rest of
its examples): a setting (or getter) named for the gate cache's dtype given another setting's dtype, an entry
of a dtype table picked by another setting, a table that gives every ring one dtype."""

from __future__ import annotations

from replaylint.lint.rules.base import Invalid, Valid

SETTING_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch

        DTYPE_BY_NAME = {"fp32": torch.float32, "bf16": torch.bfloat16}

        def enable(cache, config, slots):
            # the gate's own setting picks its entry: the user's float32 choice
            cache.reallocate(
                slots,
                ring_dtype=DTYPE_BY_NAME[config.cache_precision],
                log_decay_dtype=DTYPE_BY_NAME[config.decay_precision],
            )

        def ring_dtypes(dtype):
            return {"d_cache": dtype, "k_cache": dtype, "g_cache": torch.float32}

        class ModelConfig:
            params_dtype = torch.bfloat16
            gate_ring_precision = torch.float32

            @property
            def log_decay_dtype(self):
                return self.gate_ring_precision  # the gate's own setting
        """
    ),
    Valid(
        """
        from dataclasses import dataclass
        from typing import Optional

        import torch

        @dataclass
        class RingDtypes:
            ring: torch.dtype = torch.bfloat16
            gate: Optional[torch.dtype] = None

            def __post_init__(self):
                if self.gate is None:
                    self.gate = torch.float32  # a gate left unset is float32
        """
    ),
)
SETTING_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        from typing import NamedTuple

        import torch

        STORAGE = {"32-true": torch.float32, "bf16-true": torch.bfloat16}

        class RingDtypes(NamedTuple):
            delta: torch.dtype
            key: torch.dtype
            gate: torch.dtype = torch.float32

        def ring_dtypes(precision):
            storage = STORAGE[precision]
            # the gate field is handed the value the other rings are given
            return RingDtypes(delta=storage, key=storage, gate=storage)
        """,
        expected_fix="""
        from typing import NamedTuple

        import torch

        STORAGE = {"32-true": torch.float32, "bf16-true": torch.bfloat16}

        class RingDtypes(NamedTuple):
            delta: torch.dtype
            key: torch.dtype
            gate: torch.dtype = torch.float32

        def ring_dtypes(precision):
            storage = STORAGE[precision]
            # the gate field is handed the value the other rings are given
            return RingDtypes(delta=storage, key=storage, gate=torch.float32)
        """,
        message_contains="is given `storage`, the value given to `delta` for another ring",
    ),
    Invalid(
        """
        import torch

        RING_NAMES = ("ssm_state", "d_cache", "k_cache", "g_cache")

        def export_dtypes(config):
            state_dtype, wire_dtype = config.state_dtype, config.wire_dtype
            return dict(zip(RING_NAMES, (state_dtype, wire_dtype, wire_dtype, wire_dtype)))
        """,
        expected_fix="""
        import torch

        RING_NAMES = ("ssm_state", "d_cache", "k_cache", "g_cache")

        def export_dtypes(config):
            state_dtype, wire_dtype = config.state_dtype, config.wire_dtype
            return dict(zip(RING_NAMES, (state_dtype, wire_dtype, wire_dtype, torch.float32)))
        """,
        message_contains="gate cache `g_cache` is given `wire_dtype` by the dtype table",
    ),
    Invalid(
        """
        from dataclasses import dataclass

        import torch

        @dataclass
        class StateConfig:
            state_dtype: torch.dtype
            ring_dtype: torch.dtype
            gate_dtype: torch.dtype = torch.float32

        def state_config(model_config):
            # in field order: the third is the gate ring's
            dtype = model_config.params_dtype
            return StateConfig(torch.float32, dtype, dtype)
        """,
        expected_fix="""
        from dataclasses import dataclass

        import torch

        @dataclass
        class StateConfig:
            state_dtype: torch.dtype
            ring_dtype: torch.dtype
            gate_dtype: torch.dtype = torch.float32

        def state_config(model_config):
            # in field order: the third is the gate ring's
            dtype = model_config.params_dtype
            return StateConfig(torch.float32, dtype, torch.float32)
        """,
        message_contains="`gate_dtype` of `StateConfig`, the gate ring's dtype, is set to `dtype`",
    ),
    Invalid(
        """
        import torch

        class ModelConfig:
            params_dtype = torch.bfloat16

            @property
            def log_decay_dtype(self):
                # a getter named for the gate's dtype that hands out the model's
                return self.params_dtype
        """,
        expected_fix="""
        import torch

        class ModelConfig:
            params_dtype = torch.bfloat16

            @property
            def log_decay_dtype(self):
                # a getter named for the gate's dtype that hands out the model's
                return torch.float32
        """,
        message_contains="`log_decay_dtype`, named for the gate cache's dtype, returns `self.params_dtype`",
    ),
    Invalid(
        """
        import torch

        class ReplaySpec:
            def __init__(self, dtype, log_decay_dtype=None):
                self.dtype = dtype
                self.log_decay_dtype = log_decay_dtype or self.dtype
        """,
        expected_fix="""
        import torch

        class ReplaySpec:
            def __init__(self, dtype, log_decay_dtype=None):
                self.dtype = dtype
                self.log_decay_dtype = log_decay_dtype or torch.float32
        """,
        message_contains="`log_decay_dtype`, named for the gate cache's dtype, is set to `self.dtype`",
    ),
    Invalid(
        """
        import torch

        DTYPE_BY_NAME = {"fp32": torch.float32, "bf16": torch.bfloat16}

        def enable(cache, config, slots):
            cache.reallocate(
                slots,
                ring_dtype=config.torch_dtype,
                log_decay_dtype=DTYPE_BY_NAME[config.cache_precision],
            )
        """,
        expected_fix="""
        import torch

        DTYPE_BY_NAME = {"fp32": torch.float32, "bf16": torch.bfloat16}

        def enable(cache, config, slots):
            cache.reallocate(
                slots,
                ring_dtype=config.torch_dtype,
                log_decay_dtype=torch.float32,
            )
        """,
        message_contains="an entry of a dtype table that another setting picks",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class Model(nn.Module):
            @property
            def replay_dtypes(self):
                dtype = self.dtype  # every ring the model's dtype
                return {"d_cache": dtype, "k_cache": dtype, "g_cache": dtype}

            def rings(self, shapes):
                dtypes = self.replay_dtypes
                return {name: torch.zeros(s, dtype=dtypes[name]) for name, s in shapes.items()}
        """,
        expected_fix="""
        import torch
        from torch import nn

        class Model(nn.Module):
            @property
            def replay_dtypes(self):
                dtype = self.dtype  # every ring the model's dtype
                return {"d_cache": dtype, "k_cache": dtype, "g_cache": torch.float32}

            def rings(self, shapes):
                dtypes = self.replay_dtypes
                return {name: torch.zeros(s, dtype=dtypes[name]) for name, s in shapes.items()}
        """,
        message_contains="allocated with dtype `dtype` (line 7: `self.dtype`)",
    ),
    Invalid(
        """
        from dataclasses import dataclass
        from typing import Optional

        import torch

        @dataclass
        class RingDtypes:
            ring: torch.dtype = torch.bfloat16
            gate: Optional[torch.dtype] = None

            def __post_init__(self):
                if self.gate is None:
                    self.gate = self.ring  # the gate follows the d/k rings
        """,
        expected_fix="""
        from dataclasses import dataclass
        from typing import Optional

        import torch

        @dataclass
        class RingDtypes:
            ring: torch.dtype = torch.bfloat16
            gate: Optional[torch.dtype] = None

            def __post_init__(self):
                if self.gate is None:
                    self.gate = torch.float32  # the gate follows the d/k rings
        """,
        message_contains="`gate` of `RingDtypes`, the gate ring's dtype, is set to `ring`",
    ),
)
