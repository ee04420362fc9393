"""The plugin's scheduling modes, one per ``--colocation`` value; a server runs exactly one.

``off`` is BlendServe alone (the offline pool orders offline work, `Mode`'s no-ops everywhere
else); ``hygen`` and ``echo`` share `ColocationMode`, their differences living in the core's
controller and in Echo's KV priorities; ``bros`` is `BrosMode`.
"""

from __future__ import annotations

from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.sglang_plugin.modes.base import Mode
from sgl_blend.sglang_plugin.modes.bros import BrosMode
from sgl_blend.sglang_plugin.modes.colocation import ColocationMode

MODE_CLASSES: dict[str, type[Mode]] = {"off": Mode, "hygen": ColocationMode, "echo": ColocationMode, "bros": BrosMode}


def make_mode(config: ColocationConfig) -> Mode:
    return MODE_CLASSES[config.mode](config)
