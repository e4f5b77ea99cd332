"""The cross-process analysis of a multi-process job's (or a pod's) traces."""
