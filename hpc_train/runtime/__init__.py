"""The base layer every rank and the driver share: who a rank is (identity), when to stop (stop
flag), the heartbeat a rank writes, and fault injection for tests. It imports nothing of ours
but the run directory's names (`rundir`), so every layer above may use it.
"""
