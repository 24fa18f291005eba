"""Quotas: per-project limits and their admission gate (usage records: ``app.domain.usage``)."""
