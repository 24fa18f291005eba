"""The OpenAI-compatible ``/v1`` surface."""
