"""A Mamba-style hybrid LM whose KDA mixers decode with ReplaySSM rings (mamba_ssm layout)."""
