"""Batch lines, the layer under both executors' callers: parsing and preparing a line
(`lines`), tokenising its prompt (`tokenize`), planning lines globally (`plan`) and sending one
(`sender`). The Batch API's runner (`sgl_blend.server`) builds on it, and `sgl-blend run-batch`
(`sgl_blend.jobs`) on that runner."""
