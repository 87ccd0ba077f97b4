"""`eaglekit serve`: an OpenAI-compatible HTTP server over the batched EAGLE-3 engine."""
