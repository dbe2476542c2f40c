"""hctool: find, reproduce and prevent rank-divergence bugs in TP hierarchical KV caches."""

__version__ = "0.1.0"
