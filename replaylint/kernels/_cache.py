"""``ReplaySSMCache``: a state pool that follows the dtype rule, and owns the ring cursors.

This is where the dtype rule lives in code: the checkpoint state in the chosen dtype, the d and
k rings in the state's dtype (or one given), the g ring always float32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from replaylint.guards import as_fp32_gate_cache
from replaylint.kernels._decode import decode_with_cursor_step
from replaylint.kernels._validate import STATE_DTYPES, DecodeArgs

__all__ = ["ReplaySSMCache", "next_write_pos"]

_SNAPSHOT_KEYS = ("state", "d_cache", "k_cache", "g_cache", "write_pos")


def next_write_pos(
    write_pos: torch.Tensor,
    ring_len: int,
    force_flush: torch.Tensor | None = None,
) -> torch.Tensor:
    """The cursors after one decode step: 0 where the step flushed, ``c + 1`` elsewhere.

    Per row, as the kernel sees it: ``c = clamp(write_pos[b], 0, L - 1)`` and the step flushed
    when ``c == L - 1`` or ``force_flush[b] != 0``. Runs on the cursors' device without a
    synchronisation (CUDA-graph safe). Returns a new int32 tensor.
    """
    if ring_len < 1:
        raise ValueError(f"ring_len: expected an int >= 1, got {ring_len}")
    c = write_pos.clamp(0, ring_len - 1)
    flush = c == ring_len - 1
    if force_flush is not None:
        flush = flush | (force_flush != 0)
    return torch.where(flush, torch.zeros_like(c), c + 1).to(torch.int32)


class ReplaySSMCache:
    """A ReplaySSM state pool for ``slots`` sequences, with one ring cursor per slot.

    Tensors (all on ``device``):

    * ``state``   ``[slots, HV, V, K]``  checkpoint state, ``state_dtype`` (fp32, bf16, fp16);
    * ``d_cache`` ``[slots, HV, L, V]``  and ``k_cache`` ``[slots, H, L, K]`` in ``cache_dtype``
      (default: ``state_dtype``);
    * ``g_cache`` ``[slots, HV, L, K]``  always float32 (its prefix sums are exponentiated);
    * ``write_pos`` ``[slots]`` int32: ring rows in use per slot.

    :meth:`decode` runs one step for a batch of rows and advances their cursors on the device,
    so a sequence of decode calls can be captured in a CUDA graph. Two rows of one batch must
    not name the same slot.
    """

    def __init__(
        self,
        slots: int,
        num_heads: int,
        num_value_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        ring_len: int = 16,
        *,
        state_dtype: torch.dtype = torch.float32,
        cache_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        for name, value in (
            ("slots", slots),
            ("num_heads", num_heads),
            ("num_value_heads", num_value_heads),
            ("head_k_dim", head_k_dim),
            ("head_v_dim", head_v_dim),
            ("ring_len", ring_len),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if num_value_heads % num_heads != 0:
            raise ValueError(
                f"num_value_heads: expected a multiple of num_heads ({num_heads}), "
                f"got {num_value_heads}"
            )
        if state_dtype not in STATE_DTYPES:
            raise ValueError(
                f"state_dtype: expected torch.float32, torch.bfloat16 or torch.float16, "
                f"got {state_dtype}"
            )
        cache_dtype = state_dtype if cache_dtype is None else cache_dtype
        if not cache_dtype.is_floating_point:
            raise ValueError(f"cache_dtype: expected a floating-point dtype, got {cache_dtype}")
        self.ring_len = ring_len
        self.num_heads = num_heads
        dev = torch.device("cpu") if device is None else torch.device(device)
        HV, H, K, V, L = num_value_heads, num_heads, head_k_dim, head_v_dim, ring_len
        self.state = torch.zeros(slots, HV, V, K, dtype=state_dtype, device=dev)
        self.d_cache = torch.zeros(slots, HV, L, V, dtype=cache_dtype, device=dev)
        self.k_cache = torch.zeros(slots, H, L, K, dtype=cache_dtype, device=dev)
        # Gate log-decays: summed and exponentiated by every rebuild, so never below float32.
        self.g_cache = torch.zeros(slots, HV, L, K, dtype=torch.float32, device=dev)
        # One extra cursor at index `slots` absorbs the writes of padding rows, so advancing
        # needs neither a mask nor a host synchronisation.
        self._cursors = torch.zeros(slots + 1, dtype=torch.int32, device=dev)

    @property
    def slots(self) -> int:
        return self.state.size(0)

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def write_pos(self) -> torch.Tensor:
        """Ring rows in use per slot, ``[slots]`` int32 (a view; do not resize)."""
        return self._cursors[: self.slots]

    def _rows(self, ssm_state_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's cursor index (``slots`` for padding rows) and its validity."""
        if ssm_state_indices.dtype != torch.int32 or ssm_state_indices.dim() != 1:
            raise ValueError(
                "ssm_state_indices: expected a 1-D torch.int32 tensor, got "
                f"{ssm_state_indices.dtype} of shape {tuple(ssm_state_indices.shape)}"
            )
        valid = (ssm_state_indices >= 0) & (ssm_state_indices < self.slots)
        scratch = torch.full_like(ssm_state_indices, self.slots)
        return torch.where(valid, ssm_state_indices, scratch).long(), valid

    def write_pos_for(self, ssm_state_indices: torch.Tensor) -> torch.Tensor:
        """The per-row cursors the kernel takes: ``write_pos[slot]`` (0 for padding rows)."""
        rows, valid = self._rows(ssm_state_indices)
        return torch.where(valid, self._cursors[rows], 0)

    def advance(
        self,
        ssm_state_indices: torch.Tensor,
        write_pos: torch.Tensor,
        force_flush: torch.Tensor | None = None,
    ) -> None:
        """Move the cursors of the rows that just ran a step with per-row cursors ``write_pos``.

        0 where the step flushed, ``c + 1`` elsewhere (see :func:`next_write_pos`); padding rows
        leave every cursor alone. On the device, no synchronisation.
        """
        rows, _ = self._rows(ssm_state_indices)
        self._cursors.index_copy_(0, rows, next_write_pos(write_pos, self.ring_len, force_flush))

    def decode(
        self,
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
        scale: float,
        out: torch.Tensor,
        ssm_state_indices: torch.Tensor,
        force_flush: torch.Tensor | None = None,
        use_qk_l2norm_in_kernel: bool = False,
        lower_bound: float | None = None,
    ) -> torch.Tensor:
        """Run one decode step on this pool with :func:`replayssm_decode`, advancing the
        cursors of the rows in the batch. Returns ``out``.

        Arguments are validated first (nothing moves on an error); then one small launch
        gathers the rows' cursors and advances them, and the decode kernel runs on the
        gathered values (two launches per step, no synchronisation).
        """
        # The per-row cursors the cursor step fills (a non-tensor index argument is reported
        # by the checks).
        write_pos = (
            torch.empty_like(ssm_state_indices)
            if isinstance(ssm_state_indices, torch.Tensor)
            else ssm_state_indices
        )
        args = DecodeArgs(
            mixed_qkv,
            a,
            b,
            A_log,
            dt_bias,
            scale,
            self.state,
            self.d_cache,
            self.k_cache,
            self.g_cache,
            out,
            ssm_state_indices,
            write_pos,
            force_flush,
            use_qk_l2norm_in_kernel,
            lower_bound,
        )
        decode_with_cursor_step(args, self.write_pos)
        return out

    def reset(self, slots: Sequence[int] | torch.Tensor) -> None:
        """Start new sequences in ``slots``: zero state and rings, cursor 0.

        ``slots`` is integer slot indices (a sequence or an integer tensor), or a bool tensor of
        length ``slots`` that marks the slots to clear. Float indices are refused rather than
        truncated. Checks the indices on the host (a synchronisation for device tensors): keep
        it out of captured CUDA graphs.
        """
        index = self._reset_index(slots)
        if index.numel():
            bad = (index < 0) | (index >= self.slots)
            if bool(bad.any()):
                raise ValueError(
                    f"slots: expected indices in [0, {self.slots}), got {index[bad].tolist()}"
                )
        self.state.index_fill_(0, index, 0)
        self.d_cache.index_fill_(0, index, 0)
        self.k_cache.index_fill_(0, index, 0)
        self.g_cache.index_fill_(0, index, 0)
        self._cursors.index_fill_(0, index, 0)

    def _reset_index(self, slots: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """The slot indices ``reset`` clears, as a long tensor on the pool's device."""
        if isinstance(slots, torch.Tensor):
            given = slots
        else:  # an empty sequence would come out as float32
            given = torch.as_tensor(slots) if len(slots) else torch.zeros(0, dtype=torch.long)
        if given.dtype == torch.bool:
            mask = given.reshape(-1)
            if mask.numel() != self.slots:
                raise ValueError(
                    f"slots: expected a bool mask of length {self.slots}, got {mask.numel()}"
                )
            return mask.to(self.device).nonzero().reshape(-1)
        if given.dtype.is_floating_point or given.dtype.is_complex:
            raise ValueError(
                "slots: expected integer slot indices or a bool mask, got "
                f"{given.dtype} values (float indices would be truncated)"
            )
        return given.to(device=self.device, dtype=torch.long).reshape(-1)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A snapshot (copies) of the pool and its cursors."""
        return {
            "state": self.state.clone(),
            "d_cache": self.d_cache.clone(),
            "k_cache": self.k_cache.clone(),
            "g_cache": self.g_cache.clone(),
            "write_pos": self.write_pos.clone(),
        }

    def load_state_dict(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        """Restore a snapshot taken by :meth:`state_dict` (possibly saved and loaded elsewhere).

        Shapes must match this pool. The state and the d/k rings must come in this pool's
        dtypes; a gate cache in any other dtype is cast to float32 with a warning (the values
        lost to a low-precision save stay lost, but they stop compounding here).
        """
        missing = [key for key in _SNAPSHOT_KEYS if key not in snapshot]
        extra = [key for key in snapshot if key not in _SNAPSHOT_KEYS]
        if missing or extra:
            raise ValueError(
                f"snapshot: expected keys {list(_SNAPSHOT_KEYS)}, "
                f"missing {missing}, unexpected {extra}"
            )
        targets = {
            "state": self.state,
            "d_cache": self.d_cache,
            "k_cache": self.k_cache,
            "g_cache": self.g_cache,
            "write_pos": self.write_pos,
        }
        for key, target in targets.items():
            value = snapshot[key]
            if not isinstance(value, torch.Tensor) or value.shape != target.shape:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
                raise ValueError(
                    f"snapshot[{key!r}]: expected shape {tuple(target.shape)}, got {got}"
                )
            if key != "g_cache" and value.dtype != target.dtype:
                raise ValueError(
                    f"snapshot[{key!r}]: expected dtype {target.dtype} (this pool's), got "
                    f"{value.dtype}. Build the cache with matching dtypes, or cast the snapshot."
                )
        gate = as_fp32_gate_cache(snapshot["g_cache"])  # warns when it has to cast
        for key, target in targets.items():
            target.copy_(gate if key == "g_cache" else snapshot[key])
