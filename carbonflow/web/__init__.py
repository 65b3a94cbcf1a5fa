"""carbonflow.web."""
