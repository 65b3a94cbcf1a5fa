"""carbonflow.planning."""
