"""thawd's metrics: the names its callers use, over control/metrics.py (one
table of every series, prometheus-client's registry and exposition)."""
from __future__ import annotations

from control.metrics import BUCKETS, HELP, SERIES, Metrics, serve

__all__ = ["BUCKETS", "HELP", "SERIES", "Metrics", "serve"]
