# Copyright 2023-present Daniel Han-Chen & the Unsloth team. All rights reserved.
# Licensed under the Apache License, Version 2.0 (the "License").

from .replay_ssm import (
    kda_replayssm_decode,
    fast_kda_decode,
    ReplayRings,
    ReplayCacheSpec,
    allocate_replay_rings,
    KDA_DECODE_LAST_CALL,
)
