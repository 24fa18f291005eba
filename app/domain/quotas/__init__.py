"""Quotas: limits and usage records."""
