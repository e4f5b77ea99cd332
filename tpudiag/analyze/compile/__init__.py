"""The analyses of a TPU compile: the compile report, a slice's collectives, `estimate`, and the
`kernels bench` figures."""
