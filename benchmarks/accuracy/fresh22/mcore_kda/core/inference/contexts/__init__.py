from .base_context import BaseInferenceContext
from .static_context import KDAInferenceState, StaticInferenceContext

__all__ = ["BaseInferenceContext", "KDAInferenceState", "StaticInferenceContext"]
