"""carbonflow.workloads."""
