"""SGLang: srt/managers/. The scheduler, its parts, the cache controller and the typed messages."""
