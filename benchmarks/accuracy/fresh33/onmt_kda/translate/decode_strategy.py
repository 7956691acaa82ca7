"""Decode strategies: beam search and greedy search over the generator's log-probs."""

import torch

from onmt_kda.utils.misc import tile


class DecodeStrategy(object):
    """Base class for generation strategies; each batch entry runs ``parallel_paths`` paths."""

    def __init__(self, pad, bos, eos, batch_size, parallel_paths, n_best, min_length, max_length):
        self.pad, self.bos, self.eos = pad, bos, eos
        self.batch_size, self.parallel_paths, self.n_best = batch_size, parallel_paths, n_best
        self.min_length, self.max_length = min_length, max_length
        self.predictions = [[] for _ in range(batch_size)]
        self.scores = [[] for _ in range(batch_size)]
        self.done = False

    def initialize(self, src, src_len, device=None):
        """Returns the function that tiles decoder states to the parallel paths (or None)."""
        rows = self.batch_size * self.parallel_paths
        self.alive_seq = torch.full([rows, 1], self.bos, dtype=torch.long, device=device)
        self.alive_scores = torch.zeros(rows, device=device)
        self.select_indices = torch.arange(rows, device=device)
        if self.parallel_paths == 1:
            return None
        return lambda state, dim: tile(state, self.parallel_paths, dim=dim)

    @property
    def current_predictions(self):
        return self.alive_seq[:, -1]

    def ensure_min_length(self, log_probs):
        if self.alive_seq.shape[1] <= self.min_length:
            log_probs[:, self.eos] = -1e20

    def finish(self, rows):
        for b in range(self.batch_size):
            best = sorted(rows[b], key=lambda x: x[0], reverse=True)[: self.n_best]
            self.scores[b] = [score for score, _ in best]
            self.predictions[b] = [pred for _, pred in best]
        self.done = True


class BeamSearch(DecodeStrategy):
    """Beam search without length penalty; finished hypotheses leave the beam."""

    def __init__(self, beam_size, batch_size, pad, bos, eos, n_best, min_length, max_length):
        super().__init__(pad, bos, eos, batch_size, beam_size, n_best, min_length, max_length)
        self.beam_size = beam_size
        self.hypotheses = [[] for _ in range(batch_size)]

    def initialize(self, src, src_len, device=None):
        fn_map_state = super().initialize(src, src_len, device)
        self.alive_scores = torch.tensor([0.0] + [float("-inf")] * (self.beam_size - 1), device=device).repeat(self.batch_size)
        self._beam_offset = torch.arange(0, self.batch_size * self.beam_size, step=self.beam_size, device=device)
        return fn_map_state

    def advance(self, log_probs):
        vocab_size = log_probs.size(-1)
        self.ensure_min_length(log_probs)
        curr_scores = (log_probs + self.alive_scores.view(-1, 1)).reshape(self.batch_size, -1)
        topk_scores, topk_ids = curr_scores.topk(self.beam_size, dim=-1)
        self.alive_scores = topk_scores.reshape(-1)
        self.select_indices = (topk_ids // vocab_size + self._beam_offset.unsqueeze(1)).view(-1)
        self.alive_seq = torch.cat([self.alive_seq.index_select(0, self.select_indices), topk_ids.fmod(vocab_size).view(-1, 1)], -1)
        last = self.alive_seq.shape[1] == self.max_length + 1
        for row in (range(len(self.alive_seq)) if last else self.current_predictions.eq(self.eos).nonzero().view(-1).tolist()):
            self.hypotheses[row // self.beam_size].append((float(self.alive_scores[row]), self.alive_seq[row, 1:].tolist()))
            self.alive_scores[row] = -1e20
        if last or all(len(h) >= self.n_best for h in self.hypotheses):
            self.finish(self.hypotheses)


class GreedySearch(DecodeStrategy):
    """Select the most likely next token; finished rows emit padding."""

    def __init__(self, pad, bos, eos, batch_size, n_best, min_length, max_length):
        super().__init__(pad, bos, eos, batch_size, 1, n_best, min_length, max_length)

    def advance(self, log_probs):
        self.ensure_min_length(log_probs)
        finished = self.current_predictions.eq(self.eos) | self.current_predictions.eq(self.pad)
        topk_scores, topk_ids = log_probs.topk(1, dim=-1)
        self.alive_scores += topk_scores.view(-1).masked_fill(finished, 0.0)
        self.alive_seq = torch.cat([self.alive_seq, topk_ids.masked_fill(finished.view(-1, 1), self.pad)], -1)
        if self.alive_seq.shape[1] == self.max_length + 1 or bool(finished.all()):
            self.finish([[(float(self.alive_scores[b]), [t for t in self.alive_seq[b, 1:].tolist() if t != self.pad])]
                         for b in range(self.batch_size)])
