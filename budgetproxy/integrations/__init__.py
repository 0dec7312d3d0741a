"""Integrations with evaluation harnesses: each has its own extra and is imported only by the
harness that loads it (inspect-ai: `inspect_hooks`, through its entry point)."""
