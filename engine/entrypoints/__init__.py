"""SGLang: srt/entrypoints/. The HTTP frontend."""
