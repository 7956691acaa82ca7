"""Request slots and their state indexes (lightllm/common/req_manager.py)."""

import torch

from ..utils import init_logger
from .mem_manager import ReplayStateMemoryManager

logger = init_logger(__name__)


class ReqManager:
    def __init__(self, max_request_num, max_sequence_length, mem_manager):
        self.req_state = torch.zeros((max_request_num,), dtype=torch.bool)
        self.req_to_token_indexs = torch.zeros(
            (max_request_num + 1, max_sequence_length), dtype=torch.int32
        )
        self.req_to_state_index = torch.full(
            (max_request_num + 1,), mem_manager.HOLD_STATE_INDEX, dtype=torch.int32
        )
        self.can_use_req_size = max_request_num
        self.mem_manager = mem_manager

    def alloc(self, need_size):
        if need_size > self.can_use_req_size:
            logger.error(f"Insufficient requested capacity, remaining {self.can_use_req_size}")
            return None
        select_index = torch.nonzero(self.req_state == 0).reshape(-1)[:need_size]
        self.req_state[select_index] = 1
        self.can_use_req_size -= len(select_index)
        self.req_to_state_index[select_index] = self.mem_manager.alloc(len(select_index))
        return select_index

    def free(self, free_req_index):
        self.can_use_req_size += len(free_req_index)
        self.req_state[free_req_index] = 0
        self.mem_manager.free(self.req_to_state_index[free_req_index].clone())
        self.req_to_state_index[free_req_index] = self.mem_manager.HOLD_STATE_INDEX


class ReplayReqManager(ReqManager):
    """Request manager of speculative decoding (MTP): keeps each request's rings as they were
    before its draft tokens, to roll back the rejected ones."""

    def __init__(self, max_request_num, max_sequence_length, mem_manager):
        super().__init__(max_request_num, max_sequence_length, mem_manager)
        mm, rows = mem_manager, max_request_num + 1
        ring_shape = (mm.layer_num, rows, mm.num_v_heads, mm.replay_len, mm.head_dim)
        key_shape = (mm.layer_num, rows, mm.num_k_heads, mm.replay_len, mm.head_dim)
        self.spec_delta = torch.zeros(ring_shape, dtype=mm.dtype)
        self.spec_key = torch.zeros(key_shape, dtype=mm.dtype)
        self.spec_alpha = torch.zeros(ring_shape)  # expect-bug: default-dtype
        self.spec_write_pos = torch.zeros((rows,), dtype=torch.int32)

    def save_spec_checkpoint(self, req_idx, write_pos):
        mm = self.mem_manager
        slots = self.req_to_state_index[req_idx].long()
        self.spec_delta[:, req_idx] = mm.delta_buffer[:, slots]
        self.spec_key[:, req_idx] = mm.key_buffer[:, slots]
        self.spec_alpha[:, req_idx] = mm.alpha_buffer[:, slots].to(self.spec_alpha.dtype)
        self.spec_write_pos[req_idx] = write_pos


def _mem_manager():
    mm = ReplayStateMemoryManager(3, torch.bfloat16, 1, 2, 4, 4, layer_num=2)
    mm.alpha_buffer.copy_(-torch.rand(mm.alpha_buffer.shape))
    return mm


def build_req_manager():
    req_manager = ReqManager(3, 16, _mem_manager())
    req_manager.free(req_manager.alloc(2)[:1])
    return req_manager


def build_spec_req_manager():
    req_manager = ReplayReqManager(3, 16, _mem_manager())
    req_idx = req_manager.alloc(2)
    req_manager.save_spec_checkpoint(req_idx, torch.tensor([1, 3], dtype=torch.int32))
    return req_manager
