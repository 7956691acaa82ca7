"""The rule unit: one module per rule (``rlNNN_<name>.py``), the base class, shared wording.

Importing this package imports no rule: :mod:`.catalogue` lists them by module name, and
:mod:`.registry` imports them (and libcst) when a file must really be analysed.
"""
