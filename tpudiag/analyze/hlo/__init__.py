"""The HLO analyses every workflow shares: the opcode vocabulary, categories, costs, loops, dataflow,
fusions and one collective's figures. Imports nothing else from analyze/."""
