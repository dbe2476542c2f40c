"""SGLang: srt/mem_cache/. KV pools, the radix cache family and the L3 storage."""
