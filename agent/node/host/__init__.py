"""Parsers for host files (procfs, sysfs): pure functions from text to typed values."""
