"""A simulated engine that drives the same scheduling core as the SGLang plugin, at paper scale."""
