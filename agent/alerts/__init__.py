"""Alert-rule tooling: the SLO burn-rate rule generator and the time-compressed test profile."""
