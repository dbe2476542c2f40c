"""The incident catalogue: one folder per incident with scenario.toml and README.md."""
