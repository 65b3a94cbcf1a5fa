"""carbonflow.carbon."""
