"""Components shared by the decoders."""
