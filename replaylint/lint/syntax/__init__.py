"""CST plumbing with no torch knowledge: parse limits, parsing, traversal, positions, nodes."""
