"""The one engine: rows, the draft tree, acceptance, sampling, stops, the cycle and the baseline loop."""
