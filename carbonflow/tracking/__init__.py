"""carbonflow.tracking."""
