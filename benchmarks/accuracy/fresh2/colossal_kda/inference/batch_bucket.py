from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

import torch

from colossal_kda.inference.config import InferenceConfig
from colossal_kda.inference.kv_cache.kvcache_manager import KVCacheManager


@dataclass
class Sequence:
    """Store information of input sequence."""

    request_id: int
    prompt: str
    input_token_id: List[int]
    block_size: int
    max_output_len: int = 256
    output_token_id: List[int] = field(default_factory=list)

    @property
    def sentence_len(self) -> int:
        return len(self.input_token_id) + len(self.output_token_id)

    def check_finish(self) -> bool:
        return len(self.output_token_id) >= self.max_output_len


class BatchBucket:
    """Container for a batch of Sequences, which is used to manage the batch of sequences.

    Attrs:
        _sequences_dict (Dict[int, Sequence]): Map sequence uid to sequence struct
            seq_uid -> Sequence
        _sequences_indexes (Dict[int, int]): Map sequence uid to index in the batch
            seq_uid -> index in the batch (indexing used in sequence_lengths and block_tables)
        _sequence_lengths (torch.Tensor): Length of each sequence in the batch.
            The size of the tensor is (max_batch_size,)
        _block_tables (torch.Tensor): Block table of each sequence in the batch
            The size of the tensor is (max_batch_size, max_blocks_per_seq)
        _kda_slots, _kda_write_pos (torch.Tensor): KDA state slot and ring cursor of each sequence
    """

    def __init__(self, num_heads: int, num_v_heads: int, head_dim: int, max_batch_size: int, max_length: int,
                 block_size: int, kda_ring_len: int, num_kda_layers: int, device: torch.device = None,
                 dtype: torch.dtype = torch.float16, use_spec_dec: bool = False, max_n_spec_tokens: int = 5):
        self.max_batch_size = max_batch_size
        self.block_size = block_size
        self.kda_ring_len = kda_ring_len
        self.max_blocks_per_sequence = (max_length + block_size - 1) // block_size
        self.device = device or torch.device("cpu")
        self.dtype = dtype
        self._use_spec_dec = use_spec_dec
        self.num_tokens_to_verify = None

        self._current_batch_size = 0
        self._sequences_dict: Dict[int, Sequence] = dict()
        self._sequences_indexes: Dict[int, int] = dict()  # deque(maxlen=self.max_batch_size)
        self._sequence_lengths = torch.zeros((self.max_batch_size,), dtype=torch.int32)
        self._block_tables = torch.full((self.max_batch_size, self.max_blocks_per_sequence), -1, dtype=torch.int32)
        self._kda_slots = torch.zeros((self.max_batch_size,), dtype=torch.int32)
        self._kda_write_pos = torch.zeros_like(self._kda_slots)

        if use_spec_dec:
            # ring entries of the drafted tokens, committed to the pool for the accepted ones
            shape = (num_kda_layers, max_batch_size, num_v_heads, max_n_spec_tokens, head_dim)
            self._verify_d = torch.zeros(shape, dtype=dtype, device=self.device)
            self._verify_k = torch.zeros(shape[:2] + (num_heads,) + shape[3:], dtype=dtype, device=self.device)
            self._verify_gate = torch.zeros_like(self._verify_k)  # expect-bug: like

    @property
    def current_batch_size(self) -> int:
        return self._current_batch_size

    def add_seqs(self, seqs: List[Sequence], alloc_block_table_fn: Callable[[torch.Tensor, int], None] = None,
                 alloc_kda_slot_fn: Callable[[], int] = None) -> None:
        for seq in seqs:
            assert seq.request_id not in self._sequences_dict, f"Sequence {seq.request_id} already in bucket"
            index = self._current_batch_size
            self._sequences_dict[seq.request_id] = seq
            self._sequences_indexes[seq.request_id] = index
            self._sequence_lengths[index] = seq.sentence_len
            if alloc_block_table_fn is not None:
                alloc_block_table_fn(self._block_tables[index], seq.sentence_len)
            if alloc_kda_slot_fn is not None:
                self._kda_slots[index] = alloc_kda_slot_fn()
            self._kda_write_pos[index] = min(seq.sentence_len, self.kda_ring_len) % self.kda_ring_len
            self._current_batch_size += 1

    def pop_finished(self, free_block_table_fn: Callable = None, free_kda_slot_fn: Callable = None) -> List[Sequence]:
        finished = [seq for seq in self._sequences_dict.values() if seq.check_finish()]
        for seq in finished:
            index = self._sequences_indexes.pop(seq.request_id)
            del self._sequences_dict[seq.request_id]
            if free_block_table_fn is not None:
                free_block_table_fn(self._block_tables[index])
            if free_kda_slot_fn is not None:
                free_kda_slot_fn(int(self._kda_slots[index]))
            self._current_batch_size -= 1
        return finished

    def get_1D_inputs(self) -> torch.Tensor:
        last = [(seq.output_token_id or seq.input_token_id)[-1] for seq in self._sequences_dict.values()]
        return torch.tensor(last, dtype=torch.long, device=self.device)

    def get_block_table_tensor(self) -> torch.Tensor:
        return self._block_tables[: self._current_batch_size]

    def get_sequence_lengths(self) -> torch.Tensor:
        return self._sequence_lengths[: self._current_batch_size]

    def get_kda_inputs(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(ssm_state_indices, write_pos) of the running sequences."""
        return self._kda_slots[: self._current_batch_size], self._kda_write_pos[: self._current_batch_size]

    def append_batch_tokens(self, tokens: torch.Tensor) -> None:
        for seq, token in zip(self._sequences_dict.values(), tokens.tolist()):
            seq.output_token_id.append(token)
        bsz = self._current_batch_size
        self._sequence_lengths[:bsz] += 1
        self._kda_write_pos[:bsz] = (self._kda_write_pos[:bsz] + 1) % self.kda_ring_len

    def get_verify_buffers(self) -> Dict[str, torch.Tensor]:
        return {"d": self._verify_d, "k": self._verify_k, "verify_gate": self._verify_gate}

    def commit_verified(self, kv_cache_manager: KVCacheManager, n_accepted: int) -> None:
        """Write the ring entries of the first `n_accepted` drafted tokens into the state pool."""
        bsz, L = self._current_batch_size, self.kda_ring_len
        for layer in range(self._verify_gate.shape[0]):
            _, d_cache, k_cache, gate_cache = kv_cache_manager.get_kda_cache(layer)
            for b in range(bsz):
                slot, pos = int(self._kda_slots[b]), int(self._kda_write_pos[b])
                for j in range(n_accepted):
                    d_cache[slot, :, (pos + j) % L].copy_(self._verify_d[layer, b, :, j])
                    k_cache[slot, :, (pos + j) % L].copy_(self._verify_k[layer, b, :, j])
                    gate_cache[slot, :, (pos + j) % L].copy_(self._verify_gate[layer, b, :, j])
        self._kda_write_pos[:bsz] = (self._kda_write_pos[:bsz] + n_accepted) % L


def _bucket_and_manager(use_spec_dec: bool = False):
    from colossal_kda.inference.modeling.models.kimi_linear import KimiLinearConfig

    mc = KimiLinearConfig()
    config = InferenceConfig(max_batch_size=2, max_input_len=8, max_output_len=8, block_size=4, kda_ring_len=4,
                             dtype="bf16", kda_gate_dtype="fp32", use_spec_dec=use_spec_dec, max_n_spec_tokens=2)
    manager = KVCacheManager(config, mc)
    bucket = BatchBucket(mc.kda_num_heads, mc.kda_num_v_heads, mc.kda_head_dim, config.max_batch_size, 16,
                         config.block_size, config.kda_ring_len, len(mc.kda_layer_idx), dtype=config.dtype,
                         use_spec_dec=use_spec_dec, max_n_spec_tokens=config.max_n_spec_tokens)
    seqs = [Sequence(0, "a", [3, 1, 4], 4, max_output_len=2), Sequence(1, "b", [1, 5], 4, max_output_len=2)]
    bucket.add_seqs(seqs, manager.allocate_context_from_block_table, manager.allocate_kda_slot)
    return bucket, manager


def build_batch_bucket():
    bucket, manager = _bucket_and_manager()
    bucket.append_batch_tokens(torch.tensor([9, 2]))
    slots, write_pos = bucket.get_kda_inputs()
    return {"block_tables": bucket.get_block_table_tensor(), "sequence_lengths": bucket.get_sequence_lengths(),
            "kda_slots": slots, "kda_write_pos": write_pos, "pool": manager.get_kda_caches()}


def build_batch_bucket_spec_dec():
    bucket, manager = _bucket_and_manager(use_spec_dec=True)
    bucket.num_tokens_to_verify = 2
    verify = bucket.get_verify_buffers()
    verify["d"].fill_(0.5)
    verify["k"].fill_(-0.5)
    verify["verify_gate"].fill_(-0.25)
    bucket.commit_verified(manager, 1)
    return {"verify": verify, "pool": manager.get_kda_caches(), "kda_write_pos": bucket.get_kda_inputs()[1]}
