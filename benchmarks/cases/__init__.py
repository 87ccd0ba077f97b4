"""The suite's cases, by where they run: cpu (the shipped demo pair), h200 (the 8B shape on one GPU), batch
(batched decoding)."""
