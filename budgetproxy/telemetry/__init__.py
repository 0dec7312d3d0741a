"""Observability that consumes finished work: Prometheus metrics and OpenTelemetry traces."""
