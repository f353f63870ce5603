"""Training state on disk: atomic step-N directories, "latest complete", retention, safe loading."""
