"""OpenTelemetry side of tracescore: span → run transform, the exporter, score write-back."""
