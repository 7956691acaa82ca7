"""A Megatron-LM style hybrid model whose KDA layers decode with ReplaySSM state."""
