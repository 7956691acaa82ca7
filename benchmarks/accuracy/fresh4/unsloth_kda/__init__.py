# Copyright 2023-present Daniel Han-Chen & the Unsloth team. All rights reserved.
# Licensed under the Apache License, Version 2.0 (the "License").

import warnings
from .models._utils import __version__, SUPPORTS_BFLOAT16, is_bfloat16_supported
from .models import FastLanguageModel, FastKimiModel, UnslothReplayCache, unsloth_fast_generate
from .kernels import kda_replayssm_decode
from .save import unsloth_save_model, unsloth_save_replay_state, unsloth_load_replay_state

if not SUPPORTS_BFLOAT16:
    warnings.warn("Unsloth: this device has no bfloat16 - Kimi Linear will run in float16.")
