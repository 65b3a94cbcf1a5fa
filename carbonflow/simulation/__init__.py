"""carbonflow.simulation."""
