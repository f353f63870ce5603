"""Data parallelism (Horovod or torch DDP behind one interface) and, later, pipelines."""
