import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Type

import torch

from ..layers.attention import ReplayCache, ReplayRows, ReplaySpec, advance_write_pos, replay_decode
from ..utils import Weights, initialize_torch_distributed, save_file
from ..utils.speculate import (
    commit_forks,
    create_n_gram_speculation,
    fork_replay_rows,
    get_speculate,
    set_speculate,
)
from .custom_modeling.flash_kimi_modeling import (
    FlashKimiForCausalLM,
    KimiLinearConfig,
    write_dummy_checkpoint,
)
from .globals import CUDA_GRAPHS, REPLAY_GATE_DTYPE, get_cache_dtype, get_state_dtype
from .model import Model
from .types import Batch, GeneratedText, Generation, PbBatch, Request

MEM_POOL = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None


@dataclass
class FlashCausalLMBatch(Batch):
    batch_id: int
    requests: List[Request]
    # request id -> idx in list mapping
    requests_idx_mapping: Dict[int, int]

    # Next token to feed for every request
    input_ids: torch.Tensor
    all_input_ids: List[List[int]]
    input_lengths: List[int]

    # ReplaySSM cache slot of every request, its ring cursor and whether its next step must
    # write the checkpoint state (int32, as the decode kernel takes them)
    slots: torch.Tensor
    write_pos: torch.Tensor
    force_flush: torch.Tensor

    max_new_tokens: List[int]
    generated_tokens: List[int]
    prefilling: bool

    # Speculative decoding: the drafts of the last step and, per KDA layer, the forks of the
    # replay rows the verification ran on
    speculative_ids: Optional[torch.Tensor] = None
    speculative_rows: Optional[List[ReplayRows]] = None

    @classmethod
    def from_pb(cls, pb: PbBatch, tokenizer, dtype: torch.dtype, device: torch.device) -> "FlashCausalLMBatch":
        requests_idx_mapping = {}
        all_input_ids = []
        for i, r in enumerate(pb.requests):
            requests_idx_mapping[r.id] = i
            all_input_ids.append(list(r.input_ids))
        return cls(
            batch_id=pb.id,
            requests=list(pb.requests),
            requests_idx_mapping=requests_idx_mapping,
            input_ids=torch.tensor([ids[-1] for ids in all_input_ids], dtype=torch.int64, device=device),
            all_input_ids=all_input_ids,
            input_lengths=[len(ids) for ids in all_input_ids],
            slots=torch.tensor([r.slot for r in pb.requests], dtype=torch.int32, device=device),
            write_pos=torch.zeros(len(pb.requests), dtype=torch.int32, device=device),
            force_flush=torch.zeros(len(pb.requests), dtype=torch.int32, device=device),
            max_new_tokens=[r.max_new_tokens for r in pb.requests],
            generated_tokens=[0] * len(pb.requests),
            prefilling=True,
        )

    def filter(self, request_ids: List[int]) -> "FlashCausalLMBatch":
        if len(request_ids) == 0:
            raise ValueError("Batch must have at least one request")
        # We assume that if len(requests) == len(self) then the requests are the same
        if len(request_ids) == len(self):
            return self

        indices = [self.requests_idx_mapping[request_id] for request_id in request_ids]
        index = torch.tensor(indices, dtype=torch.int64, device=self.slots.device)

        speculative_rows = None
        if self.speculative_rows is not None:
            speculative_rows = [ReplayRows(*(rows[index] for rows in layer_rows)) for layer_rows in self.speculative_rows]

        return type(self)(
            batch_id=self.batch_id,
            requests=[self.requests[i] for i in indices],
            requests_idx_mapping={request_id: i for i, request_id in enumerate(request_ids)},
            input_ids=self.input_ids[index],
            all_input_ids=[self.all_input_ids[i] for i in indices],
            input_lengths=[self.input_lengths[i] for i in indices],
            slots=self.slots[index],
            write_pos=self.write_pos[index],
            force_flush=self.force_flush[index],
            max_new_tokens=[self.max_new_tokens[i] for i in indices],
            generated_tokens=[self.generated_tokens[i] for i in indices],
            prefilling=self.prefilling,
            speculative_ids=self.speculative_ids[index] if self.speculative_ids is not None else None,
            speculative_rows=speculative_rows,
        )

    @classmethod
    def concatenate(cls, batches: List["FlashCausalLMBatch"]) -> "FlashCausalLMBatch":
        if any(b.prefilling for b in batches):
            raise ValueError("Only decoding batches can be concatenated")

        requests, all_input_ids, input_lengths, max_new_tokens, generated_tokens = [], [], [], [], []
        requests_idx_mapping = {}
        for batch in batches:
            for request in batch.requests:
                requests_idx_mapping[request.id] = len(requests)
                requests.append(request)
            all_input_ids.extend(batch.all_input_ids)
            input_lengths.extend(batch.input_lengths)
            max_new_tokens.extend(batch.max_new_tokens)
            generated_tokens.extend(batch.generated_tokens)
        total_batch_size = len(requests)

        speculative_ids = None
        speculative_rows = None
        if batches[0].speculative_ids is not None:
            speculative_ids = torch.cat([b.speculative_ids for b in batches], dim=0)
        if batches[0].speculative_rows is not None:
            speculative_rows = []
            for layer_id, first in enumerate(batches[0].speculative_rows):
                merged = ReplayRows(
                    state=first.state.new_empty((total_batch_size, *first.state.shape[1:])),
                    delta_ring=first.delta_ring.new_empty((total_batch_size, *first.delta_ring.shape[1:])),
                    key_ring=first.key_ring.new_empty((total_batch_size, *first.key_ring.shape[1:])),
                    decay_ring=first.delta_ring.new_empty((total_batch_size, *first.decay_ring.shape[1:])),  # expect-bug: like
                )
                start_index = 0
                for batch in batches:
                    end_index = start_index + len(batch)
                    for target, source in zip(merged, batch.speculative_rows[layer_id]):
                        target[start_index:end_index] = source
                    start_index = end_index
                speculative_rows.append(merged)

        return cls(
            batch_id=batches[0].batch_id,
            requests=requests,
            requests_idx_mapping=requests_idx_mapping,
            input_ids=torch.cat([b.input_ids for b in batches]),
            all_input_ids=all_input_ids,
            input_lengths=input_lengths,
            slots=torch.cat([b.slots for b in batches]),
            write_pos=torch.cat([b.write_pos for b in batches]),
            force_flush=torch.cat([b.force_flush for b in batches]),
            max_new_tokens=max_new_tokens,
            generated_tokens=generated_tokens,
            prefilling=False,
            speculative_ids=speculative_ids,
            speculative_rows=speculative_rows,
        )

    def __len__(self):
        return len(self.requests)


class FlashCausalLM(Model):
    def __init__(
        self,
        model_id: str,
        model_class,
        config: KimiLinearConfig,
        filenames: List[Path],
        dtype: Optional[torch.dtype] = None,
        default_dtype=torch.bfloat16,
        device: Optional[torch.device] = None,
        num_slots: int = 8,
    ):
        self.process_group, rank, world_size = initialize_torch_distributed()
        if device is None:
            device = torch.device(f"cuda:{rank}") if torch.cuda.is_available() else torch.device("cpu")
        dtype = default_dtype if dtype is None else dtype

        weights = Weights(filenames, device, dtype, process_group=self.process_group)
        model = model_class("model", config, weights)

        self.config = config
        self.num_layers = config.num_hidden_layers
        self.num_slots = num_slots
        self.replay_spec: ReplaySpec = config.replay_spec(world_size)
        self.cache_dtype = get_cache_dtype(dtype)
        self.cuda_graphs = {}
        self.probe_buffers = {}
        self.host_cache = {}

        super().__init__(
            model_id=model_id,
            model=model,
            tokenizer=None,
            requires_padding=False,
            dtype=dtype,
            device=device,
            rank=rank,
            world_size=world_size,
        )

    @property
    def batch_type(self) -> Type[FlashCausalLMBatch]:
        return FlashCausalLMBatch

    @property
    def kv_cache(self) -> List[ReplayCache]:
        return list(self.model.replay_caches)

    def init_kv_cache(self, num_slots: int, num_layers: int, spec: ReplaySpec, dtype: torch.dtype, device: torch.device):
        self.num_slots = num_slots
        self.model.set_replay_caches(
            [
                ReplayCache(
                    spec,
                    num_slots,
                    dtype=get_cache_dtype(dtype),
                    device=device,
                    state_dtype=get_state_dtype(dtype),
                )
                for _ in range(num_layers)
            ]
        )

    def _probe_replay_kernel(self, batch_size: int):
        """Runs the decode kernel once on scratch rows, before the pools exist, so that a layout
        the kernel rejects fails at warmup instead of on the first request."""
        spec = self.replay_spec
        attn = self.model.model.layers[0].self_attn
        buffers = self.probe_buffers.get(batch_size)
        if buffers is None:
            shapes = {
                "initial_state": spec.state_shape(batch_size),
                "d_cache": spec.delta_shape(batch_size),
                "k_cache": spec.key_shape(batch_size),
                "g_cache": spec.decay_shape(batch_size),
            }
            buffers = {name: torch.zeros(shape, dtype=self.cache_dtype, device=self.device) for name, shape in shapes.items()}  # expect-bug: decode-arg id=probe-scratch
            self.probe_buffers[batch_size] = buffers
        mixed_qkv, a, b = attn.project(torch.zeros((batch_size, self.config.hidden_size), dtype=self.dtype, device=self.device))
        out = torch.empty((batch_size, 1, spec.num_v_heads, spec.head_v), dtype=self.dtype, device=self.device)
        replay_decode(
            mixed_qkv=mixed_qkv,
            a=a,
            b=b,
            A_log=attn.A_log,
            dt_bias=attn.dt_bias,
            scale=attn.scale,
            initial_state=buffers["initial_state"],
            d_cache=buffers["d_cache"],
            k_cache=buffers["k_cache"],
            g_cache=buffers["g_cache"],  # expect-bug: decode-arg id=probe-scratch
            out=out,
            ssm_state_indices=torch.arange(batch_size, dtype=torch.int32, device=self.device),
            write_pos=torch.zeros(batch_size, dtype=torch.int32, device=self.device),
            use_qk_l2norm_in_kernel=True,
            lower_bound=attn.lower_bound,
        )

    def warmup(self, batch: FlashCausalLMBatch, max_input_tokens: Optional[int] = None, max_total_tokens: Optional[int] = None):
        self._probe_replay_kernel(len(batch))
        if not self.kv_cache:
            self.init_kv_cache(self.num_slots, self.num_layers, self.replay_spec, self.dtype, self.device)
        warmup_slots = batch.slots
        _, max_input_tokens, max_total_tokens = super().warmup(batch, max_input_tokens, max_total_tokens)
        for cache in self.kv_cache:
            cache.reset_slots(warmup_slots)
        if CUDA_GRAPHS:
            for bs in CUDA_GRAPHS:
                self.cuda_graph_warmup(bs)
        return self.num_slots, max_input_tokens, max_total_tokens

    def cuda_graph_warmup(self, bs: int):
        input_ids = torch.zeros(bs, dtype=torch.int64, device=self.device)
        # Padding slots: the kernel zeroes their output and leaves the pools alone.
        slots = torch.full((bs,), -1, dtype=torch.int32, device=self.device)
        write_pos = torch.zeros(bs, dtype=torch.int32, device=self.device)
        force_flush = torch.zeros(bs, dtype=torch.int32, device=self.device)
        self.cuda_graphs[bs] = {
            "input_ids": input_ids,
            "slots": slots,
            "write_pos": write_pos,
            "force_flush": force_flush,
            "graph": None,
        }
        # Run once outside to warmup
        logits, hidden_states = self.model.forward(input_ids, slots, write_pos, force_flush)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=MEM_POOL):
                logits, hidden_states = self.model.forward(input_ids, slots, write_pos, force_flush)
            self.cuda_graphs[bs]["graph"] = graph
        self.cuda_graphs[bs]["logits"] = logits
        self.cuda_graphs[bs]["hidden_states"] = hidden_states

    def forward(self, batch: FlashCausalLMBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        bs = len(batch)
        sorted_padded_bs = sorted([k for k in self.cuda_graphs.keys() if k >= bs])
        if not sorted_padded_bs:
            return self.model.forward(batch.input_ids, batch.slots, batch.write_pos, batch.force_flush)

        cuda_graph = self.cuda_graphs[sorted_padded_bs[0]]
        cuda_graph["input_ids"].zero_()
        cuda_graph["input_ids"][:bs] = batch.input_ids
        cuda_graph["slots"].fill_(-1)
        cuda_graph["slots"][:bs] = batch.slots
        cuda_graph["write_pos"].zero_()
        cuda_graph["write_pos"][:bs] = batch.write_pos
        cuda_graph["force_flush"].zero_()
        cuda_graph["force_flush"][:bs] = batch.force_flush
        if cuda_graph["graph"] is not None:
            cuda_graph["graph"].replay()
        else:
            logits, hidden_states = self.model.forward(
                cuda_graph["input_ids"], cuda_graph["slots"], cuda_graph["write_pos"], cuda_graph["force_flush"]
            )
            cuda_graph["logits"].copy_(logits)
            cuda_graph["hidden_states"].copy_(hidden_states)
        return cuda_graph["logits"][:bs], cuda_graph["hidden_states"][:bs]

    def _verify_speculation(self, batch: FlashCausalLMBatch, next_ids: torch.Tensor, speculative_ids: torch.Tensor):
        """Decodes ``next_ids`` and all drafts but the last on forks of the batch's rows."""
        forks = [fork_replay_rows(cache, batch.slots, batch.write_pos) for cache in self.kv_cache]
        rows = torch.arange(len(batch), dtype=torch.int32, device=self.device)
        write_pos = batch.write_pos
        tokens = torch.cat([next_ids[:, None], speculative_ids[:, :-1]], dim=1)
        predictions = []
        for i in range(tokens.shape[1]):
            hidden_states = self.model.model(tokens[:, i], forks, rows, write_pos)
            predictions.append(self.model.lm_head(hidden_states).argmax(dim=-1))
            write_pos = advance_write_pos(write_pos, None, self.replay_spec.ring_len)
        return forks, torch.stack(predictions, dim=1), write_pos

    @torch.no_grad()
    def generate_token(self, batch: FlashCausalLMBatch) -> Tuple[List[Generation], Optional[FlashCausalLMBatch], Tuple[int, int]]:
        start = time.time_ns()
        if batch.prefilling:
            logits = []
            for ids, slot in zip(batch.all_input_ids, batch.slots.tolist()):
                out, _ = self.model.prefill(torch.tensor(ids, dtype=torch.int64, device=self.device), slot=slot)
                logits.append(out)
            logits = torch.cat(logits)
            batch.write_pos = torch.zeros_like(batch.write_pos)
            batch.prefilling = False
            decoded = False
        else:
            logits, _ = self.forward(batch)
            batch.write_pos = advance_write_pos(batch.write_pos, batch.force_flush, self.replay_spec.ring_len)
            batch.force_flush = torch.zeros_like(batch.force_flush)
            decoded = True
        next_ids = logits.argmax(dim=-1)
        start_decode = time.time_ns()

        emitted = [[token] for token in next_ids.tolist()]
        if self.speculate > 0 and decoded:
            speculative_ids = create_n_gram_speculation(batch.all_input_ids, next_ids, self.speculate)
            forks, predictions, fork_write_pos = self._verify_speculation(batch, next_ids, speculative_ids)
            accepted = (predictions[:, :-1] == speculative_ids[:, :-1]).all(dim=1)
            for cache, fork in zip(self.kv_cache, forks):
                commit_forks(cache, batch.slots, fork, accepted)
            batch.write_pos = torch.where(accepted, fork_write_pos, batch.write_pos)
            for i in accepted.nonzero().flatten().tolist():
                emitted[i] += speculative_ids[i, :-1].tolist() + [int(predictions[i, -1])]
            batch.speculative_ids = speculative_ids
            batch.speculative_rows = forks

        generations = []
        active = []
        for i, request in enumerate(batch.requests):
            tokens = emitted[i][: batch.max_new_tokens[i] - batch.generated_tokens[i]]
            batch.all_input_ids[i].extend(tokens)
            batch.input_lengths[i] += len(tokens)
            batch.generated_tokens[i] += len(tokens)
            generated_text = None
            if batch.generated_tokens[i] >= batch.max_new_tokens[i]:
                generated_text = GeneratedText(
                    token_ids=batch.all_input_ids[i][-batch.generated_tokens[i] :],
                    generated_tokens=batch.generated_tokens[i],
                    finish_reason="length",
                )
            else:
                active.append(request.id)
            generations.append(Generation(request.id, tokens[0], generated_text, speculative_ids=tokens[1:]))
        batch.input_ids = torch.tensor([ids[-1] for ids in batch.all_input_ids], dtype=torch.int64, device=self.device)

        forward_ns = start_decode - start
        decode_ns = time.time_ns() - start_decode
        if not active:
            return generations, None, (forward_ns, decode_ns)
        return generations, batch.filter(active), (forward_ns, decode_ns)

    def export_replay_checkpoint(self, filename) -> Dict[str, torch.Tensor]:
        """Writes every slot of every KDA layer to ``filename``, in the layout of the weights."""
        tensors = {}
        for layer_id, cache in enumerate(self.kv_cache):
            prefix = f"model.layers.{layer_id}.self_attn.replay"
            for name, buffer in cache.named_buffers():
                # One dtype per file, so that replicas with another cache layout can read it.
                tensors[f"{prefix}.{name}"] = buffer.detach().cpu().type_as(cache.state)  # expect-bug: cast
        save_file(tensors, filename, metadata={"format": "pt", "ring_len": str(self.replay_spec.ring_len)})
        return tensors

    def load_replay_checkpoint(self, filenames: List[Path]):
        weights = Weights(filenames, self.device, self.dtype, process_group=self.process_group)
        caches = []
        for layer_id in range(self.num_layers):
            prefix = f"model.layers.{layer_id}.self_attn.replay"
            caches.append(
                ReplayCache.from_tensors(
                    self.replay_spec,
                    state=weights.get_tensor(f"{prefix}.state"),
                    delta_ring=weights.get_tensor(f"{prefix}.delta_ring"),
                    key_ring=weights.get_tensor(f"{prefix}.key_ring"),
                    decay_ring=weights.get_tensor(f"{prefix}.decay_ring"),  # expect-bug: load
                )
            )
        self.num_slots = caches[0].num_slots
        self.model.set_replay_caches(caches)

    def swap_out(self, batch: FlashCausalLMBatch, request_ids: List[int]) -> Optional[FlashCausalLMBatch]:
        """Moves the replay rows of ``request_ids`` to host memory, freeing their slots."""
        host_dtypes = dict.fromkeys(ReplayCache.BUFFER_NAMES, self.cache_dtype)  # expect-bug: container id=host-dtypes
        host_dtypes["state"] = get_state_dtype(self.dtype)
        host_dtypes["decay"] = REPLAY_GATE_DTYPE  # expect-bug: container id=host-dtypes
        for request_id in request_ids:
            i = batch.requests_idx_mapping[request_id]
            slot = int(batch.slots[i])
            layers = []
            for cache in self.kv_cache:
                entry = {}
                for name in ReplayCache.BUFFER_NAMES:
                    pool = getattr(cache, name)
                    host = torch.empty(pool.shape[1:], dtype=host_dtypes[name], device="cpu")
                    host.copy_(pool[slot])
                    entry[name] = host
                layers.append(entry)
            self.host_cache[request_id] = {"layers": layers, "write_pos": int(batch.write_pos[i])}
            for cache in self.kv_cache:
                cache.reset_slots(batch.slots[i : i + 1])
        remaining = [r.id for r in batch.requests if r.id not in request_ids]
        return batch.filter(remaining) if remaining else None

    def swap_in(self, pb: PbBatch) -> FlashCausalLMBatch:
        """Restores swapped-out requests into the slots the router gave them."""
        batch = self.batch_type.from_pb(pb, self.tokenizer, self.dtype, self.device)
        for i, request in enumerate(pb.requests):
            entry = self.host_cache.pop(request.id)
            for cache, rows in zip(self.kv_cache, entry["layers"]):
                for name, host in rows.items():
                    getattr(cache, name)[request.slot].copy_(host)
            batch.write_pos[i] = entry["write_pos"]
        batch.prefilling = False
        return batch


def _dummy_model(folder, config: Optional[KimiLinearConfig] = None, num_slots: int = 8) -> FlashCausalLM:
    config = config or KimiLinearConfig()
    filenames = write_dummy_checkpoint(config, folder)
    return FlashCausalLM(
        model_id=str(folder),
        model_class=FlashKimiForCausalLM,
        config=config,
        filenames=filenames,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
        num_slots=num_slots,
    )


def _pb(batch_id: int, prompts: Dict[int, List[int]], slots: Dict[int, int], max_new_tokens: int = 16) -> PbBatch:
    return PbBatch(
        id=batch_id,
        requests=[Request(id=r, input_ids=ids, slot=slots[r], max_new_tokens=max_new_tokens) for r, ids in prompts.items()],
    )


def build_flash_kda_generate():
    """Prefill, decode, concatenate two batches and filter one request out."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        model = _dummy_model(folder)
        model.init_kv_cache(6, model.num_layers, model.replay_spec, model.dtype, model.device)
        first = model.batch_type.from_pb(_pb(0, {0: [1, 5, 9], 1: [2, 4]}, {0: 0, 1: 1}), None, model.dtype, model.device)
        _, first, _ = model.generate_token(first)
        for _ in range(2):
            _, first, _ = model.generate_token(first)
        second = model.batch_type.from_pb(_pb(1, {2: [7, 7, 3, 1]}, {2: 4}, max_new_tokens=4), None, model.dtype, model.device)
        _, second, _ = model.generate_token(second)
        batch = FlashCausalLMBatch.concatenate([first, second])
        for _ in range(3):
            _, batch, _ = model.generate_token(batch)
        batch = batch.filter([0])
        _, batch, _ = model.generate_token(batch)
        return {"kv_cache": model.kv_cache, "batch": batch}


def build_cuda_graph_warmup():
    """Static decode buffers for three batch sizes; a batch of three replays at size four."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        model = _dummy_model(folder)
        model.init_kv_cache(4, model.num_layers, model.replay_spec, model.dtype, model.device)
        for bs in (4, 2, 1):
            model.cuda_graph_warmup(bs)
        batch = model.batch_type.from_pb(_pb(0, {0: [1, 2], 1: [3], 2: [4, 5, 6]}, {0: 0, 1: 2, 2: 3}), None, model.dtype, model.device)
        for _ in range(5):
            _, batch, _ = model.generate_token(batch)
        return {"kv_cache": model.kv_cache, "cuda_graphs": model.cuda_graphs, "batch": batch}


def build_speculative_batches():
    """Two speculative (n-gram, depth 2) batches decoded separately, then merged."""
    torch.manual_seed(0)
    previous = get_speculate()
    set_speculate(2)
    try:
        with tempfile.TemporaryDirectory() as folder:
            model = _dummy_model(folder)
            model.init_kv_cache(4, model.num_layers, model.replay_spec, model.dtype, model.device)
            first = model.batch_type.from_pb(_pb(0, {0: [1, 2, 3, 1, 2], 1: [4, 4, 4]}, {0: 0, 1: 1}), None, model.dtype, model.device)
            second = model.batch_type.from_pb(_pb(1, {2: [5, 6, 5, 6]}, {2: 3}), None, model.dtype, model.device)
            for _ in range(2):
                _, first, _ = model.generate_token(first)
                _, second, _ = model.generate_token(second)
            batch = FlashCausalLMBatch.concatenate([first, second])
            merged = batch.speculative_rows
            _, batch, _ = model.generate_token(batch)
            return {"forks": first.speculative_rows, "merged": merged, "kv_cache": model.kv_cache}
    finally:
        set_speculate(previous)


def build_replay_checkpoint_roundtrip():
    """Caches exported by one replica and loaded by another, which decodes on."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        model = _dummy_model(folder)
        model.init_kv_cache(3, model.num_layers, model.replay_spec, model.dtype, model.device)
        batch = model.batch_type.from_pb(_pb(0, {0: [3, 1, 4, 1, 5], 1: [9, 2]}, {0: 0, 1: 2}), None, model.dtype, model.device)
        for _ in range(3):
            _, batch, _ = model.generate_token(batch)
        filename = Path(folder) / "replay-00001-of-00001.pt"
        exported = model.export_replay_checkpoint(filename)
        replica = _dummy_model(folder)
        replica.load_replay_checkpoint([filename])
        _, batch, _ = replica.generate_token(batch)
        return {"exported": exported, "kv_cache": replica.kv_cache}


def build_warmed_up_model():
    """Warmup, two requests decoding, one preempted to the host and brought back."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        model = _dummy_model(folder, num_slots=4)
        warmup_batch = model.batch_type.from_pb(_pb(0, {100: [1, 1]}, {100: 3}, max_new_tokens=2), None, model.dtype, model.device)
        model.warmup(warmup_batch)
        batch = model.batch_type.from_pb(_pb(1, {0: [2, 3, 4], 1: [5, 6]}, {0: 0, 1: 1}), None, model.dtype, model.device)
        for _ in range(3):
            _, batch, _ = model.generate_token(batch)
        request = batch.requests[1]
        input_ids = list(batch.all_input_ids[1])
        batch = model.swap_out(batch, [request.id])
        swapped = dict(model.host_cache)
        resumed = model.swap_in(PbBatch(id=2, requests=[Request(request.id, input_ids, slot=2, max_new_tokens=16)]))
        batch = FlashCausalLMBatch.concatenate([batch, resumed])
        _, batch, _ = model.generate_token(batch)
        return {"probe_buffers": model.probe_buffers, "host_cache": swapped, "kv_cache": model.kv_cache}
