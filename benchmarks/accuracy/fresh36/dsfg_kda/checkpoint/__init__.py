from .engines import CheckpointEngineBase, SSMStateCheckpointEngine, SyntheticCheckpointEngine

__all__ = ["CheckpointEngineBase", "SSMStateCheckpointEngine", "SyntheticCheckpointEngine"]
