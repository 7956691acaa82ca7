"""Paths on disk to file reports, without libcst: discovery, atomic file I/O, one file, the
result cache, and the batch runner with its scan and worker processes."""
