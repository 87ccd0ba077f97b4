"""The prompt-set comparison behind demo, eval and sweep (eaglekit.decoding.compare): its warm-up shows progress as it
goes (a first run on a GPU compiles and records for a minute or more), and stays out of the timings."""

from eaglekit.decoding.compare import compare
from eaglekit.decoding.decoder import Decoder
from eaglekit.decoding.tree import TreeShape
from eaglekit.draft import new_draft
from eaglekit.models import load_target


def test_the_warm_up_shows_each_run_it_makes(model_dirs, capsys):
    t = load_target(model_dirs["llama"], backend="ours")
    dec = Decoder(t, new_draft(t, seed=0), TreeShape(3, 1, 4), baseline_rows=4)
    c = compare(dec, [[1, 5, 9], [2, 7]], 8, warmup=4, progress="demo")
    err = capsys.readouterr().err
    assert "demo: warm-up" in err and "3/3" in err
    for what in ("the draft's cycle", "the target alone", "the one-row baseline"):
        assert what in err, what
    assert c.warmup_s > 0 and c.identical
    compare(dec, [[1, 5, 9]], 8, warmup=4, progress=None)  # no bar asked for: nothing written
    assert "warm-up" not in capsys.readouterr().err
