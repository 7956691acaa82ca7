"""Optional extensions; each lives in ``extensions/<name>/script.py``."""
