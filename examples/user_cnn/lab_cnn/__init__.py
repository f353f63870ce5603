"""A lab's own small CNN and image-folder dataset: an example of user code that hpc_train runs
without a change to either (jobs/user_cnn.yaml names them by reference)."""
