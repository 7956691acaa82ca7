"""Ragged (FastGen-style) batching: sequence descriptors and the ReplaySSM state manager."""

from .state_manager import DSReplayStateManager, DSSequenceDescriptor

__all__ = ["DSReplayStateManager", "DSSequenceDescriptor"]
