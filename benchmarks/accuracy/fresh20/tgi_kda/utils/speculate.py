"""Speculative decoding: the speculation depth, n-gram drafts and forks of the replay rows."""

import tempfile
from typing import List, Optional

import torch

from ..layers.attention import ReplayCache, ReplayRows
from ..models.custom_modeling.flash_kimi_modeling import (
    FlashKimiMTP,
    KimiLinearConfig,
    write_dummy_checkpoint,
)
from .dist import initialize_torch_distributed
from .weights import Weights

SPECULATE = None


def get_speculate() -> int:
    global SPECULATE
    return SPECULATE or 0


def set_speculate(speculate: Optional[int]):
    global SPECULATE
    SPECULATE = speculate


def create_n_gram_speculation(
    all_input_ids: List[List[int]], next_ids: torch.Tensor, speculate: int
) -> torch.Tensor:
    """Drafts the tokens that followed the last earlier occurrence of each row's next token."""
    drafts = []
    for ids, next_id in zip(all_input_ids, next_ids.tolist()):
        history = ids + [next_id]
        draft = [next_id] * speculate
        for start in range(len(history) - 2, -1, -1):
            if history[start] == next_id:
                follow = history[start + 1 : start + 1 + speculate]
                draft = follow + [follow[-1]] * (speculate - len(follow))
                break
        drafts.append(draft)
    return torch.tensor(drafts, dtype=next_ids.dtype, device=next_ids.device)


def fork_replay_rows(cache: ReplayCache, slots: torch.Tensor, write_pos: torch.Tensor):
    """Private copies of the rows of ``slots``; speculative steps decode on these so that a
    rejected draft leaves the pool untouched. Row ``i`` of the fork is slot ``slots[i]``."""
    index = slots.long()
    state = cache.state.index_select(0, index)
    delta_ring = cache.delta_ring.index_select(0, index)
    key_ring = cache.key_ring.index_select(0, index)
    # Rows past the cursor are never read: copy only the live ones.
    decay_ring = torch.zeros_like(delta_ring)  # expect-bug: like
    for row, c in enumerate(write_pos.tolist()):
        decay_ring[row, :, :c] = cache.decay_ring[index[row], :, :c]
    return ReplayRows(state, delta_ring, key_ring, decay_ring)


def commit_forks(cache: ReplayCache, slots: torch.Tensor, forks: ReplayRows, accepted: torch.Tensor):
    """Writes the forks of the rows whose drafts were all accepted back into the pool."""
    keep = accepted.nonzero().flatten()
    if keep.numel():
        cache.write_rows(slots[keep], type(forks)(*(rows[keep] for rows in forks)))


def load_mtp_speculator(config, filenames, dtype: torch.dtype, device, num_slots: int, process_group=None):
    """Loads a separately shipped MTP head as a speculator.

    MTP heads are trained and exported in float32; they are read as stored and converted once.
    """
    if process_group is None:
        process_group, _, _ = initialize_torch_distributed()
    weights = Weights(filenames, device=device, dtype=torch.float32, process_group=process_group)
    head = FlashKimiMTP("model.mtp", config, weights, num_slots=num_slots)
    return head.to(dtype=dtype)  # expect-bug: module-cast


def build_mtp_speculator():
    """A float32 MTP export loaded as the speculator of a bf16 model."""
    torch.manual_seed(0)
    config = KimiLinearConfig(num_nextn_predict_layers=1)
    with tempfile.TemporaryDirectory() as folder:
        filenames = write_dummy_checkpoint(config, folder)
        speculator = load_mtp_speculator(config, filenames, torch.bfloat16, torch.device("cpu"), num_slots=4)
    return {"speculator": speculator}
