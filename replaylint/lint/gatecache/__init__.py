"""Which names are gate caches: name patterns, entry points, learning, the textual
pre-filter and its grep, and the one walker that finds every gate-cache binding."""
