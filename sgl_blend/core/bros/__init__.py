"""BROS (real-time/best-effort co-location): cost model, Alg. 1, adaptive batch size, bidirectional KV.

Plain Python like the rest of `sgl_blend.core`: the SGLang plugin and the simulator drive the
same code.
"""
