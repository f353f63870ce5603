"""`python -m hpc_train doctor`: is this machine ready to build, submit and run jobs?"""
