from .vllm_engine import ColocatedLLMRayActor, LLMRayActor, create_vllm_engines

__all__ = ["ColocatedLLMRayActor", "LLMRayActor", "create_vllm_engines"]
