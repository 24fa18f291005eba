"""Project secrets (the vault): write-only values a project's custom LLMs refer to."""
