"""Training strategy: seeding, model preparation and checkpointing (a single-process stand-in
for the DeepSpeed engine setup, with the same call signatures as the trainer uses)."""

import json
import os
import random
import shutil
from collections import defaultdict
from datetime import timedelta
from typing import List, Tuple, Union

import numpy as np
import torch
import torch.nn as nn

ModelOptimPair = Tuple[nn.Module, torch.optim.Optimizer]
ModelOrModelOptimPair = Union[nn.Module, ModelOptimPair]


class DeepspeedStrategy:
    """The strategy for training with accelerator."""

    def __init__(
        self,
        seed: int = 42,
        full_determinism: bool = False,
        max_norm: float = 0.0,
        micro_train_batch_size=1,
        train_batch_size=1,
        zero_stage=2,
        bf16=True,
        args=None,
    ) -> None:
        self.args = args
        self.stage = zero_stage
        self.train_batch_size = train_batch_size
        self.micro_train_batch_size = micro_train_batch_size
        self.bf16 = bf16
        self.seed = seed
        self.full_determinism = full_determinism
        self.max_norm = max_norm
        self.is_rlhf = False
        self.time_steps = defaultdict(int)
        self.world_size = 1

    def set_seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def setup_distributed(self, timeout=timedelta(minutes=60)) -> None:
        self.set_seed(self.seed)
        self.world_size = 1
        self.accumulated_gradient = self.train_batch_size // self.micro_train_batch_size // self.world_size

    def create_optimizer(self, model, **kwargs) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self._unwrap_model(model).parameters(), **kwargs)

    def prepare(
        self, *models_or_model_optim_pairs: ModelOrModelOptimPair, is_rlhf=False
    ) -> Union[List[ModelOrModelOptimPair], ModelOrModelOptimPair]:
        ret = []
        self.is_rlhf = is_rlhf
        for arg in models_or_model_optim_pairs:
            if isinstance(arg, tuple):
                assert len(arg) == 3, f'Expect (model, optimizer, scheduler) pair, got a tuple with size "{len(arg)}"'
                if arg[0] is not None:
                    ret.append(self._ds_init_train_model(*arg))
                else:
                    ret.append((None, None, None))
            else:
                ret.append(self._ds_init_eval_model(arg))
        return ret[0] if len(ret) == 1 else ret

    def _ds_init_train_model(self, model, optim, scheduler):
        model.train()
        return model, optim, scheduler

    def _ds_init_eval_model(self, model):
        if not model:
            return model
        self._unwrap_model(model).requires_grad_(False)
        return model.eval()

    def _unwrap_model(self, model) -> nn.Module:
        inner = getattr(model, "model", None)
        return inner if isinstance(inner, nn.Module) else model

    def save_model(self, model: nn.Module, tokenizer, output_dir, **kwargs) -> None:
        os.makedirs(output_dir, exist_ok=True)
        model_to_save = self._unwrap_model(model)
        state_dict = {k: v.detach().cpu().clone() for k, v in model_to_save.state_dict().items()}
        torch.save(state_dict, os.path.join(output_dir, "pytorch_model.bin"))
        config = getattr(model_to_save, "config", None)
        if config is not None:
            with open(os.path.join(output_dir, "config.json"), "w") as f:
                json.dump({k: v for k, v in vars(config).items() if isinstance(v, (int, float, str, type(None)))}, f)

    def load_model(self, model: nn.Module, path: str, map_location="cpu", strict: bool = False, key_replace_fn=None):
        unwrapped_model = self._unwrap_model(model)
        state_dict = torch.load(path, map_location=map_location)
        if key_replace_fn:
            state_dict = key_replace_fn(state_dict)
        unwrapped_model.load_state_dict(state_dict, strict=strict)

    def save_ckpt(self, model, save_dir, tag=None, max_num=3, max_mem=1000, client_state={}, save_latest=True):
        os.makedirs(save_dir, exist_ok=True)
        tag = tag or f"global_step{client_state.get('global_step', 0)}"
        subdirs = sorted(d for d in os.listdir(save_dir) if os.path.isdir(os.path.join(save_dir, d)))
        while len(subdirs) >= max_num:
            shutil.rmtree(os.path.join(save_dir, subdirs.pop(0)))
        os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
        payload = {"module": self._unwrap_model(model).state_dict(), "client_state": client_state}
        torch.save(payload, os.path.join(save_dir, tag, "mp_rank_00_model_states.pt"))
        if save_latest:
            with open(os.path.join(save_dir, "latest"), "w") as f:
                f.write(tag)

    def load_ckpt(
        self,
        model,
        load_dir,
        tag=None,
        load_module_strict=True,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
        load_module_only=False,
    ):
        if tag is None:
            with open(os.path.join(load_dir, "latest")) as f:
                tag = f.read().strip()
        load_path = os.path.join(load_dir, tag, "mp_rank_00_model_states.pt")
        payload = torch.load(load_path, map_location="cpu")
        self._unwrap_model(model).load_state_dict(payload["module"], strict=load_module_strict)
        return load_path, payload["client_state"]

    def all_reduce(self, data, op="mean"):
        return data

    def all_gather(self, data):
        return data

    def print(self, *msg):
        if self.is_rank_0() and os.environ.get("OPENRLHF_KDA_VERBOSE"):
            print(*msg)

    def is_rank_0(self) -> bool:
        return True

    def get_rank(self) -> int:
        return 0


def build_strategy_checkpoint(tmp_dir: str) -> dict:
    """A bf16 actor checkpointed after one rollout, decoded further, then restored from the checkpoint
    and from the exported model weights."""
    from ..models.actor import Actor, KDAConfig, KDAForCausalLM
    from .utils import get_strategy, get_train_ppo_args

    torch.manual_seed(0)
    args = get_train_ppo_args(bf16=True, ckpt_path=os.path.join(tmp_dir, "checkpoints_ppo"))
    strategy = get_strategy(args)
    strategy.setup_distributed()
    actor = strategy.prepare(Actor(KDAForCausalLM(KDAConfig()), bf16=strategy.args.bf16))
    prompts = torch.tensor([[4, 1, 6], [2, 2, 8]], dtype=torch.long)
    actor.generate(prompts, max_new_tokens=1)
    strategy.save_ckpt(actor.model, args.ckpt_path, client_state={"global_step": 1, "consumed_samples": 2})
    strategy.save_model(actor, None, os.path.join(tmp_dir, "hf"))
    actor.generate(prompts.flip(0), max_new_tokens=2)
    _, client_state = strategy.load_ckpt(actor.model, args.ckpt_path)
    reloaded = Actor(KDAForCausalLM(KDAConfig()), bf16=True)
    strategy.load_model(reloaded, os.path.join(tmp_dir, "hf", "pytorch_model.bin"), strict=True)
    return {
        "actor": actor.model,
        "reloaded": reloaded.model,
        "consumed_samples": torch.tensor(client_state["consumed_samples"]),
    }
