from .config import ModelConfig
from .pipeline import MIIPipeline, pipeline

__all__ = ["MIIPipeline", "ModelConfig", "pipeline"]
