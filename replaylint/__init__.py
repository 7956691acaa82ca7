"""replaylint: keep ReplaySSM gate caches in float32.

Three parts in one distribution:

* :mod:`replaylint.lint` — the static linter behind the ``replaylint`` command;
* :mod:`replaylint.guards` — runtime dtype guards for decode entry points (needs torch);
* :mod:`replaylint.kernels` — the bundled Helion ReplaySSM KDA decode kernel (needs torch, helion).
"""

from replaylint._version import __version__

__all__ = ["__version__"]
