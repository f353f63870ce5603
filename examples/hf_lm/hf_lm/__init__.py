"""A lab's small Hugging Face causal LM on bytes: a transformers GPT-2 built from a config in
code and text files read with `datasets`; jobs/hf_lm.yaml names them by reference. Nothing of
hpc_train in it."""
