"""The structural diff of two HLO modules: matching, then the diff."""
