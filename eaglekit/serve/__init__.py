"""Serving: `eaglekit serve`, an OpenAI-compatible HTTP server over the batched EAGLE-3 engine, and
`eaglekit bench`, an OpenAI-compatible load client."""
