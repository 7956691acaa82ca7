"""KDA (Kimi Delta Attention) mixer and its ReplaySSM decode ops."""
