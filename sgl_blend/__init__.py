"""sgl-blend: BlendServe-style offline batch scheduling and online/offline co-location for SGLang."""

__version__ = "0.1.0"
