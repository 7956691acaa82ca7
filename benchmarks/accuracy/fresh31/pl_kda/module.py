"""The LightningModule: Kimi Linear with ReplaySSM decode rings kept as non-persistent buffers.

``configure_model`` builds the network and the rings (so that ``"bf16-true"`` runs create them
directly in the half dtype); the checkpoint and the log-decay ring are pinned to float32 through
``convert_module``/``.to()``/``.half()``. ``predict_step`` decodes the batch token by token on the
module's rings, or on rings that a callback put into the batch (``batch["rings"]``).
"""

import os
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

from pl_kda.config import KDAConfig
from pl_kda.lite import LightningModule, Trainer
from pl_kda.modeling import KimiLinear
from pl_kda.ops import advance_write_pos, fused_recurrent_kda_replayssm_decode

RING_BUFFERS = ("ssm_state", "delta_ring", "key_ring", "gate_log_ring", "write_pos")


class KDALitModule(LightningModule):
    _fp32_buffers = ("ssm_state", "gate_log_ring")

    def __init__(
        self,
        vocab_size: int = 64,
        hidden_size: int = 32,
        num_layers: int = 2,
        num_heads: int = 2,
        num_v_heads: int = 4,
        head_dim: int = 8,
        v_head_dim: int = 8,
        ring_len: int = 4,
        max_slots: int = 2,
        lower_bound: float = -5.0,
        learning_rate: float = 3e-4,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = KDAConfig.from_hparams(self.hparams)
        self.model: Optional[KimiLinear] = None
        self.eval_rings: Optional[Dict[str, torch.Tensor]] = None

    # model and rings --------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.model is not None:
            return
        cfg, slots = self.config, self.hparams.max_slots
        shapes = cfg.ring_shapes(slots)
        self.model = KimiLinear(cfg)
        self.register_buffer("ssm_state", torch.zeros(cfg.num_layers, *shapes["state"], dtype=torch.float32), persistent=False)
        self.register_buffer("delta_ring", torch.zeros(cfg.num_layers, *shapes["delta"]), persistent=False)
        self.register_buffer("key_ring", torch.zeros(cfg.num_layers, *shapes["key"]), persistent=False)
        self.register_buffer("gate_log_ring", torch.zeros(cfg.num_layers, *shapes["gate"]), persistent=False)  # expect-bug: default-dtype
        self.register_buffer("write_pos", torch.zeros(cfg.num_layers, slots, dtype=torch.int32), persistent=False)

    def _apply(self, fn: Any, recurse: bool = True) -> "KDALitModule":
        kept = {name: self._buffers[name] for name in self._fp32_buffers if self._buffers.get(name) is not None}
        super()._apply(fn, recurse)
        for name, buffer in kept.items():
            self._buffers[name] = buffer.to(device=self._buffers[name].device)
        return self

    def replay_rings(self) -> Dict[str, torch.Tensor]:
        return {
            "ssm_state": self.ssm_state,
            "delta_cache": self.delta_ring,
            "key_cache": self.key_ring,
            "log_g_cache": self.gate_log_ring,
            "write_pos": self.write_pos,
        }

    def reset_slot(self, slot: int) -> None:
        for name in RING_BUFFERS:
            getattr(self, name)[:, slot].zero_()

    # decoding ---------------------------------------------------------------------------------
    def decode_tokens(self, input_ids: torch.Tensor, slots: torch.Tensor, rings: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` of ``input_ids [B, T]`` decoded one token at a time on ``slots``."""
        rings = rings if rings is not None else self.replay_rings()
        cfg = self.config
        logits = []
        for t in range(input_ids.shape[1]):
            x = self.model.embed(input_ids[:, t])
            for i, block in enumerate(self.model.layers):
                mixer = block.mixer
                mixed_qkv, a, b = mixer.project(block.input_norm(x))
                write_pos = rings["write_pos"][i]
                positions = write_pos[slots.long()]
                out, _ = fused_recurrent_kda_replayssm_decode(
                    mixed_qkv, a, b, mixer.A_log, mixer.dt_bias, mixer.scale,
                    rings["ssm_state"][i], rings["delta_cache"][i], rings["key_cache"][i], rings["log_g_cache"][i],
                    slots, positions,
                    use_qk_l2norm_in_kernel=cfg.use_qk_l2norm, lower_bound=cfg.lower_bound,
                )
                advance_write_pos(write_pos, slots, positions, cfg.ring_len)
                x = x + mixer.o_proj(out.flatten(1).to(x.dtype))
                x = x + block.mlp(block.post_norm(x))
            logits.append(self.model.lm_head(self.model.norm(x)))
        return torch.stack(logits, dim=1)

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Prefills every slot from ``prompt_ids [slots, n]`` (``n < ring_len``); returns the last logits.

        The prompt rows are left in the rings and the checkpoints stay empty, so that the
        speculative decoder can still take back prompt-lookup drafts (a rollback only moves
        ``write_pos``). All rows of a layer are computed at once from the prompt's projections.
        """
        cfg = self.config
        slots, n = prompt_ids.shape
        if n >= cfg.ring_len:
            raise ValueError(f"a prompt of {n} tokens does not fit a ring of {cfg.ring_len}")
        group = cfg.num_v_heads // cfg.num_heads
        pad = (0, 0, 0, cfg.ring_len - n)
        x = self.model.embed(prompt_ids)
        d_layers: List[torch.Tensor] = []
        k_layers: List[torch.Tensor] = []
        g_layers: List[torch.Tensor] = []
        for block in self.model.layers:
            mixer = block.mixer
            h = block.input_norm(x)
            mixed_qkv, a, b = mixer.project(h)
            q, k, v = mixer.split_heads(mixed_qkv)
            g = mixer.prompt_log_decay(a)
            beta = torch.sigmoid(b.float())
            kh = k.repeat_interleave(group, dim=2)
            qh = q.repeat_interleave(group, dim=2) * mixer.scale
            state = torch.zeros(slots, cfg.num_v_heads, cfg.v_head_dim, cfg.head_dim)
            deltas, outs = [], []
            for t in range(n):
                decay = g[:, t].float().exp()
                predicted = torch.einsum("shvk,shk->shv", state, decay * kh[:, t])
                delta = beta[:, t].unsqueeze(-1) * (v[:, t].float() - predicted)
                read = torch.einsum("shvk,shk->shv", state, decay * qh[:, t])
                outs.append(read + delta * (kh[:, t] * qh[:, t]).sum(-1, keepdim=True))
                state = state * decay.unsqueeze(2) + delta.unsqueeze(-1) * kh[:, t].unsqueeze(2)
                deltas.append(delta)
            d_layers.append(F.pad(torch.stack(deltas, dim=2), pad))
            k_layers.append(F.pad(k.transpose(1, 2), pad))
            g_layers.append(F.pad(g.transpose(1, 2), pad))
            x = x + mixer.o_proj(torch.stack(outs, dim=1).flatten(2).to(x.dtype))
            x = x + block.mlp(block.post_norm(x))
        self.delta_ring = torch.stack(d_layers).to(self.delta_ring.dtype)
        self.key_ring = torch.stack(k_layers).to(self.key_ring.dtype)
        self.gate_log_ring = torch.stack(g_layers)  # expect-bug: promotion id=prompt-prime
        self.ssm_state.zero_()
        self.write_pos.fill_(n)
        return self.model.lm_head(self.model.norm(x[:, -1]))

    # steps ------------------------------------------------------------------------------------
    def on_predict_start(self) -> None:
        if self.trainer.precision in ("16-true", "16-mixed") and self.config.lower_bound is None:
            # float16 softplus of large gate inputs overflows in the fused kernel's prologue
            raise ValueError("float16 prediction needs a bounded gate (lower_bound)")

    def validation_step(self, batch: Dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self.decode_tokens(batch["input_ids"], batch["slots"], self.eval_rings)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch["input_ids"][:, 1:].flatten())
        self.log("val_loss", loss)
        return loss

    def predict_step(self, batch: Dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> Dict[str, torch.Tensor]:
        logits = self.decode_tokens(batch["input_ids"], batch["slots"], batch.get("rings"))
        return {"next_token": logits[:, -1].argmax(-1), "slots": batch["slots"]}

    # checkpoints ------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        # the rings are non-persistent, so they are not in the state_dict; keep the live streams
        # next to it (floating tensors in the module dtype, like the weights) so a resumed predict
        # run continues them
        checkpoint["replay_state"] = {
            name: (buffer.to(self.dtype) if buffer.is_floating_point() else buffer).clone()  # expect-bug: load id=ckpt-rings
            for name, buffer in self.named_buffers()
            if name in RING_BUFFERS
        }

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        saved = checkpoint.get("replay_state")
        if not saved:
            return
        self.configure_model()
        for name, tensor in saved.items():
            setattr(self, name, tensor)  # expect-bug: load id=ckpt-rings


def _datamodule(num_batches: int = 3) -> Any:
    from pl_kda.datamodule import PromptDataModule

    return PromptDataModule(num_slots=2, tokens_per_batch=3, num_batches=num_batches)


def build_trainer_predict_bf16_true() -> KDALitModule:
    """``Trainer(precision="bf16-true").predict``: the rings are created under the plugin."""
    torch.manual_seed(0)
    module = KDALitModule()
    Trainer(precision="bf16-true").predict(module, _datamodule())
    return module


def build_resume_bf16_weights(tmp_dir: str) -> Dict[str, KDALitModule]:
    """A module served in bf16 (its float32 rings pinned), checkpointed and loaded back."""
    torch.manual_seed(0)
    module = KDALitModule()
    module.configure_model()
    module = module.to(torch.bfloat16)
    trainer = Trainer(precision="32-true")
    trainer.predict(module, _datamodule(2))
    path = os.path.join(tmp_dir, "checkpoints", "last.ckpt")
    trainer.save_checkpoint(path)
    resumed = KDALitModule.load_from_checkpoint(path)
    return {"served": module, "resumed": resumed}


def build_trainer_resume_bf16_mixed(tmp_dir: str) -> Dict[str, Any]:
    """``"bf16-mixed"`` predict, a checkpoint, and a second predict resumed from it."""
    torch.manual_seed(0)
    module = KDALitModule()
    trainer = Trainer(precision="bf16-mixed")
    first = trainer.predict(module, _datamodule(2))
    path = os.path.join(tmp_dir, "mixed.ckpt")
    trainer.save_checkpoint(path)
    resumed = KDALitModule()
    Trainer(precision="bf16-mixed").predict(resumed, _datamodule(1), ckpt_path=path)
    return {"module": module, "resumed": resumed, "first_tokens": torch.stack([p["next_token"] for p in first])}


def build_pinned_module_casts() -> Dict[str, Any]:
    """Full-precision rings, then the module cast with ``.half()`` and ``.to(bfloat16)``."""
    torch.manual_seed(0)
    half = KDALitModule()
    half.configure_model()
    half = half.half()
    torch.manual_seed(0)
    bf16 = KDALitModule()
    bf16.configure_model()
    bf16.to(torch.bfloat16)
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        bf16.decode_tokens(ids, torch.arange(2, dtype=torch.int32))
    return {"half": half, "bf16": bf16}


def build_short_prompt_prefill_bf16() -> KDALitModule:
    """A bf16-weight module prefilled from three-token prompts, then decoding on."""
    torch.manual_seed(0)
    module = KDALitModule()
    module.configure_model()
    module.to(torch.bfloat16)
    module.prefill(torch.randint(0, 64, (2, 3)))
    with torch.no_grad():
        module.decode_tokens(torch.randint(0, 64, (2, 2)), torch.arange(2, dtype=torch.int32))
    return module


def build_short_prompt_prefill_fp32() -> KDALitModule:
    """The same prefill on a full-precision module."""
    torch.manual_seed(0)
    module = KDALitModule()
    module.configure_model()
    module.prefill(torch.randint(0, 64, (2, 3)))
    with torch.no_grad():
        module.decode_tokens(torch.randint(0, 64, (2, 2)), torch.arange(2, dtype=torch.int32))
    return module
