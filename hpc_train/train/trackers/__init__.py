"""Experiment trackers of rank 0 (log.trackers): TensorBoard, Weights & Biases, MLflow.

Each tracker is one module behind the `MetricsTracker` protocol (protocol.py); `TrackerSet`
(tracker_set.py) opens the chosen ones, decides which records each logs after a resume
(runtime/tracker_state.py) and keeps a failing tracker from costing the training. The trackers'
packages are imported only inside their modules, when rank 0 opens them.
"""
