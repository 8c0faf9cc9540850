"""What goes to disk: the store of captured scores (and the extraction that writes it), results
(one base class and one registry for every kind), provenance, atomic file helpers, and ranks on
torch.distributed."""
