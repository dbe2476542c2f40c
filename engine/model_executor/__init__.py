"""SGLang: srt/model_executor/. The model and the runner that drives it over the KV pool."""
