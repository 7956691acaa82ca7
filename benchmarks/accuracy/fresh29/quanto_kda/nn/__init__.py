from .qmodule import QLinear, QModuleMixin
