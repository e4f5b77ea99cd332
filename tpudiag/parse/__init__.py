"""Parse: reads artifacts (xplane, HLO text, monitoring logs) into model objects and checked DataFrames."""
