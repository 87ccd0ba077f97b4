"""Serving: an OpenAI-compatible load client (bench)."""
