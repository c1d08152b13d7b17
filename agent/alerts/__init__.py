"""Alert-rule tooling: the rule-file reader (the source of alert names), the runbook/dashboard link generator,
the SLO burn-rate rule generator and the time-compressed test profile."""
