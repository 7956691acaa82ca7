"""Model implementations of the engine."""
