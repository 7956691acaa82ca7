"""Ray-Serve-style LLM deployment wrapping the Aphrodite engine.

``serve`` below is a local stand-in with the decorator/bind/run surface of ``ray.serve`` (the
package must import without Ray); under Ray the same classes deploy unchanged.
"""
import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Type

import torch

from ..common.logger import init_logger
from ..common.utils import STR_DTYPE_TO_TORCH_DTYPE
from ..engine.aphrodite_engine import AphroditeEngine
from ..engine.args_tools import EngineArgs
from ..modeling.model_loader.loader import cast_module_keep_fp32
from .openai.protocol import CompletionRequest, StateHandoff
from .openai.serving_completions import OpenAIServingCompletion

logger = init_logger(__name__)


@dataclass
class Application:
    deployment_cls: Type[Any]
    init_args: tuple
    init_kwargs: Dict[str, Any]


class _Serve:
    def deployment(self, _cls: Optional[Type[Any]] = None, *, name: Optional[str] = None, num_replicas: int = 1,
                   ray_actor_options: Optional[Dict[str, Any]] = None, user_config: Optional[Dict[str, Any]] = None,
                   **options: Any) -> Callable[[Type[Any]], Type[Any]]:
        def decorate(cls: Type[Any]) -> Type[Any]:
            cls._serve_options = {"name": name or cls.__name__, "num_replicas": num_replicas,
                                  "ray_actor_options": ray_actor_options or {}, "user_config": user_config, **options}
            cls.bind = classmethod(lambda c, *args, **kwargs: Application(c, args, kwargs))
            return cls
        return decorate(_cls) if _cls is not None else decorate

    def run(self, app: Application) -> Any:
        replica = app.deployment_cls(*app.init_args, **app.init_kwargs)
        user_config = app.deployment_cls._serve_options.get("user_config")
        if user_config and hasattr(replica, "reconfigure"):
            replica.reconfigure(user_config)
        return replica


serve = _Serve()


@dataclass
class MigrationConfig:
    """Moving running sequences between replicas (drain, rebalancing)."""

    enabled: bool = True
    preallocate_buffers: bool = False
    ring_wire_dtypes: Dict[str, str] = field(
        default_factory=lambda: {"ssm_state": "float32", "delta_cache": "auto", "key_cache": "auto", "alpha_log_cache": "auto"}  # expect-bug: container
    )


@dataclass
class LLMConfig:
    model_id: str
    engine_kwargs: Dict[str, Any] = field(default_factory=dict)
    migration: MigrationConfig = field(default_factory=MigrationConfig)
    served_model_names: Optional[List[str]] = None


@serve.deployment(name="AphroditeLLM", ray_actor_options={"num_gpus": 1}, max_ongoing_requests=64)
class AphroditeDeployment:
    def __init__(self, llm_config: LLMConfig) -> None:
        self.llm_config = llm_config
        engine_args = EngineArgs(model=llm_config.model_id, **llm_config.engine_kwargs)
        self.engine = AphroditeEngine.from_engine_args(engine_args)
        self.handler = OpenAIServingCompletion(self.engine, llm_config.served_model_names or [llm_config.model_id])
        self.max_ongoing_requests = 64
        # The replica owns its process: stray allocations follow the serving dtype.
        torch.set_default_dtype(self.engine.model_config.dtype)  # expect-bug: default-dtype id=replica-default
        if llm_config.migration.enabled and llm_config.migration.preallocate_buffers:
            self._reserve_migration_buffers()

    def _reserve_migration_buffers(self) -> None:
        shapes = self.engine.model_config.get_kda_shapes(self.engine.cache_config)
        layers, dtype = len(self.engine.cache_engine.gpu_cache), self.engine.model_config.dtype
        self.recv_buffers = {
            "ssm_state": torch.zeros((layers, *shapes.ssm_state), dtype=torch.float32),
            "delta_cache": torch.zeros((layers, *shapes.delta_cache), dtype=dtype),
            "key_cache": torch.zeros((layers, *shapes.key_cache), dtype=dtype),
            "alpha_log_cache": torch.zeros((layers, *shapes.alpha_log_cache)),  # expect-bug: default-dtype id=replica-default
        }

    def reconfigure(self, user_config: Dict[str, Any]) -> None:
        """Called by Serve with ``user_config`` at start and on every config update."""
        self.max_ongoing_requests = user_config.get("max_ongoing_requests", self.max_ongoing_requests)
        dtype_name = user_config.get("runtime_dtype")
        if dtype_name and STR_DTYPE_TO_TORCH_DTYPE[dtype_name] != self.engine.model_config.dtype:
            dtype = STR_DTYPE_TO_TORCH_DTYPE[dtype_name]
            logger.info("Switching the replica's model to %s", dtype)
            runner = self.engine.driver_worker.model_runner
            runner.model = runner.model.to(dtype)  # expect-bug: module-cast
            self.engine.model_config.dtype = dtype

    def switch_weights_dtype(self, dtype_name: str) -> None:
        """Admin endpoint: cast the weights only; caches keep their storage dtypes."""
        runner = self.engine.driver_worker.model_runner
        cast_module_keep_fp32(runner.model, STR_DTYPE_TO_TORCH_DTYPE[dtype_name])

    async def __call__(self, body: Dict[str, Any]) -> Dict[str, Any]:
        response = await self.handler.create_completion(CompletionRequest(**body))
        return {"response": response}

    def _wire_dtype(self, name: str) -> torch.dtype:
        return self.engine.model_config.dtype if name == "auto" else STR_DTYPE_TO_TORCH_DTYPE[name]

    def export_migration(self, handoff: StateHandoff) -> Dict[str, Any]:
        wire = self.llm_config.migration.ring_wire_dtypes
        layers = [{name: t.to(self._wire_dtype(wire[name])) for name, t in layer.items()} for layer in handoff.layers]
        return {"request_id": handoff.request_id, "token_ids": handoff.token_ids, "write_pos": handoff.write_pos, "layers": layers, "wire": dict(wire)}

    def import_migration(self, payload: Dict[str, Any]) -> str:
        handoff = StateHandoff(payload["request_id"], payload["token_ids"], payload["write_pos"], payload["layers"])
        return self.handler.import_state(handoff)


def _tiny_config(**engine_kwargs: Any) -> LLMConfig:
    return LLMConfig("kimi-linear-tiny", engine_kwargs={"dtype": "bfloat16", "load_format": "dummy", "max_num_seqs": 2, **engine_kwargs})


def _generate(replica: AphroditeDeployment, prompt: str, return_state: bool = False) -> Any:
    body = {"model": "kimi-linear-tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0.0, "return_state": return_state}
    return asyncio.run(replica(body))["response"]


def build_deployment_reconfigure() -> Dict[str, Any]:
    app = AphroditeDeployment.bind(_tiny_config(load_dtype="float32", in_model_cache=True))
    replica = serve.run(app)
    replica.reconfigure({"runtime_dtype": "float16"})
    _generate(replica, "hi")
    return {"state_caches": replica.engine.driver_worker.model_runner.model.state_caches}


def build_migration_export() -> Dict[str, Any]:
    replica = serve.run(AphroditeDeployment.bind(_tiny_config()))
    response = _generate(replica, "abc", return_state=True)
    return {"payload": replica.export_migration(response.state)}


def build_migration_fp32_wire() -> Dict[str, Any]:
    wire = {"ssm_state": "float32", "delta_cache": "auto", "key_cache": "auto", "alpha_log_cache": "float32"}
    source = serve.run(AphroditeDeployment.bind(_tiny_config()))
    target = serve.run(AphroditeDeployment.bind(_tiny_config()))
    source.llm_config.migration = MigrationConfig(ring_wire_dtypes=wire)
    payload = source.export_migration(_generate(source, "abc", return_state=True).state)
    target.import_migration(payload)
    target.engine.step()
    return {"payload": payload, "target_cache": target.engine.cache_engine.gpu_cache}
