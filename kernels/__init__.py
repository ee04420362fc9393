"""Profiling micro-kernels that calibrate sgl-blend's cost model on the device at hand."""
