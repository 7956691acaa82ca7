from .lora import LoraConfig, LoraLayer, LoraModel
from .tuners_utils import BaseTuner, BaseTunerLayer, check_target_module_exists
