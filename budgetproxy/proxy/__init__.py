"""The model-call hot path: parse, account, disclose, forward upstream, relay, record."""
