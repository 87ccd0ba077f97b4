"""Training a draft: data in, regeneration, feature extraction, vocab mapping, TTT, the loop, the demo recipe."""
