# Copyright (c) OpenMMLab. All rights reserved.
from .replay_decode import kda_gate, next_write_pos, replay_decode_step

__all__ = ['kda_gate', 'next_write_pos', 'replay_decode_step']
