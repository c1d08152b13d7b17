"""Engine /metrics: fast exposition reader, engine adapters, windowed bucket quantiles."""
