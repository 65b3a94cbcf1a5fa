"""carbonflow.execution."""
