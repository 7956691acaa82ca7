# Copyright 2024 Bytedance Ltd. and/or its affiliates. Licensed under the Apache License, Version 2.0.

from .protocol import DataProto

__version__ = "0.3.1.dev"

__all__ = ["DataProto"]
