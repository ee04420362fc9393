"""Workloads for the simulator: real ShareGPT, synthetic traces calibrated to the paper's Table 4,
and a mixer that hits a target compute density and prefix-sharing ratio (Appendix A.3)."""
