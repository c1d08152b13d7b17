"""The ``inferwatch`` command line. Each command lives in its own module and registers on the app."""
