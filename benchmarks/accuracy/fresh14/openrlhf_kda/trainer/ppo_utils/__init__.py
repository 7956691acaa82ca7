from .experience_maker import Experience, NaiveExperienceMaker, RemoteExperienceMaker
from .replay_buffer import NaiveReplayBuffer

__all__ = ["Experience", "NaiveExperienceMaker", "RemoteExperienceMaker", "NaiveReplayBuffer"]
