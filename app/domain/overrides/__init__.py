"""BYO override keys: a project's own provider key for one conversation and model prefix."""
