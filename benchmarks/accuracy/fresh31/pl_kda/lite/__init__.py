"""A small in-tree stand-in for the parts of ``lightning`` this project uses.

It keeps Lightning's names and call order (``configure_model`` under the precision plugin's
``module_init_context``, ``convert_module`` at setup, ``on_load_checkpoint`` before
``load_state_dict``, callback hooks before the module's) so that the project code reads and
behaves as it does with ``lightning`` installed.
"""

from pl_kda.lite.core import AttributeDict, Callback, LightningDataModule, LightningModule, Trainer
from pl_kda.lite.fabric import Fabric
from pl_kda.lite.precision import HalfPrecision, MixedPrecision, Precision

__all__ = [
    "AttributeDict",
    "Callback",
    "Fabric",
    "HalfPrecision",
    "LightningDataModule",
    "LightningModule",
    "MixedPrecision",
    "Precision",
    "Trainer",
]
