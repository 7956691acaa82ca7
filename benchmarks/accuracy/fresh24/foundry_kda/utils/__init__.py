# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Configuration, distributed and checkpoint-conversion helpers."""

from foundry_kda.utils.config_utils import DictConfig, dtype_from_str, merge, to_container

__all__ = ["DictConfig", "dtype_from_str", "merge", "to_container"]
