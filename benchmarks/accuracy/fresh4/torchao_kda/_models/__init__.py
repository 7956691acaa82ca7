"""Reference models (gpt-fast style) used by the benchmarks and tests."""
