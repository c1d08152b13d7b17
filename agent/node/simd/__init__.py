"""SIMD utilisation of the runtime: per-thread arch_status, mapped-code scans, PMU counters (source back-end)."""
