"""Analytics over per-request samples: windowed sketches, latency quantiles, bimodality."""
