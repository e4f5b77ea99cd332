"""tpudiag's own version: one string, read by the package, the CLI and the run manifests."""

__version__ = "0.1.0"
