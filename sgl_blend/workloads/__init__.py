"""Workloads for the simulator: real ShareGPT, synthetic traces calibrated to the paper's Table 4,
a mixer that hits a target compute density and prefix-sharing ratio (Appendix A.3), and JSONL."""
