from .kimi_linear_layer_specs import kimi_linear_stack_spec
from .kimi_linear_model import KimiLinearModel

__all__ = ["KimiLinearModel", "kimi_linear_stack_spec"]
