"""Runtime conversations: stored history, forks and sticky fallback pins."""
