"""RL003's examples of gate caches computed from activations (its docs and tests, with the rest of
its examples): log-decays worked out in the model's dtype, bound to the ring or written into it."""

from __future__ import annotations

from replaylint.lint.rules.base import Invalid, Valid

COMPUTED_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch
        import torch.nn.functional as F

        def ring_from_logits(gate_logits, ring):
            # a float32 part promotes the result; `.float()` casts each step
            g_cache = torch.stack([F.logsigmoid(x.float()) for x in gate_logits], dim=2)
            spare_g_cache = torch.cat([gate_logits[0], ring[:, :1]], dim=1)
            return g_cache, spare_g_cache

        def from_request(logits, other):
            # one call passes float32, another a tensor of unknown dtype: not decided
            return compute(logits), compute(other.to(torch.bfloat16))

        def compute(gates):
            replayssm_g = gates.cumsum(-1)
            return replayssm_g

        def build():
            logits = [torch.randn(4, 16).to(torch.bfloat16) for _ in range(3)]
            rings = from_request(torch.randn(4, 16), torch.zeros(4, 16))
            return ring_from_logits(logits, torch.zeros(4, 16)), rings
        """
    ),
    Valid(
        """
        import torch
        import torch.nn.functional as F
        from torch import nn

        class Gate(nn.Module):  # a cast first; a float32 weight with dimensions promotes
            def __init__(self, dim, g_cache):
                super().__init__()
                self.f_proj = nn.Linear(dim, dim)
                self.A_log = nn.Parameter(torch.zeros(dim, dtype=torch.float32))
                self.g_cache = g_cache  # a ring passed in: checked where it is made

            def forward(self, hidden):
                self.g_cache = F.logsigmoid(self.f_proj(hidden).float()) / 16.0
                self.replayssm_g = -self.A_log.exp() * F.softplus(self.f_proj(hidden))


        def scale(gates):
            g_cache = gates.cumsum(-1) * 0.5  # the module passes only float32
            return g_cache


        ring = scale(torch.zeros(4, 16, dtype=torch.float32))
        """
    ),
    Valid(
        """
        import torch
        import torch.nn.functional as F
        from torch import nn

        class DraftGate(nn.Module):
            def __init__(self, dim, slots, ring_len):
                super().__init__()
                self.f_proj = nn.Linear(dim, dim)
                self.register_buffer("g_cache", torch.zeros(slots, ring_len, dim, dtype=torch.float32))

            def forward(self, hidden, slot, step):
                # computed in float32, then written into the float32 ring
                self.g_cache[slot, step] = F.logsigmoid(self.f_proj(hidden).float()) / 16.0
                self.g_cache[slot].copy_(torch.zeros_like(self.g_cache[slot]))
                return hidden
        """
    ),
)

COMPUTED_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch
        import torch.nn.functional as F
        from torch import nn

        class DraftHead(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.gate_proj = nn.Linear(dim, dim)
                self.A_log = nn.Parameter(torch.zeros(dim))  # a weight: the model's dtype

            def log_decay(self, logits):
                return -self.A_log.exp() * F.softplus(logits)

            def forward(self, hidden):
                # a layer's output has the model's dtype; a number does not promote it
                self.g_cache = -5.0 * self.gate_proj(hidden).sigmoid()
                return self.log_decay(self.gate_proj(hidden)).transpose(0, 1)

            def seed(self, hidden):
                self.replayssm_g = self.forward(hidden)
        """,
        expected_fix="""
        import torch
        import torch.nn.functional as F
        from torch import nn

        class DraftHead(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.gate_proj = nn.Linear(dim, dim)
                self.A_log = nn.Parameter(torch.zeros(dim))  # a weight: the model's dtype

            def log_decay(self, logits):
                return -self.A_log.exp() * F.softplus(logits)

            def forward(self, hidden):
                # a layer's output has the model's dtype; a number does not promote it
                self.g_cache = (-5.0 * self.gate_proj(hidden).sigmoid()).to(torch.float32)
                return self.log_decay(self.gate_proj(hidden)).transpose(0, 1)

            def seed(self, hidden):
                self.replayssm_g = self.forward(hidden).to(torch.float32)
        """,
        message_contains="a layer's output, by steps that keep the model's dtype",
    ),
    Invalid(
        """
        import torch
        import torch.nn.functional as F
        from torch import nn

        class DraftGate(nn.Module):
            gate_logit_normalizer = 16.0  # a number: it does not promote

            def __init__(self, dim, slots, ring_len):
                super().__init__()
                self.f_proj = nn.Linear(dim, dim)
                self.register_buffer("g_cache", torch.zeros(slots, ring_len, dim, dtype=torch.float32))

            def log_decay(self, hidden):
                return F.logsigmoid(self.f_proj(hidden)) / self.gate_logit_normalizer

            def forward(self, hidden, slot, step):
                # the ring stays float32, but the values were rounded to the model's dtype first
                self.g_cache[slot, step] = self.log_decay(hidden)
                return hidden
        """,
        expected_fix=None,
        message_contains="the copy into the ring keeps the rounding",
    ),
    Invalid(
        """
        import torch
        import torch.nn.functional as F
        from .ops import kda_log_decay

        def prefill(attn, hidden, ring_len, fused=True):
            _, a, _ = attn.project(hidden)
            if fused:  # on this path the rows keep the activations' dtype
                rows = -attn.A_log.exp()[:, None] * F.softplus(a + attn.dt_bias)
            else:
                rows = kda_log_decay(a, attn.A_log, attn.dt_bias)
            pad = rows.new_zeros(ring_len - rows.shape[0], *rows.shape[1:])
            g_cache = torch.cat([rows, pad])
            filled = (torch.arange(ring_len) < hidden.shape[0])[:, None, None]
            replayssm_g = attn.lower_bound * torch.sigmoid(a) * filled  # a bool mask: no promotion
            return g_cache, replayssm_g
        """,
        expected_fix="""
        import torch
        import torch.nn.functional as F
        from .ops import kda_log_decay

        def prefill(attn, hidden, ring_len, fused=True):
            _, a, _ = attn.project(hidden)
            if fused:  # on this path the rows keep the activations' dtype
                rows = -attn.A_log.exp()[:, None] * F.softplus(a + attn.dt_bias)
            else:
                rows = kda_log_decay(a, attn.A_log, attn.dt_bias)
            pad = rows.new_zeros(ring_len - rows.shape[0], *rows.shape[1:])
            g_cache = torch.cat([rows, pad]).to(torch.float32)
            filled = (torch.arange(ring_len) < hidden.shape[0])[:, None, None]
            replayssm_g = (attn.lower_bound * torch.sigmoid(a) * filled).to(torch.float32)  # a bool mask: no promotion
            return g_cache, replayssm_g
        """,
        message_contains="a gate weight of the model",
    ),
)
