"""Per-batch inputs of a forward (lightllm/common/basemodel/infer_struct.py)."""

import torch

from .mem_manager import ReplayStateMemoryManager
from .req_manager import ReqManager


class KimiLinearInferStateInfo:
    def __init__(self):
        self.batch_size = None
        self.b_req_idx = None
        self.b_seq_len = None
        self.is_prefill = None
        self.mem_manager = None
        self.req_manager = None
        self.data_type = None
        self.b_state_idx = None
        self.b_write_pos = None
        self.is_draft_first_step = False

    def init_some_extra_state(self, model, input_ids):
        self.b_state_idx = self.req_manager.req_to_state_index[self.b_req_idx]
        self.b_write_pos = ((self.b_seq_len - 1) % self.mem_manager.replay_len).to(torch.int32)

    def gather_replay_rings(self, layer_num):
        """This batch's rings of one layer, one contiguous row per request (for the kernels
        that take no slot indexes)."""
        mm, idx = self.mem_manager, self.b_state_idx.long()
        delta = mm.delta_buffer[layer_num][idx]
        key = mm.key_buffer[layer_num][idx]
        alpha = mm.alpha_buffer[layer_num][idx].type_as(delta)  # expect-bug: cast
        return {"delta": delta, "key": key, "alpha": alpha}


class ReplayGraphBuffers:
    """Static inputs of the captured decode graphs: a batch's rings are gathered into these
    before a replay and scattered back after it."""

    def __init__(self, max_batch_size, mem_manager):
        mm = mem_manager
        ring_shape = (mm.layer_num, max_batch_size, mm.num_v_heads, mm.replay_len, mm.head_dim)
        key_shape = (mm.layer_num, max_batch_size, mm.num_k_heads, mm.replay_len, mm.head_dim)
        self.b_state_idx = torch.full((max_batch_size,), mm.HOLD_STATE_INDEX, dtype=torch.int32)
        self.b_write_pos = torch.zeros((max_batch_size,), dtype=torch.int32)
        self.delta_rows = torch.zeros(ring_shape, dtype=mm.delta_buffer.dtype)
        self.key_rows = torch.zeros(key_shape, dtype=mm.key_buffer.dtype)
        self.alpha_rows = torch.full(ring_shape, 0.0)  # expect-bug: default-dtype


def _batch():
    mm = ReplayStateMemoryManager(3, torch.bfloat16, 1, 2, 4, 4, layer_num=2)
    mm.alpha_buffer.copy_(-torch.rand(mm.alpha_buffer.shape))
    infer_state = KimiLinearInferStateInfo()
    infer_state.req_manager = ReqManager(3, 16, mm)
    infer_state.b_req_idx = infer_state.req_manager.alloc(2)
    infer_state.b_seq_len = torch.tensor([5, 2], dtype=torch.int32)
    infer_state.mem_manager, infer_state.data_type = mm, mm.dtype
    infer_state.init_some_extra_state(None, torch.tensor([3, 4]))
    return infer_state


def build_gathered_rings():
    return _batch().gather_replay_rings(1)


def build_graph_buffers():
    return ReplayGraphBuffers(2, _batch().mem_manager)
