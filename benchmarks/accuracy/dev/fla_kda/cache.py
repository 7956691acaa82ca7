"""The `past_key_values` object of fla models: one dict of states per layer."""

from typing import Any, Optional

import torch


class Cache:
    def __init__(self, seen_tokens: int = 0) -> None:
        self.states: list[dict[str, Any]] = []
        self._seen_tokens = seen_tokens

    def __getitem__(self, layer_idx: int) -> dict[str, Any]:
        return self.states[layer_idx]

    def __len__(self) -> int:
        return len(self.states)

    def update(
        self,
        recurrent_state: Optional[torch.Tensor] = None,
        replay_state: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
        layer_idx: int = 0,
        offset: int = 1,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if len(self.states) <= layer_idx:
            state = dict(recurrent_state=recurrent_state, replay_state=replay_state)
            self.states.append(state)
        else:
            state = self.states[layer_idx]
            if recurrent_state is not None:
                state["recurrent_state"] = recurrent_state
            if replay_state is not None:
                state["replay_state"] = replay_state
        if layer_idx == 0:
            self._seen_tokens += offset
        return state

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._seen_tokens if len(self.states) > layer_idx else 0

    def to_legacy_cache(self) -> tuple[dict[str, Any], ...]:
        return tuple(self.states)

    @classmethod
    def from_legacy_cache(cls, past_key_values: Optional[tuple[dict[str, Any], ...]] = None, seen_tokens: int = 0) -> "Cache":
        cache = cls(seen_tokens)
        for layer_idx, state in enumerate(past_key_values or ()):
            cache.update(layer_idx=layer_idx, offset=0, **state)
        return cache
