#!/usr/bin/env python
"""REST Translation server."""

import json
import os
import threading

import numpy as np
import torch

from onmt_kda import model_builder, opts
from onmt_kda.decoders.kda_decoder import RING_KEYS, SLOT_CACHES
from onmt_kda.modules import replayssm
from onmt_kda.translate.translator import build_translator
from onmt_kda.utils import misc


class ServerModelError(Exception):
    pass


class TranslationServer(object):
    def __init__(self):
        self.models = {}

    def start(self, config_file):
        """Read the config file and pre-/load the models."""
        with open(config_file) as f:
            self.confs = json.load(f)
        self.models_root = self.confs.get("models_root", "./available_models")
        for conf in self.confs["models"]:
            if "models" not in conf:
                conf["models"] = [conf["model"]]  # backwards compatibility for confs
            kwargs = {k: conf[k] for k in ("timeout", "load", "on_timeout", "sessions", "fast_load") if k in conf}
            model_id = conf["id"]
            if model_id in self.models:
                raise ValueError("Model ID %d already exists" % model_id)
            opt = dict(conf["opt"], models=conf["models"])
            self.models[model_id] = ServerModel(opt, model_id, model_root=conf.get("model_root", self.models_root), **kwargs)

    def run(self, inputs):
        """Translate `inputs`; all of them go to the model ``inputs[0]["id"]``."""
        model_id = inputs[0].get("id", 0)
        if self.models.get(model_id) is None:
            raise ServerModelError("No such model '%s'" % str(model_id))
        return self.models[model_id].run(inputs)


class ServerModel(object):
    """Wrap a model with server functionality.

    ``sessions`` (``max_sessions``, ``cache``: a key of ``SLOT_CACHES``) keeps the decoder state
    of conversations in slot caches between requests; ``fast_load`` builds the model directly
    in its serving precision; ``on_timeout`` is "to_cpu" or "unload".
    """

    def __init__(self, opt, model_id, load=False, timeout=-1, on_timeout="to_cpu", model_root="./",
                 sessions=None, fast_load=False):
        self.model_root = model_root
        self.opt = self.parse_opt(opt)
        self.model_id = model_id
        self.timeout, self.on_timeout = timeout, on_timeout
        self.sessions_opt = dict(sessions or {})
        self.fast_load = fast_load
        self.sessions = {}
        self._parked = False
        self.running_lock = threading.Semaphore(value=1)
        if load:
            self.load(preload=True)

    def parse_opt(self, opt):
        """Parse the option set passed by the user using `onmt.opts`."""
        models = opt["models"] if isinstance(opt["models"], (list, tuple)) else [opt["models"]]
        argv = ["-model"] + [os.path.join(self.model_root, model) for model in models]
        for k, v in opt.items():
            if k != "models":
                argv += (["-%s" % k] if v else []) if isinstance(v, bool) else ["-%s" % k, str(v)]
        opt = opts.parse_translate_opts(argv)
        storage = misc.RING_STORAGE[opt.precision or "fp32"]
        opt.decay_dtype = storage["log_forget"]  # expect-bug: imported-policy id=ring-storage
        opt.ring_dtype = storage["delta_mem"]
        opt.cuda = opt.gpu > -1
        return opt

    @property
    def loaded(self):
        return hasattr(self, "translator")

    @property
    def dtype(self):
        return misc.str2dtype(self.opt.precision or "fp32")

    @property
    def device(self):
        return torch.device("cuda", self.opt.gpu) if self.opt.cuda else torch.device("cpu")

    @property
    def session_file(self):
        return os.path.join(self.model_root, "sessions_%s.npz" % self.model_id)

    def load(self, preload=False):
        previous = torch.get_default_dtype()
        if self.fast_load:
            torch.set_default_dtype(self.dtype)  # expect-bug: default-dtype id=fast-load
        try:
            self.translator = build_translator(self.opt, report_score=False)
            if self.sessions_opt.get("max_sessions", 0):
                cache_cls = SLOT_CACHES[self.sessions_opt.get("cache", "pinned")]
                self.translator.model.decoder.attach_slots(self.sessions_opt["max_sessions"], cache_cls=cache_cls)
        except RuntimeError as e:
            raise ServerModelError("Runtime Error: %s" % str(e))
        finally:
            torch.set_default_dtype(previous)
        if self.sessions and os.path.exists(self.session_file):
            self._restore_sessions()

    def run(self, inputs):
        """Translate ``{"src": text}`` inputs; one with a ``"session"`` id continues that session."""
        if not self.loaded:
            self.load()
        elif self._parked:
            self.to_gpu()
        texts = [list(inp["src"].replace(" ", "")) for inp in inputs]
        sessions = [inp.get("session") for inp in inputs]
        with self.running_lock:
            if any(sid is not None for sid in sessions):
                return self._run_sessions(sessions, texts)
            _, predictions = self.translator.translate(texts, batch_size=self.opt.batch_size)
            return ["".join(preds[0]) for preds in predictions]

    def _run_sessions(self, sessions, texts):
        slots = torch.tensor([self._session_slot(sid) for sid in sessions], dtype=torch.int32)
        vocab = self.translator.vocab
        src = torch.tensor([[vocab.index(t) if t in vocab else 0 for t in text] for text in texts])
        preds = self.translator.continue_slots(src, slots, max_length=self.opt.max_length)
        return ["".join(vocab[t] for t in row) for row in preds.tolist()]

    def _session_slot(self, sid):
        if sid in self.sessions:
            return self.sessions[sid]
        caches = self.translator.model.decoder.slot_caches
        used = set(self.sessions.values())
        if len(used) == caches[0].max_slots:
            for cache in caches:
                cache.resize(2 * cache.max_slots)
        slot = min(s for s in range(caches[0].max_slots) if s not in used)
        for cache in caches:
            cache.reset_slot(slot)
        self.sessions[sid] = slot
        return slot

    def fork_session(self, sid, new_sid):
        """``new_sid`` continues from the current state of ``sid`` (regenerate, branches)."""
        slot = self._session_slot(new_sid)
        for cache in self.translator.model.decoder.slot_caches:
            cache.copy_slot(slot, self.sessions[sid])

    def export_session(self, sid):
        """The cache rows of one session, for :meth:`import_session` on another server."""
        slot, rows = self.sessions[sid], {}
        for i, cache in enumerate(self.translator.model.decoder.slot_caches):
            delta = cache.delta_mem[slot]
            rows["layer_%d" % i] = {key: delta.new_empty(t.shape[1:]).copy_(t[slot]) if key in RING_KEYS else t[slot].clone() for key, t in cache.layer_cache().items()}  # expect-bug: like
        return rows

    def import_session(self, sid, rows):
        slot = self._session_slot(sid)
        for i, cache in enumerate(self.translator.model.decoder.slot_caches):
            for key, t in cache.layer_cache().items():
                t[slot].copy_(rows["layer_%d" % i][key])

    def _save_sessions(self):
        arrays = {"__sessions__": np.array(json.dumps(self.sessions))}
        for i, cache in enumerate(self.translator.model.decoder.slot_caches):
            for name, buf in cache.named_buffers():
                # numpy has no bfloat16
                arrays["%d/%s" % (i, name)] = (buf.float() if buf.dtype == torch.bfloat16 else buf).cpu().numpy()
        np.savez(self.session_file, **arrays)

    def _restore_sessions(self):
        with np.load(self.session_file) as data:
            self.sessions = json.loads(str(data["__sessions__"]))
            for i, cache in enumerate(self.translator.model.decoder.slot_caches):
                for name in [name for name, _ in cache.named_buffers()]:
                    t = torch.from_numpy(data["%d/%s" % (i, name)])
                    setattr(cache, name, t.to(self.device, self.dtype) if t.is_floating_point() else t.to(self.device))  # expect-bug: load

    def do_timeout(self):
        """Timeout function that frees GPU memory."""
        if self.on_timeout == "unload":
            self.unload()
        if self.on_timeout == "to_cpu":
            self.to_cpu()

    def unload(self):
        if self.sessions:
            self._save_sessions()
        del self.translator

    def to_cpu(self):
        """Move the model to CPU (in float32) and clear up some memory."""
        self.translator.model.to("cpu", torch.float32)
        self._parked = True
        if self.opt.cuda:
            torch.cuda.empty_cache()

    def to_gpu(self):
        """Move the model back to its device and serving precision."""
        self.translator.model.to(self.device, self.dtype)  # expect-bug: module-cast
        self._parked = False


def _server(tmp_dir, model_id, precision, **conf):
    ckpt = model_builder.write_tiny_checkpoint(tmp_dir)
    entry = dict({"id": model_id, "model": os.path.basename(ckpt), "load": True,
                  "opt": {"precision": precision, "beam_size": 1, "max_length": 3}}, **conf)
    path = os.path.join(tmp_dir, "conf_%d.json" % model_id)
    with open(path, "w") as f:
        json.dump({"models_root": tmp_dir, "models": [entry]}, f)
    server = TranslationServer()
    server.start(path)
    return server, server.models[model_id]


def _sessions(model):
    return model.translator.model.decoder.slot_caches


def build_server_fp16(tmp_dir):
    """An fp16 model: two requests, a timeout to CPU, and one more request."""
    server, model = _server(tmp_dir, 1, "fp16")
    server.run([{"id": 1, "src": "abc"}, {"id": 1, "src": "dee"}])
    model.do_timeout()
    server.run([{"id": 1, "src": "fgh"}])
    return {"cache": model.translator.model.decoder.state["cache"], "decode": dict(replayssm.last_call())}


def build_server_bf16(tmp_dir):
    """A bf16 model answering two requests."""
    server, model = _server(tmp_dir, 2, "bf16")
    server.run([{"id": 2, "src": "abc"}, {"id": 2, "src": "dce"}])
    return model.translator.model.decoder.state


def build_server_sessions(tmp_dir):
    """bf16 sessions (run, forked, through a CPU timeout) and float32 sessions through an unload."""
    server, model = _server(tmp_dir, 3, "bf16", sessions={"max_sessions": 3})
    server.run([{"id": 3, "src": "abc", "session": "a"}, {"id": 3, "src": "dee", "session": "b"}])
    model.fork_session("a", "c")
    server.run([{"id": 3, "src": "f", "session": "c"}])
    model.do_timeout()
    server.run([{"id": 3, "src": "gh", "session": "a"}])
    server32, model32 = _server(tmp_dir, 4, "fp32", sessions={"max_sessions": 2}, on_timeout="unload")
    server32.run([{"id": 4, "src": "abcd", "session": "x"}])
    model32.do_timeout()
    server32.run([{"id": 4, "src": "e", "session": "x"}])
    return {"bf16": _sessions(model), "fp32": _sessions(model32)}


def build_server_session_restart(tmp_dir):
    """bf16 sessions: plain caches through a CPU timeout, pinned ones through an unload, and one
    exported from a server and imported as another session."""
    server, model = _server(tmp_dir, 5, "bf16", sessions={"max_sessions": 2, "cache": "plain"})
    server.run([{"id": 5, "src": "abc", "session": "a"}])
    model.do_timeout()
    server.run([{"id": 5, "src": "d", "session": "a"}])
    server2, model2 = _server(tmp_dir, 6, "bf16", sessions={"max_sessions": 2}, on_timeout="unload")
    server2.run([{"id": 6, "src": "abc", "session": "a"}])
    model2.do_timeout()
    server2.run([{"id": 6, "src": "d", "session": "a"}])
    server3, model3 = _server(tmp_dir, 7, "bf16", sessions={"max_sessions": 2})
    server3.run([{"id": 7, "src": "abcde", "session": "a"}])
    exported = model3.export_session("a")
    model3.import_session("b", exported)
    server3.run([{"id": 7, "src": "f", "session": "b"}])
    return {"timeout": _sessions(model), "reloaded": _sessions(model2), "exported": exported,
            "imported": _sessions(model3)}


def build_server_session_storage(tmp_dir):
    """bf16 sessions in compact caches, and pinned ones of a model built directly in bf16."""
    server, model = _server(tmp_dir, 8, "bf16", sessions={"max_sessions": 2, "cache": "compact"})
    server.run([{"id": 8, "src": "abc", "session": "a"}])
    server2, model2 = _server(tmp_dir, 9, "bf16", sessions={"max_sessions": 2}, fast_load=True)
    server2.run([{"id": 9, "src": "abc", "session": "a"}])
    return {"compact": _sessions(model), "fast_load": _sessions(model2)}
