"""Results: every document model of tpudiag (frozen dataclasses with to_dict/from_dict), one module
per document family. Models only: no I/O, no analysis, no rendering."""
