"""What runs inside other engines and the code that drives them: `integrations.vllm` (the vLLM plugin, its runner and
the live doctor)."""
