import abc


class BaseInferenceContext(abc.ABC):
    """Base class for inference contexts: the memory a model needs between forward passes.

    The static context (``StaticInferenceContext``) serves one batch of same-length prompts; the
    dynamic one (``DynamicInferenceContext``) manages a pool of request slots.
    """

    def __init__(self, materialize_only_last_token_logits: bool):
        self.materialize_only_last_token_logits = materialize_only_last_token_logits

    @abc.abstractmethod
    def is_static_batching(self) -> bool:
        """Return `True` if working with static batching."""

    def is_dynamic_batching(self) -> bool:
        """Return `True` if working with dynamic batching."""
        return not self.is_static_batching()

    @abc.abstractmethod
    def is_decode_only(self) -> bool:
        """Whether the next forward pass decodes one token per sequence."""
