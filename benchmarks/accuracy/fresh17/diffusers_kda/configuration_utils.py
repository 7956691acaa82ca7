"""ConfigMixin: the base class that stores every ``__init__`` argument of a model, scheduler or pipeline."""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections import OrderedDict
from typing import Any, Dict, Optional, Union

from .utils import CONFIG_NAME, logging

logger = logging.get_logger(__name__)


class FrozenDict(OrderedDict):
    """An ordered dict that cannot be changed after creation; keys are readable as attributes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for key, value in self.items():
            object.__setattr__(self, key, value)
        object.__setattr__(self, "_FrozenDict__frozen", True)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as error:
            raise AttributeError(name) from error

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_FrozenDict__frozen", False):
            raise Exception(f"You cannot use ``__setattr__`` on a {self.__class__.__name__} instance.")
        super().__setattr__(name, value)

    def __setitem__(self, name: str, value: Any) -> None:
        if getattr(self, "_FrozenDict__frozen", False):
            raise Exception(f"You cannot use ``__setitem__`` on a {self.__class__.__name__} instance.")
        super().__setitem__(name, value)

    def setdefault(self, *args: Any, **kwargs: Any) -> Any:
        raise Exception(f"You cannot use ``setdefault`` on a {self.__class__.__name__} instance.")

    def pop(self, *args: Any, **kwargs: Any) -> Any:
        raise Exception(f"You cannot use ``pop`` on a {self.__class__.__name__} instance.")


class ConfigMixin:
    r"""Base class for all configuration classes.

    Class attributes:
        - **config_name** (`str`) -- file name the config is saved under by [`~ConfigMixin.save_config`].
        - **ignore_for_config** (`List[str]`) -- ``__init__`` arguments that are not stored.
    """

    config_name: Optional[str] = None
    ignore_for_config: list = []

    def register_to_config(self, **kwargs: Any) -> None:
        if self.config_name is None:
            raise NotImplementedError(f"Make sure that {self.__class__} has defined a class name `config_name`")
        internal_dict = dict(getattr(self, "_internal_dict", {}))
        internal_dict.update(kwargs)
        self._internal_dict = FrozenDict(internal_dict)

    @property
    def config(self) -> FrozenDict:
        return self._internal_dict

    def save_config(self, save_directory: Union[str, os.PathLike]) -> None:
        """Writes the config as ``<save_directory>/<config_name>``."""
        os.makedirs(save_directory, exist_ok=True)
        with open(os.path.join(save_directory, self.config_name), "w", encoding="utf-8") as writer:
            writer.write(self.to_json_string())

    def to_json_string(self) -> str:
        config = dict(self._internal_dict)
        config["_class_name"] = self.__class__.__name__
        return json.dumps(config, indent=2, sort_keys=True) + "\n"

    @classmethod
    def load_config(cls, pretrained_model_name_or_path: Union[str, os.PathLike], subfolder: Optional[str] = None) -> Dict[str, Any]:
        folder = os.fspath(pretrained_model_name_or_path)
        if subfolder is not None:
            folder = os.path.join(folder, subfolder)
        path = os.path.join(folder, cls.config_name or CONFIG_NAME)
        if not os.path.isfile(path):
            raise EnvironmentError(f"Error no file named {cls.config_name} found in directory {folder}.")
        with open(path, encoding="utf-8") as reader:
            return json.load(reader)

    @classmethod
    def extract_init_dict(cls, config_dict: Dict[str, Any], **kwargs: Any) -> Dict[str, Any]:
        expected = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
        init_dict = {key: value for key, value in config_dict.items() if key in expected}
        init_dict.update({key: value for key, value in kwargs.items() if key in expected})
        unused = sorted(set(config_dict) - expected - {"_class_name", "_diffusers_version"})
        if unused:
            logger.info("The config attributes %s were passed to %s, but are not expected.", unused, cls.__name__)
        return init_dict

    @classmethod
    def from_config(cls, config: Optional[Union[FrozenDict, Dict[str, Any]]] = None, **kwargs: Any):
        """Instantiates the class from a config dict; ``kwargs`` override single entries."""
        return cls(**cls.extract_init_dict(dict(config or {}), **kwargs))


def register_to_config(init):
    r"""Decorator for the ``__init__`` of a ``ConfigMixin`` subclass: every argument (defaults
    included) is stored with ``register_to_config``, apart from private ones and
    ``ignore_for_config``."""

    @functools.wraps(init)
    def inner_init(self, *args: Any, **kwargs: Any) -> None:
        if not isinstance(self, ConfigMixin):
            raise RuntimeError(f"`@register_to_config` was applied to {self.__class__.__name__} which is not a ConfigMixin.")
        signature = inspect.signature(init)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        ignore = set(getattr(self, "ignore_for_config", ()))
        new_kwargs = {
            name: value
            for name, value in bound.arguments.items()
            if name != "self" and not name.startswith("_") and name not in ignore
        }
        init(self, *args, **kwargs)
        self.register_to_config(**new_kwargs)

    return inner_init
