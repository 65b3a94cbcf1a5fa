"""carbonflow.energy."""
