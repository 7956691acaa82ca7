# Copyright 2023-present Daniel Han-Chen & the Unsloth team. All rights reserved.
# Licensed under the Apache License, Version 2.0 (the "License").

from .loader import FastLanguageModel
from .kimi   import FastKimiModel, KimiLinearConfig, KimiLinearForCausalLM, unsloth_fast_generate
from ._utils import is_bfloat16_supported, __version__, UnslothReplayCache
