"""Core modules of the web UI (loaders, backends, generation, sessions, settings)."""
