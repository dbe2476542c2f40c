"""SGLang: srt/distributed/."""
