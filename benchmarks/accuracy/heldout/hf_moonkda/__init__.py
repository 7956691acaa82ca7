"""A Moonlight-KDA causal LM with a ReplaySSM generation cache, in the transformers layout."""
