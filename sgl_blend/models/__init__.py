"""Models sgl-blend builds locally, without any model hub: see `registry`."""
