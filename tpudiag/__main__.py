"""`python -m tpudiag`: the same entry point as the `tpudiag` console script."""

from tpudiag.cli import main

if __name__ == "__main__":
    main()
