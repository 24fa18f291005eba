"""Project custom LLMs: Bob and Custom templates, served as ``custom:<name>``."""
