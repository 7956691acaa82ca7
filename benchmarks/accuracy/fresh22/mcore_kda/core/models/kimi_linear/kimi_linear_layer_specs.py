"""Module specs of Kimi Linear stacks (cf. megatron/core/models/mamba/mamba_layer_specs.py)."""

from mcore_kda.core.ssm.kda_layer import KDALayer, KDALayerSubmodules, RMSNorm
from mcore_kda.core.ssm.kda_mixer import KDAMixer, KDAMixerSubmodules
from mcore_kda.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from mcore_kda.core.transformer.spec_utils import ModuleSpec

from .kimi_linear_model import KDAStack, KDAStackSubmodules

kimi_linear_stack_spec = ModuleSpec(
    module=KDAStack,
    submodules=KDAStackSubmodules(
        kda_layer=ModuleSpec(
            module=KDALayer,
            submodules=KDALayerSubmodules(
                norm=RMSNorm,
                mixer=ModuleSpec(
                    module=KDAMixer,
                    submodules=KDAMixerSubmodules(
                        in_proj=ColumnParallelLinear,
                        a_proj=ColumnParallelLinear,
                        b_proj=ColumnParallelLinear,
                        out_proj=RowParallelLinear,
                    ),
                ),
            ),
        ),
        final_norm=RMSNorm,
    ),
)
