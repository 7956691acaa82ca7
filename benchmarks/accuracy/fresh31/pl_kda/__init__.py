"""Kimi Delta Attention (KDA) decoding with ReplaySSM ring caches, trained and served with Lightning.

The package is laid out like a Lightning project: ``module`` holds the ``LightningModule``,
``datamodule`` the prompt ``LightningDataModule``, ``callbacks`` the callbacks that own the decode
state during validation and prediction, ``predict`` the Lightning Fabric loops and ``cli`` the
command line. ``lite`` is a small in-tree stand-in for the parts of ``lightning`` the project uses
(the package runs without a Lightning install), and ``ops`` the CPU path of the decode kernel.
"""

__version__ = "0.3.1"
