from .base import ContainerMap, InferenceV2Policy, LayerContainer

__all__ = ["ContainerMap", "InferenceV2Policy", "LayerContainer"]
