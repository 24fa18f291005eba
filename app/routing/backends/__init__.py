"""Backend adapters: one interface over OpenAI-compatible, Ollama and later kinds."""
