"""Megatron global variables."""

_GLOBAL_ARGS = None


def _ensure_var_is_initialized(var, name):
    """Make sure the input variable is not None."""
    assert var is not None, "{} is not initialized.".format(name)


def get_args():
    """Return arguments."""
    _ensure_var_is_initialized(_GLOBAL_ARGS, "args")
    return _GLOBAL_ARGS


def set_args(args):
    global _GLOBAL_ARGS
    _GLOBAL_ARGS = args


def unset_global_variables():
    """Unset global vars (tests)."""
    global _GLOBAL_ARGS
    _GLOBAL_ARGS = None
