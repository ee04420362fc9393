"""Subcommands of `sgl-blend`, discovered by `sgl_blend.cli`."""
