from ...config import LMCacheEngineMetadata
from .serde import CompactGateDeserializer, CompactGateSerializer, Deserializer, FastDeserializer, FastSerializer
from .serde import NaiveDeserializer, NaiveSerializer, Serializer

_SERDES = {
    "naive": (NaiveSerializer, NaiveDeserializer),
    "fast": (FastSerializer, FastDeserializer),
    "compact": (CompactGateSerializer, CompactGateDeserializer),
}


def CreateSerde(serde_type: str, metadata: LMCacheEngineMetadata) -> tuple[Serializer, Deserializer]:
    if serde_type not in _SERDES:
        raise ValueError(f"Invalid serde type: {serde_type}")
    serializer_cls, deserializer_cls = _SERDES[serde_type]
    return serializer_cls(), deserializer_cls(metadata)
