"""SGLang: srt/disaggregation/ (prefill/decode disaggregation over TCP)."""
