"""A small but real HiCache serving engine: TP ranks over torch.distributed,
a three-tier radix prefix cache and an SGLang-shaped scheduler."""
