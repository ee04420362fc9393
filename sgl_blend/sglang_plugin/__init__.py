"""The SGLang plugin: registered under the ``sglang.srt.plugins`` entry point.

SGLang calls `register` in each of its processes. It reads the launcher's `PluginSettings`
once, builds the process's one `PluginRuntime` from them and hands it to the scheduler hooks,
the internal-state hooks and the radix-cache backend; nothing else holds plugin state. Importing
this package does not import SGLang, so launchers can build settings without it.
"""

from __future__ import annotations

import logging

from sgl_blend.launch import cpu_compat
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
    cpu_compat.install()
    runtime = PluginRuntime(plugin_settings())
    register_hooks(runtime)
    register_backend(runtime)
