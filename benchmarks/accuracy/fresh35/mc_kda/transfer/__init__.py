"""Memory registration, slot layout headers and the prefill-to-decode connector."""
