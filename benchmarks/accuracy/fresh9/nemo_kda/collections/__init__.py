"""Domain collections."""
