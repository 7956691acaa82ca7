# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""End-to-end recipes. Each recipe class takes a :class:`tt_kda.config.DictConfig`; the
configs the CLI ships with are in :mod:`tt_kda.recipes.configs`."""
