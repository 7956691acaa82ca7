from .model import KimiLinearConfig, KimiLinearInferenceModel
from .policy import KimiLinearPolicy

__all__ = ["KimiLinearConfig", "KimiLinearInferenceModel", "KimiLinearPolicy"]
