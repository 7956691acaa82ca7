"""Pretrained model interfaces (``EncoderDecoderASR``, ``StreamingASR``)."""
