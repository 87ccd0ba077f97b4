"""Measured choices: the draft tree's sweep over (steps, topk, draft tokens) and the CPU demo's chain pick.
Above decoding and train, whose engine and teacher-forced pass they time and predict."""
