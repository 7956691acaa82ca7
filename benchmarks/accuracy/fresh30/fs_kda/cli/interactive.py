#!/usr/bin/env python3 -u
"""Chat with a trained model, several sessions at once (``fairseq_cli/interactive.py``).

Every session keeps its own incremental state (batch of one). Sessions that speak in the same
turn are stepped together: their states are concatenated into one batch, stepped, and split
back. Idle sessions can be offloaded to ``--session-dir`` (``/offload``) and restored later;
with ``--fp16-snapshots`` the snapshot files are written in half precision.

Input lines are ``<session>: <token ids>`` to open a session, ``<session>`` to continue it,
``/offload <session>`` and ``/restore <session>``.
"""

import argparse
import logging
import os
import sys
from typing import Dict, List, Optional

import torch
from torch import Tensor

from fs_kda import checkpoint_utils, options, utils

logger = logging.getLogger("fs_kda.cli.interactive")

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class Session:
    def __init__(self, sid: str, tokens: List[int], incremental_state: IncrementalState, next_token: int):
        self.sid = sid
        self.tokens = tokens
        self.incremental_state = incremental_state
        self.next_token = next_token


class InteractiveDecoder:
    def __init__(self, args: argparse.Namespace, models: List[torch.nn.Module]):
        self.args = args
        self.model = models[0]
        self.decoder = self.model.decoder
        self.dtype = self.model.dtype
        self.sessions: Dict[str, Session] = {}
        self.history_cache: Dict[str, List[int]] = {}  # session -> every token it has seen

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "InteractiveDecoder":
        models, _ = checkpoint_utils.load_model_ensemble(
            args.path.split(os.pathsep), arg_overrides=utils.parse_overrides(args.model_overrides)
        )
        for model in models:
            if args.fp16:
                model.half()
            elif args.bf16:
                model.bfloat16()
            model.prepare_for_inference_(args)
        return cls(args, models)

    # --- sessions ------------------------------------------------------------------------

    @torch.no_grad()
    def open(self, sid: str, prompt: List[int]) -> int:
        state: IncrementalState = {}
        logits, _ = self.decoder(torch.tensor([prompt]), incremental_state=state)
        session = Session(sid, list(prompt), state, int(logits[0, -1].argmax()))
        self.sessions[sid] = session
        self.history_cache[sid] = list(prompt)
        return session.next_token

    def buffers(self, sid: str) -> List[Dict[str, Optional[Tensor]]]:
        return self.decoder.incremental_buffers(self.sessions[sid].incremental_state)

    def _merge(self, sessions: List[Session]) -> IncrementalState:
        """One incremental state whose row ``i`` is ``sessions[i]``."""
        merged_state: IncrementalState = {}
        restored = any(
            self.decoder.incremental_buffers(s.incremental_state)[0]["prev_delta"].dtype != self.dtype for s in sessions
        )
        for layer in self.decoder.layers:
            bufs = [layer.self_attn._get_input_buffer(s.incremental_state) for s in sessions]
            merged: Dict[str, Optional[Tensor]] = {}
            for key in bufs[0]:
                rows = torch.cat([b[key] for b in bufs], dim=0)
                # sessions restored from full-precision snapshots come back to the model dtype
                merged[key] = rows.to(self.dtype) if restored and key.startswith("prev_") and key != "prev_state" else rows  # expect-bug: cast
            layer.self_attn._set_input_buffer(merged_state, merged)
        return merged_state

    def _split(self, merged_state: IncrementalState, sessions: List[Session]) -> None:
        for row, session in enumerate(sessions):
            index = torch.tensor([row])
            state: IncrementalState = {}
            for layer in self.decoder.layers:
                buf = layer.self_attn._get_input_buffer(merged_state)
                layer.self_attn._set_input_buffer(state, {k: v.index_select(0, index) for k, v in buf.items()})
            session.incremental_state = state

    @torch.no_grad()
    def step(self, sids: List[str]) -> List[int]:
        """One token for each of ``sids``, stepped as one batch."""
        sessions = [self.sessions[sid] for sid in sids]
        merged = self._merge(sessions)
        tokens = [s.next_token for s in sessions]
        bucket = self.args.batch_bucket
        if bucket > 1 and len(sessions) % bucket:
            # pad the batch to the bucket size with empty rows
            extra = bucket - len(sessions) % bucket
            self.decoder.extend_incremental_state(merged, extra)
            tokens += [self.model.args.pad] * extra
        logits, _ = self.decoder(torch.tensor(tokens).unsqueeze(1), incremental_state=merged)
        self._split(merged, sessions)
        for session, row in zip(sessions, logits[:, -1]):
            session.tokens.append(session.next_token)
            self.history_cache[session.sid].append(session.next_token)
            session.next_token = int(row.argmax())
        return [s.next_token for s in sessions]

    # --- offloading ----------------------------------------------------------------------

    def _snapshot_path(self, sid: str) -> str:
        return os.path.join(self.args.session_dir, f"{sid}.pt")

    def offload(self, sid: str) -> str:
        session = self.sessions.pop(sid)
        payload = {
            "tokens": torch.tensor(session.tokens),
            "next_token": session.next_token,
            "layers": [dict(buf) for buf in self.decoder.incremental_buffers(session.incremental_state)],
        }
        if self.args.fp16_snapshots:
            payload = checkpoint_utils.convert_state_dict_type(payload, torch.HalfTensor)  # expect-bug: load id=half-snapshots
        else:
            payload = utils.move_to_cpu(payload)
        os.makedirs(self.args.session_dir, exist_ok=True)
        path = self._snapshot_path(sid)
        torch.save(payload, path)
        return path

    def restore(self, sid: str) -> Session:
        """Restores an offloaded session with the tensors of its snapshot."""
        payload = torch.load(self._snapshot_path(sid), map_location="cpu", weights_only=True)
        state: IncrementalState = {}
        for layer, buf in zip(self.decoder.layers, payload["layers"]):
            layer.self_attn._set_input_buffer(state, buf)  # expect-bug: load id=half-snapshots
        session = Session(sid, payload["tokens"].tolist(), state, int(payload["next_token"]))
        self.sessions[sid] = session
        return session

    def restore_into_fresh(self, sid: str) -> Session:
        """Restores an offloaded session into newly allocated buffers of the model's dtype."""
        payload = torch.load(self._snapshot_path(sid), map_location="cpu", weights_only=True)
        state: IncrementalState = {}
        for layer, saved in zip(self.decoder.layers, payload["layers"]):
            attn = layer.self_attn
            shapes = attn.buffer_shapes(1)
            buf = {name: torch.zeros(shapes[name], dtype=self.dtype) for name in ("prev_delta", "prev_key", "prev_log_decay")}  # expect-bug: pool-dtype
            buf["prev_state"] = torch.zeros(shapes["prev_state"], dtype=torch.float32)
            buf["write_pos"] = torch.zeros(1, dtype=torch.int32)
            for key, value in saved.items():
                buf[key].copy_(value)
            attn._set_input_buffer(state, buf)
        session = Session(sid, payload["tokens"].tolist(), state, int(payload["next_token"]))
        self.sessions[sid] = session
        return session


def cli_main(argv: Optional[List[str]] = None, lines: Optional[List[str]] = None) -> InteractiveDecoder:
    parser = options.get_interactive_generation_parser()
    args = options.parse_args_and_arch(parser, argv)
    chat = InteractiveDecoder.from_args(args)
    for line in lines if lines is not None else sys.stdin:
        line = line.strip()
        if not line:
            continue
        if line.startswith("/offload "):
            print("O\t{}".format(chat.offload(line.split()[1])))
        elif line.startswith("/restore "):
            chat.restore(line.split()[1])
        elif ":" in line:
            sid, text = line.split(":", 1)
            print("{}\t{}".format(sid, chat.open(sid.strip(), [int(t) for t in text.split()])))
        else:
            sids = line.split()
            print("\t".join(map(str, chat.step(sids))))
    return chat


def _chat(tmp_dir: str, *flags: str) -> InteractiveDecoder:
    path = checkpoint_utils.write_tiny_checkpoint(os.path.join(tmp_dir, "checkpoint_best.pt"))
    argv = ["--path", path, "--bf16", "--session-dir", os.path.join(tmp_dir, "sessions"), *flags]
    return InteractiveDecoder.from_args(options.parse_args_and_arch(options.get_interactive_generation_parser(), argv))


def build_sessions_roundtrip(tmp_dir: str) -> Dict[str, object]:
    """bf16: two sessions stepped together, one offloaded in full precision and restored."""
    chat = _chat(tmp_dir)
    chat.open("a", [3, 4, 5])
    chat.open("b", [6, 7])
    chat.step(["a", "b"])
    chat.step(["a", "b"])
    chat.offload("b")
    chat.restore("b")
    return {"a": chat.buffers("a"), "b": chat.buffers("b")}


def build_sessions_half_snapshots(tmp_dir: str) -> Dict[str, object]:
    """bf16: a session offloaded with --fp16-snapshots and restored; another offloaded in full
    precision and restored into fresh buffers."""
    half = _chat(os.path.join(tmp_dir, "half"), "--fp16-snapshots")
    half.open("a", [3, 4, 5])
    half.step(["a"])
    half.offload("a")
    half.restore("a")
    full = _chat(os.path.join(tmp_dir, "full"))
    full.open("b", [6, 7, 8])
    full.step(["b"])
    full.offload("b")
    full.restore_into_fresh("b")
    return {"restored": half.buffers("a"), "restored_into": full.buffers("b")}


def build_sessions_batched(tmp_dir: str) -> Dict[str, object]:
    """bf16: a restored session stepped together with an open one; three sessions stepped in a
    bucket of four."""
    chat = _chat(os.path.join(tmp_dir, "merged"))
    chat.open("a", [3, 4, 5])
    chat.open("b", [6, 7])
    chat.offload("b")
    chat.restore("b")
    chat.step(["a", "b"])
    bucketed = _chat(os.path.join(tmp_dir, "bucketed"), "--batch-bucket", "4")
    for sid, prompt in (("x", [3, 4]), ("y", [5, 6]), ("z", [7, 8, 9])):
        bucketed.open(sid, prompt)
    bucketed.step(["x", "y", "z"])
    return {
        "merged": {sid: chat.buffers(sid) for sid in ("a", "b")},
        "bucketed": {sid: bucketed.buffers(sid) for sid in ("x", "y", "z")},
    }


if __name__ == "__main__":
    cli_main()
