"""Project webhooks: threshold events delivered to a project's HTTPS receivers."""
