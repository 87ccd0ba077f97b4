"""What runs inside other engines (the vLLM plugin) and the code that drives them (the live doctor)."""
