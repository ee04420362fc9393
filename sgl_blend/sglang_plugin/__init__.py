"""The SGLang plugin: registered under the ``sglang.srt.plugins`` entry point.

SGLang calls `register` in each of its processes. It first checks that this SGLang has every
internal the plugin touches (`sglang_boundary`, checked by `boundary_check`) and refuses to start
the server otherwise. It then reads the launcher's `PluginSettings` once, builds the process's one
`PluginRuntime` from them and hands it to the scheduler hooks, the internal-state hooks and the
radix-cache backend; nothing else holds plugin state. Importing this package does not import
SGLang, so launchers can build settings without it.
"""

from __future__ import annotations

import logging

from sgl_blend import cpu_compat
from sgl_blend.emulation.sglang_forward import register as register_emulation
from sgl_blend.sglang_plugin import sglang_boundary
from sgl_blend.sglang_plugin.boundary_check import require_boundary
from sgl_blend.sglang_plugin.hooks import register_hooks
from sgl_blend.sglang_plugin.radix_backend import register_backend
from sgl_blend.sglang_plugin.runtime import PluginRuntime
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings, SettingsError

logger = logging.getLogger(__name__)


def plugin_settings() -> PluginSettings:
    """The launcher's settings; a malformed value leaves every part of the plugin off (SGLang
    schedules on its own) rather than taking the server down, and says why."""
    try:
        return PluginSettings.from_env()
    except SettingsError:
        logger.exception("sgl-blend settings are invalid; the plugin leaves scheduling to SGLang")
        return PluginSettings(offline_policy=OFF)


def register() -> None:
    """Raises `boundary_check.SGLangBoundaryError` (a ``SystemExit``, which SGLang's plugin loader
    does not catch) before registering anything when this SGLang lacks what the plugin uses."""
    cpu_compat.install()
    require_boundary()
    runtime = PluginRuntime(plugin_settings())
    register_hooks(runtime)
    register_backend(runtime)
    register_emulation(runtime.settings.emulation, sglang_boundary)
