"""Text generation controller (cf. megatron/core/inference/text_generation_controllers)."""

from typing import Dict, List, Optional

import torch

from mcore_kda.core.inference.contexts.dynamic_context import DynamicInferenceContext
from mcore_kda.core.inference.contexts.static_context import StaticInferenceContext
from mcore_kda.core.inference.model_inference_wrappers.kimi_linear_inference_wrapper import (
    AbstractModelInferenceWrapper,
)
from mcore_kda.core.utils import get_model_config


class TextGenerationController:
    """The text generation controller (the main sampling loop)

    This class tokenizes the input, runs inference, samples from logits, and detokenizes the output.
    Tokens are integer ids here: there is no tokenizer.

    Args:
        inference_wrapped_model (AbstractModelInferenceWrapper): A model that is wrapped using the
            specs given in the abstract_model_inference_wrapper.py
        tokenizer (_type_): Tokenizer used for tokenizing and detokenizing the prompts
    """

    def __init__(self, inference_wrapped_model: AbstractModelInferenceWrapper, tokenizer=None):
        self.inference_wrapped_model = inference_wrapped_model
        self.tokenizer = tokenizer
        self.model_config = get_model_config(inference_wrapped_model.model)

    @staticmethod
    def sample_from_logits(last_token_logits: torch.Tensor, temperature: float = 1.0, top_k: int = 1):
        """Greedy sampling (top_k == 1) of the next token of every sequence."""
        if top_k != 1:
            raise NotImplementedError("only greedy sampling is supported")
        return last_token_logits.argmax(dim=-1)

    def generate_all_output_tokens_static_batch(
        self, prompts_tokens: torch.Tensor, num_tokens_to_generate: int
    ) -> torch.Tensor:
        """Prefill the static batch of prompts and decode ``num_tokens_to_generate`` tokens."""
        wrapper = self.inference_wrapped_model
        context: StaticInferenceContext = wrapper.inference_context
        inference_input = wrapper.prep_inference_input(prompts_tokens)
        logits = wrapper.run_one_forward_step(inference_input)
        context.increment_sequence_len_offset(prompts_tokens.size(1))
        first = self.sample_from_logits(logits[:, -1])
        generated = self.decode_static_batch(first, num_tokens_to_generate - 1)
        return torch.cat([prompts_tokens, first[:, None], generated], dim=1)

    def decode_static_batch(self, last_tokens: torch.Tensor, num_tokens_to_generate: int) -> torch.Tensor:
        """Decode from the current state of the static context, one token per step."""
        wrapper = self.inference_wrapped_model
        context: StaticInferenceContext = wrapper.inference_context
        generated: List[torch.Tensor] = []
        tokens = last_tokens
        for _ in range(num_tokens_to_generate):
            logits = wrapper.run_one_forward_step({"tokens": tokens[:, None]})
            context.increment_sequence_len_offset(1)
            context.advance_kda_write_pos(self.model_config.kda_ring_length)
            tokens = self.sample_from_logits(logits[:, -1])
            generated.append(tokens)
        if not generated:
            return last_tokens.new_zeros(last_tokens.size(0), 0)
        return torch.stack(generated, dim=1)

    def generate_all_output_tokens_dynamic_batch(
        self, context: DynamicInferenceContext, prompts: Dict[int, List[int]], num_tokens_to_generate: int
    ) -> Dict[int, torch.Tensor]:
        """Prefill each request into its slot, then decode all of them together."""
        wrapper = self.inference_wrapped_model
        wrapper.prep_model_for_inference()
        wrapper.inference_context = context
        outputs: Dict[int, List[int]] = {}
        for request_id, prompt in prompts.items():
            context.add_request(request_id, prompt_length=len(prompt))
            context.initialize_prefill(request_id)
            logits = wrapper.run_one_forward_step({"tokens": torch.tensor([prompt], dtype=torch.long)})
            outputs[request_id] = [*prompt, int(self.sample_from_logits(logits[0, -1]))]
        request_ids = list(prompts)
        context.initialize_decode(request_ids)
        for _ in range(num_tokens_to_generate - 1):
            tokens = torch.tensor([[outputs[r][-1]] for r in request_ids], dtype=torch.long)
            logits = wrapper.run_one_forward_step({"tokens": tokens})
            context.update_requests()
            for row, request_id in enumerate(request_ids):
                outputs[request_id].append(int(self.sample_from_logits(logits[row, -1])))
        return {request_id: torch.tensor(tokens) for request_id, tokens in outputs.items()}
