"""Prompt streams for streaming validation and batched prediction.

Each of ``num_slots`` cache slots gets a stream of token ids (one prompt after another); a batch
holds the next ``tokens_per_batch`` tokens of every slot, the slot indices (int32) and a
``new_stream`` flag per slot that tells the callbacks to reset that slot's rings.
"""

from typing import Any, Dict, List, Optional, Sequence

import torch

from pl_kda.lite import LightningDataModule

DEFAULT_PROMPTS = (
    "the quick brown fox",
    "jumps over the lazy dog",
    "kimi delta attention",
    "replay the rings",
    "lightning fabric",
    "bf16 true",
)


class ByteTokenizer:
    def __init__(self, vocab_size: int = 64, bos_id: int = 1) -> None:
        self.vocab_size = vocab_size
        self.bos_id = bos_id

    def encode(self, text: str) -> List[int]:
        return [self.bos_id] + [2 + (byte % (self.vocab_size - 2)) for byte in text.encode("utf-8")]


class PromptDataModule(LightningDataModule):
    def __init__(
        self,
        prompts: Optional[Sequence[str]] = None,
        num_slots: int = 2,
        tokens_per_batch: int = 3,
        num_batches: Optional[int] = None,
        vocab_size: int = 64,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["prompts"])
        self.prompts = list(prompts or DEFAULT_PROMPTS)
        self.tokenizer = ByteTokenizer(vocab_size)
        # g(lyph) cache of the tokenizer: prompt text -> token ids
        self.g_cache: Dict[str, List[int]] = {}
        self.slot_table = torch.full((num_slots,), -1, dtype=torch.int32)
        self._batches: List[Dict[str, torch.Tensor]] = []

    def _encode(self, text: str) -> List[int]:
        if text not in self.g_cache:
            self.g_cache[text] = self.tokenizer.encode(text)
        return self.g_cache[text]

    def setup(self, stage: str) -> None:
        slots, width = self.hparams.num_slots, self.hparams.tokens_per_batch
        streams: List[List[int]] = [[] for _ in range(slots)]
        starts: List[set] = [set() for _ in range(slots)]
        for index, text in enumerate(self.prompts):
            slot = index % slots
            starts[slot].add(len(streams[slot]))
            streams[slot].extend(self._encode(text))
        length = min(len(stream) for stream in streams) // width * width
        if self.hparams.num_batches is not None:
            length = min(length, self.hparams.num_batches * width)
        self.slot_table = torch.arange(slots, dtype=torch.int32)
        self._batches = []
        for begin in range(0, length, width):
            ids = torch.tensor([stream[begin : begin + width] for stream in streams], dtype=torch.long)
            new_stream = torch.tensor([any(begin <= s < begin + width for s in starts[slot]) for slot in range(slots)])
            self._batches.append({"input_ids": ids, "slots": self.slot_table.clone(), "new_stream": new_stream})

    def val_dataloader(self) -> List[Dict[str, torch.Tensor]]:
        return [dict(batch) for batch in self._batches]

    def predict_dataloader(self) -> List[Dict[str, torch.Tensor]]:
        return [dict(batch) for batch in self._batches]
