"""Server side: block loading, the per-block backend and the session memory cache."""
