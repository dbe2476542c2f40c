"""SGLang: srt/ (the packages mirror its layout; docs/architecture.md maps them).

A small but real HiCache serving engine: TP ranks over torch.distributed,
a three-tier radix prefix cache and an SGLang-shaped scheduler."""
