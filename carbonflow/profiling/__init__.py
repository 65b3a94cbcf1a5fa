"""carbonflow.profiling."""
