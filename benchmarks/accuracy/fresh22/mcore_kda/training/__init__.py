from .global_vars import get_args, set_args

__all__ = ["get_args", "set_args"]
