"""carbonflow.operators."""
