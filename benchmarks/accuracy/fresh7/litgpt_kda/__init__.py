from litgpt_kda.api import LLM
from litgpt_kda.config import Config
from litgpt_kda.model import GPT
