"""Faults an operator will meet, each injected for real against the real stack
(SIGKILL of thaw's processes, a full file system, a second daemon, a FIFO, a
busy port, hostile input) and what thaw does about it. The README's "Faults
survived" table lists every fault with its test."""
