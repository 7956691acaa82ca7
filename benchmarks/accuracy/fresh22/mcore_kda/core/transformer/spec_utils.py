"""Module specs (cf. megatron/core/transformer/spec_utils.py)."""

import importlib
import sys
import types
from dataclasses import dataclass, field
from typing import Tuple, Union


@dataclass
class ModuleSpec:
    """This is a Module Specification dataclass.

    Specification defines the location of the module (to import dynamically)
    or the imported module itself. It also defines the params that need to be
    passed to initialize the module.

    Args:
        module (Union[Tuple, type]): A tuple describing the location of the
            module class e.g. `(module.location, ModuleClass)` or the imported
            module class itself e.g. `ModuleClass` (which is already imported
            using `from module.location import ModuleClass`).
        params (dict): A dictionary of params that need to be passed while init.
        submodules (object): A dataclass of the submodules of ``module``.
    """

    module: Union[Tuple, type]
    params: dict = field(default_factory=lambda: {})
    submodules: object = None


def import_module(module_path: Tuple[str]):
    """Import a named object from a module in the context of this function."""
    base_path, name = module_path
    try:
        module = importlib.import_module(base_path)
    except ImportError as e:
        print(f"couldn't import module due to {e}")
        return None
    return vars(module)[name]


def get_module(spec_or_module: Union[ModuleSpec, type], **additional_kwargs):
    # If a module clas is already provided return it as is
    if isinstance(spec_or_module, (type, types.FunctionType)):
        return spec_or_module
    # If the module is provided instead of module path, then return it as is
    if isinstance(spec_or_module.module, (type, types.FunctionType)):
        return spec_or_module.module
    # Otherwise, return the dynamically imported module from the module path
    return import_module(spec_or_module.module)


def _instantiate(spec_or_module: Union[ModuleSpec, type], *args, **kwargs):
    # If the passed `spec_or_module` is a `function`, then return it as it is.
    if isinstance(spec_or_module, types.FunctionType):
        return spec_or_module

    # If the passed `spec_or_module` is actually a spec (instance of `ModuleSpec`) and it specifies a
    # `function` using its `module` field, return the `function` as it is.
    if isinstance(spec_or_module, ModuleSpec) and isinstance(spec_or_module.module, types.FunctionType):
        return spec_or_module.module

    # Check if a module class is provided as a spec or if the module path itself is a class
    if isinstance(spec_or_module, type):
        module = spec_or_module
    elif hasattr(spec_or_module, "module") and isinstance(spec_or_module.module, type):
        module = spec_or_module.module
    else:
        # Otherwise, dynamically import the module from the module path
        module = import_module(spec_or_module.module)

    # If the imported module is actually a `Function` return it as it is
    if isinstance(module, types.FunctionType):
        return module

    # Finally return the initialized module with params from the spec as well as those passed as **kwargs
    if hasattr(spec_or_module, "submodules") and spec_or_module.submodules is not None:
        kwargs["submodules"] = spec_or_module.submodules

    try:
        return module(*args, **spec_or_module.params if hasattr(spec_or_module, "params") else {}, **kwargs)
    except Exception as e:
        # improve the error message since we hide the module name in the line above
        raise type(e)(f"{str(e)} when instantiating {module.__name__}").with_traceback(sys.exc_info()[2])


# ``build_module`` is the name the rest of megatron.core imports.
build_module = _instantiate
