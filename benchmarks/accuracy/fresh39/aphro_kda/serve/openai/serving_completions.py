"""OpenAI-compatible /v1/completions handler on top of the Aphrodite engine."""
from typing import Dict, List, Optional, Union

import torch

from ...common.logger import init_logger
from ...engine.aphrodite_engine import AphroditeEngine
from ...modeling.sampler import SamplingParams
from ...processing.preemption import SequenceSnapshot, read_block, write_block
from .protocol import CompletionRequest, CompletionResponse, CompletionResponseChoice, ErrorResponse, StateHandoff

logger = init_logger(__name__)


def _tokenize(prompt: Union[str, List[int]], vocab_size: int) -> List[int]:
    return list(prompt) if isinstance(prompt, list) else [b % vocab_size for b in prompt.encode()]


class OpenAIServingCompletion:
    def __init__(self, engine: AphroditeEngine, served_model_names: List[str]) -> None:
        self.engine = engine
        self.served_model_names = served_model_names
        self.vocab_size = engine.model_config.hf_config["vocab_size"]
        self.staged: Dict[str, StateHandoff] = {}
        self._counter = 0

    async def create_completion(self, request: CompletionRequest) -> Union[CompletionResponse, ErrorResponse]:
        if request.model not in self.served_model_names:
            return ErrorResponse(f"The model `{request.model}` does not exist.", code=404)
        request_id = f"cmpl-{self._counter}"
        self._counter += 1
        prompt_ids = _tokenize(request.prompt, self.vocab_size)
        params = request.to_sampling_params()
        if request.return_state:
            params.max_tokens = request.max_tokens + 1  # keep the slot alive for the export
        self.engine.add_request(request_id, prompt_ids, params)
        final = None
        while final is None:
            for output in self.engine.step():
                if output.request_id == request_id and (output.finished or len(output.output_token_ids) >= request.max_tokens):
                    final = output
        state = None
        if request.return_state:
            state = self.export_state(request_id, prompt_ids + final.output_token_ids)
            self.engine.abort_request(request_id)
        choice = CompletionResponseChoice(0, final.output_token_ids, "", "length")
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(final.output_token_ids)}
        return CompletionResponse(request.model, [choice], usage=usage, state=state)

    def export_state(self, request_id: str, token_ids: List[int], compact: bool = False) -> StateHandoff:
        request = self.engine.requests[request_id]
        cache_engine = self.engine.cache_engine
        layers = [{name: t.clone() for name, t in tensors.items()} for tensors in read_block(cache_engine, request.slot)]
        if compact:
            # halve the handoff size: the delta/key rings are already in the model dtype
            for layer in layers:
                layer["alpha_log_cache"] = layer["alpha_log_cache"].to(torch.bfloat16)  # expect-bug: cast
        return StateHandoff(request_id, token_ids, int(cache_engine.write_pos[request.slot]), layers, {"compact": compact})

    def import_state(self, handoff: StateHandoff, sampling_params: Optional[SamplingParams] = None) -> str:
        """Continues a handed-off sequence here; staged when no cache slot is free."""
        if not self.engine.free_slots:
            self.stage_state(handoff)
            return handoff.request_id
        self.engine.add_request(handoff.request_id, handoff.token_ids, sampling_params)
        request = self.engine.requests[handoff.request_id]
        request.consumed = len(handoff.token_ids) - 1
        write_block(self.engine.cache_engine, request.slot, SequenceSnapshot(handoff.request_id, handoff.write_pos, handoff.layers))
        return handoff.request_id

    def stage_state(self, handoff: StateHandoff) -> None:
        staged = []
        for layer in handoff.layers:
            staged.append({
                "ssm_state": layer["ssm_state"].to(torch.float32, copy=True),
                "delta_cache": layer["delta_cache"].clone(),
                "key_cache": layer["key_cache"].clone(),
                "alpha_log_cache": torch.empty_like(layer["delta_cache"]).copy_(layer["alpha_log_cache"]),  # expect-bug: like
            })
        self.staged[handoff.request_id] = StateHandoff(handoff.request_id, handoff.token_ids, handoff.write_pos, staged, dict(handoff.meta))
        logger.info("staged handoff %s (%d staged)", handoff.request_id, len(self.staged))


def build_handoff_roundtrip() -> Dict[str, object]:
    import asyncio

    from ...engine.args_tools import EngineArgs

    args = EngineArgs(dtype="bfloat16", load_format="dummy", max_num_seqs=2)
    source = OpenAIServingCompletion(AphroditeEngine.from_engine_args(args), ["kimi-linear-tiny"])
    target = OpenAIServingCompletion(AphroditeEngine.from_engine_args(args), ["kimi-linear-tiny"])
    request = CompletionRequest("kimi-linear-tiny", [3, 1, 4], max_tokens=2, temperature=0.0, return_state=True)
    handoff = asyncio.run(source.create_completion(request)).state
    target.import_state(handoff, SamplingParams(temperature=0.0, max_tokens=1))
    target.engine.step()
    return {"handoff": handoff, "target_cache": target.engine.cache_engine.gpu_cache}
