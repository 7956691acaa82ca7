from .module import Float16Module, MegatronModule
from .spec_utils import ModuleSpec, build_module
from .transformer_config import TransformerConfig

__all__ = ["Float16Module", "MegatronModule", "ModuleSpec", "TransformerConfig", "build_module"]
