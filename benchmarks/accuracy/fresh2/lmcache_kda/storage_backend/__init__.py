from ..config import LMCacheEngineConfig, LMCacheEngineMetadata
from .abstract_backend import LMCBackendInterface
from .local_backend import LMCLocalBackend, LMCLocalDiskBackend
from .remote_backend import LMCRemoteBackend


def CreateStorageBackend(config: LMCacheEngineConfig, metadata: LMCacheEngineMetadata) -> LMCBackendInterface:
    if config.remote_url is not None:
        return LMCRemoteBackend(config, metadata)
    if config.local_disk is not None:
        return LMCLocalDiskBackend(config, metadata)
    if config.local_cpu:
        return LMCLocalBackend(config, metadata)
    raise ValueError(f"Invalid backend configuration: {config}")
