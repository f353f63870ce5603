"""What runs inside each rank: identity, logging, the worker entry point."""
