"""Training data: samplers that give every rank an equal part, datasets, transforms."""
