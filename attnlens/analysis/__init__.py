"""Analyses of attention rows: eigen spectra, subspace overlap, partial computation (reconstruct),
position importance, learned masks (dam) and fixed patterns, with the objectives, the task
accuracy and the held-out evaluation that judge every change to attention."""
