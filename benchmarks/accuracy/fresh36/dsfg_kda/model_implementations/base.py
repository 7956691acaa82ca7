"""Layer containers, the container map and the policy base of the v2 model implementations.

A policy instantiates its model, builds a ``ContainerMap`` that routes every checkpoint
parameter name to a layer container, streams the checkpoint engine's parameters through it and
finalizes the model.
"""

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn


class LayerContainer:
    """Maps the checkpoint names of one layer (relative to the layer prefix) onto a module."""

    PARAM_MAPPING: Dict[str, str] = {}

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._populated: set = set()

    def _target(self, attr_path: str) -> torch.Tensor:
        target: Any = self._module
        for part in attr_path.split("."):
            target = getattr(target, part)
        return target

    def set_dependency(self, name: str, tensor: torch.Tensor) -> None:
        if name not in self.PARAM_MAPPING:
            raise KeyError(f"{type(self).__name__}: unexpected parameter {name!r}")
        param = self._target(self.PARAM_MAPPING[name])
        if tuple(param.shape) != tuple(tensor.shape):
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor.to(device=param.device, dtype=param.dtype))
        self._populated.add(name)

    @property
    def is_populated(self) -> bool:
        return self._populated == set(self.PARAM_MAPPING)

    def missing(self) -> List[str]:
        return sorted(set(self.PARAM_MAPPING) - self._populated)


class ContainerMap:
    def __init__(self) -> None:
        self._prefix: Optional[re.Pattern] = None
        self._transformer: List[LayerContainer] = []
        self._non_transformer: Optional[LayerContainer] = None
        self._unmapped: Tuple[str, ...] = ()

    def set_transformer_params(self, prefix: str, containers: List[LayerContainer]) -> None:
        self._prefix = re.compile(re.escape(prefix) + r"\.(\d+)\.(.+)")
        self._transformer = containers

    def set_non_transformer_params(self, container: LayerContainer) -> None:
        self._non_transformer = container

    def set_unmapped_params(self, names: Iterable[str]) -> None:
        self._unmapped = tuple(names)

    def map_param(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._unmapped:
            return
        match = self._prefix.fullmatch(name) if self._prefix is not None else None
        if match is not None:
            self._transformer[int(match.group(1))].set_dependency(match.group(2), tensor)
        elif self._non_transformer is not None and name in self._non_transformer.PARAM_MAPPING:
            self._non_transformer.set_dependency(name, tensor)
        else:
            raise KeyError(f"checkpoint parameter {name!r} is not mapped")

    def validate(self) -> None:
        missing = [f"layer {i}: {c.missing()}" for i, c in enumerate(self._transformer) if not c.is_populated]
        if self._non_transformer is not None and not self._non_transformer.is_populated:
            missing.append(f"non-transformer: {self._non_transformer.missing()}")
        if missing:
            raise RuntimeError("checkpoint is missing parameters: " + "; ".join(missing))


class InferenceV2Policy:
    """Builds a model implementation from a model config and a checkpoint engine."""

    def __init__(self, model_config: Any, checkpoint_engine: Any) -> None:
        self._model_config = model_config
        self._checkpoint_engine = checkpoint_engine

    def instantiate_model(self, engine_config: Any) -> nn.Module:
        raise NotImplementedError

    def build_container_map(self, model: nn.Module) -> ContainerMap:
        raise NotImplementedError

    def finalize_model(self, model: nn.Module) -> nn.Module:
        return model

    def build_model(self, engine_config: Any) -> nn.Module:
        model = self.instantiate_model(engine_config)
        container_map = self.build_container_map(model)
        for name, tensor in self._checkpoint_engine.parameters():
            container_map.map_param(name, tensor)
        container_map.validate()
        return self.finalize_model(model)
