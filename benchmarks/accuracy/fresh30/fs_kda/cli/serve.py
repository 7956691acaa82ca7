#!/usr/bin/env python3 -u
"""A streaming server: live requests share the slots of one pool (continuous batching).

Each ``step()`` advances every request that holds a slot by one token (prompt tokens first,
then greedy output). When more requests arrive than there are slots, the server preempts one
(its slot is swapped out to host memory) and resumes it when a slot frees up. The pool belongs
to the server, not to the model, so that a model reload (``reload``) keeps live requests.
"""

import argparse
import logging
import os
from typing import Dict, List, Optional

import torch

from fs_kda import checkpoint_utils, options, utils
from fs_kda.dataclass.configs import SlotPoolConfig
from fs_kda.modules import kda_ops
from fs_kda.modules.slot_state_pool import SlotStatePool, SwapEntry

logger = logging.getLogger("fs_kda.cli.serve")


class Request:
    def __init__(self, rid: str, prompt: List[int]):
        self.rid = rid
        self.pending = list(prompt)
        self.tokens: List[int] = []
        self.outputs: List[int] = []
        self.next_token: Optional[int] = None
        self.slot: Optional[int] = None


class SlotServer:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        use_cuda = torch.cuda.is_available() and not args.cpu
        self.device = torch.device("cuda") if use_cuda else torch.device("cpu")
        self.dtype = utils.model_dtype(args)
        self.model = self._load(args)
        ring_len = args.ring_len or self.model.args.ring_len
        pool = SlotStatePool(SlotPoolConfig(max_slots=args.max_requests, ring_len=ring_len), self.model.decoder.layer_shapes())
        self.pool = pool.to(device=self.device, dtype=self.dtype)  # expect-bug: module-cast
        self.model.decoder.attach_slot_pool(self.pool)
        self.requests: Dict[str, Request] = {}
        self.swapped: Dict[str, SwapEntry] = {}
        self.request_cache: Dict[str, List[int]] = {}  # finished request -> its output tokens

    def _load(self, args: argparse.Namespace) -> torch.nn.Module:
        models, _ = checkpoint_utils.load_model_ensemble(
            args.path.split(os.pathsep), arg_overrides=utils.parse_overrides(args.model_overrides)
        )
        model = models[0]
        if args.fp16:
            model.half()
        elif args.bf16:
            model.bfloat16()
        model.to(self.device)
        model.prepare_for_inference_(argparse.Namespace(**dict(vars(args), max_slots=0)))
        return model

    def reload(self) -> None:
        """Loads the checkpoint again (e.g. after an update) and hands it the live pool."""
        self.model = self._load(self.args)
        self.model.decoder.attach_slot_pool(self.pool)

    def submit(self, rid: str, prompt: List[int]) -> Request:
        request = Request(rid, prompt)
        self.requests[rid] = request
        if self.pool.free_slots:
            request.slot = self.pool.alloc(rid)
        return request

    def preempt(self, rid: str) -> None:
        request = self.requests[rid]
        self.swapped[rid] = self.pool.swap_out(request.slot)
        self.pool.release(rid)
        request.slot = None

    def resume(self, rid: str) -> None:
        request = self.requests[rid]
        request.slot = self.pool.alloc(rid)
        self.pool.swap_in(request.slot, self.swapped.pop(rid))

    def finish(self, rid: str) -> List[int]:
        request = self.requests.pop(rid)
        if request.slot is not None:
            self.pool.release(rid)
        self.request_cache[rid] = request.outputs
        return request.outputs

    @torch.no_grad()
    def step(self) -> Dict[str, int]:
        active = [r for r in self.requests.values() if r.slot is not None]
        if not active:
            return {}
        tokens = []
        for request in active:
            if request.pending:
                token = request.pending.pop(0)
            else:
                token = request.next_token
                request.outputs.append(token)
            request.tokens.append(token)
            tokens.append(token)
        slots = torch.tensor([r.slot for r in active], dtype=torch.int32, device=self.device)
        logits = self.model.decoder.forward_slots(torch.tensor(tokens, device=self.device), slots)
        for request, row in zip(active, logits):
            if not request.pending:
                request.next_token = int(row.argmax())
        return {r.rid: r.next_token for r in active if r.next_token is not None}


def _server(tmp_dir: str, *flags: str) -> SlotServer:
    path = checkpoint_utils.write_tiny_checkpoint(os.path.join(tmp_dir, "checkpoint_best.pt"))
    argv = ["--path", path, "--cpu", "--max-requests", "2", *flags]
    return SlotServer(options.parse_args_and_arch(options.get_serve_parser(), argv))


def _traffic(server: SlotServer) -> None:
    server.submit("a", [3, 4, 5])
    server.submit("b", [6, 7])
    for _ in range(4):
        server.step()
    server.preempt("b")
    server.submit("c", [8, 9])  # takes b's slot
    for _ in range(3):
        server.step()
    server.finish("c")
    server.resume("b")
    for _ in range(3):
        server.step()


def build_server_fp32(tmp_dir: str) -> Dict[str, object]:
    """A float32 server: two requests, one preempted for a third and resumed."""
    server = _server(tmp_dir)
    _traffic(server)
    return {"pool": server.pool, "decode": dict(kda_ops.last_decode_call()), "outputs": server.request_cache}


def build_server_bf16(tmp_dir: str) -> Dict[str, object]:
    """The same traffic on a --bf16 server."""
    server = _server(tmp_dir, "--bf16")
    _traffic(server)
    return {"pool": server.pool, "decode": dict(kda_ops.last_decode_call()), "outputs": server.request_cache}
