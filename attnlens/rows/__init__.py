"""Rows of attention scores: sources (a store or a model), the one moments engine (streaming float64
sums, mergeable), and moments jobs sharded over ranks and passes under a memory budget."""
