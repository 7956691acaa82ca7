"""KDA hybrid layers with a ReplaySSM state pool, written the way vLLM's model executor is."""
