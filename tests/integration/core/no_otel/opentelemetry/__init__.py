# On PYTHONPATH in tests/integration/core/test_trace_off.py: stands in for an environment
# without the otel extra (importing it fails as a missing package would).
raise ImportError("No module named 'opentelemetry' (the otel extra is not installed)")
