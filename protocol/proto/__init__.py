"""Generated protobuf classes for `inference.diloco` (regenerate with `make proto`)."""
