"""Profiling micro-kernels that calibrate sgl-blend's cost model on the device at hand.

Installed only as `sgl_blend.kernels` (the Hugging Face distribution owns the top-level name
`kernels`). Unlike `server/`, this folder has no guard against a top-level import from the
repository root: transformers imports whatever `kernels` it finds there to read its version, and
a raising guard would break every SGLang process started from the root. These modules keep no
state, so a second copy under that name is harmless.
"""
