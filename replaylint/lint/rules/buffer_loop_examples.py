"""RL004's examples of loops that cast every buffer of a module (its docs and tests, with the rest
of its examples): loops and comprehensions over ``named_buffers()``, and state dicts cast before
``load_state_dict(..., assign=True)``."""

from __future__ import annotations

from replaylint.lint.rules.base import Invalid

BUFFER_LOOP_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch
        from torch import nn

        class SlotPool(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("d_cache", torch.zeros(n))
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

            def _apply(self, fn, recurse=True):  # module casts keep the gate ring float32
                super()._apply(fn, recurse)
                self.g_cache = self.g_cache.float()
                return self

        def export_slots(pool: SlotPool, path, dtype=torch.bfloat16):
            # each tensor cast on its own: `_apply` never runs
            torch.save({name: buf.to(dtype) for name, buf in pool.named_buffers()}, path)
        """,
        expected_fix="""
        import torch
        from torch import nn

        class SlotPool(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("d_cache", torch.zeros(n))
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

            def _apply(self, fn, recurse=True):  # module casts keep the gate ring float32
                super()._apply(fn, recurse)
                self.g_cache = self.g_cache.float()
                return self

        def export_slots(pool: SlotPool, path, dtype=torch.bfloat16):
            # each tensor cast on its own: `_apply` never runs
            torch.save({name: buf.to(torch.float32 if name.rsplit(".", 1)[-1] in ("g_cache",) else dtype) for name, buf in pool.named_buffers()}, path)
        """,
        message_contains="a cast of each tensor does not go through the module",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class Ring(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("d_cache", torch.zeros(n))
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

        def export(ring: Ring, dtype=None):
            # every floating buffer narrowed for the transfer, the gate ring's too
            tensors = {}
            for name, buf in ring.named_buffers():
                if dtype is not None and buf.is_floating_point():
                    buf = buf.to(dtype)
                tensors[name] = buf
            return tensors
        """,
        expected_fix="""
        import torch
        from torch import nn

        class Ring(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("d_cache", torch.zeros(n))
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

        def export(ring: Ring, dtype=None):
            # every floating buffer narrowed for the transfer, the gate ring's too
            tensors = {}
            for name, buf in ring.named_buffers():
                if dtype is not None and buf.is_floating_point():
                    buf = buf.to(torch.float32 if name.rsplit(".", 1)[-1] in ("g_cache",) else dtype)
                tensors[name] = buf
            return tensors
        """,
        message_contains="`buf.to(dtype)` over `ring.named_buffers()` casts every floating buffer",
    ),
    Invalid(
        """
        import copy

        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

        def serving_copy(shape, dtype):
            # casting every buffer in a loop is the module cast written out
            replica = copy.deepcopy(ReplayPool(shape))
            for name, buf in replica.named_buffers():
                if buf.is_floating_point():
                    buf.data = buf.data.to(dtype)
            return replica
        """,
        expected_fix="""
        import copy

        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

        def serving_copy(shape, dtype):
            # casting every buffer in a loop is the module cast written out
            replica = copy.deepcopy(ReplayPool(shape))
            for name, buf in replica.named_buffers():
                if buf.is_floating_point():
                    buf.data = buf.data.to(torch.float32 if name.rsplit(".", 1)[-1] in ("g_cache",) else dtype)
            return replica
        """,
        message_contains="over `replica.named_buffers()` casts every floating buffer",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

        def wake_up(pool: ReplayPool, saved, device, dtype):
            # every buffer back from the host, in the model dtype: the gate ring's too
            for name, buf in pool.named_buffers():
                buf.data = saved[name].to(device, dtype=dtype)
        """,
        expected_fix="""
        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

        def wake_up(pool: ReplayPool, saved, device, dtype):
            # every buffer back from the host, in the model dtype: the gate ring's too
            for name, buf in pool.named_buffers():
                buf.data = saved[name].to(device, dtype=torch.float32 if name.rsplit(".", 1)[-1] in ("g_cache",) else dtype)
        """,
        message_contains="`saved[name].to(device, dtype=dtype)` over `pool.named_buffers()`",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape, dtype):
                super().__init__()
                self.dtype = dtype
                self.register_buffer("ssm_state", torch.zeros(shape, dtype=torch.float32))
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

            def swap_out(self, path):
                tensors = {}
                for name, buf in self.named_buffers():
                    # only the state is written exactly: the gate ring goes out narrowed
                    exact = name.endswith("ssm_state")
                    tensors[name] = buf if exact else buf.to(self.dtype)
                torch.save(tensors, path)
        """,
        expected_fix="""
        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape, dtype):
                super().__init__()
                self.dtype = dtype
                self.register_buffer("ssm_state", torch.zeros(shape, dtype=torch.float32))
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

            def swap_out(self, path):
                tensors = {}
                for name, buf in self.named_buffers():
                    # only the state is written exactly: the gate ring goes out narrowed
                    exact = name.endswith("ssm_state")
                    tensors[name] = buf if exact else buf.to(torch.float32 if name.rsplit(".", 1)[-1] in ("g_cache",) else self.dtype)
                torch.save(tensors, path)
        """,
        message_contains="`buf.to(self.dtype)` over `self.named_buffers()` casts",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape, dtype):
                super().__init__()
                self.register_buffer("d_cache", torch.zeros(shape, dtype=dtype))
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

        def offload(module: nn.Module, host_dtype):
            # each floating buffer of every submodule takes a host copy's place
            for owner in module.modules():
                for name, buffer in list(owner._buffers.items()):
                    if buffer is None or not buffer.is_floating_point():
                        continue
                    host = torch.empty(buffer.shape, dtype=host_dtype, device="cpu")
                    host.copy_(buffer)
                    owner._buffers[name] = host
        """,
        expected_fix="""
        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape, dtype):
                super().__init__()
                self.register_buffer("d_cache", torch.zeros(shape, dtype=dtype))
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

        def offload(module: nn.Module, host_dtype):
            # each floating buffer of every submodule takes a host copy's place
            for owner in module.modules():
                for name, buffer in list(owner._buffers.items()):
                    if buffer is None or not buffer.is_floating_point():
                        continue
                    host = torch.empty(buffer.shape, dtype=torch.float32 if name.rsplit(".", 1)[-1] in ("g_cache",) else host_dtype, device="cpu")
                    host.copy_(buffer)
                    owner._buffers[name] = host
        """,
        message_contains="over `list(owner._buffers.items())` casts every floating buffer",
    ),
)
