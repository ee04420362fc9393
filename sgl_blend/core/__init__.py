"""The scheduling core: plain Python, no SGLang import, shared by the SGLang plugin and the simulator."""
