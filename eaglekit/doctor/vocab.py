"""The vocabulary mapping (d2t) checked on its own evidence.

A draft's lm_head row j was trained to propose one target token; d2t says which (target id = j + d2t[j]). A
recorded hash (eaglekit.draft.checkpoint.vocab_map_sha) settles whether the d2t is the one trained with. Where
none is recorded, the probe's positions do: at each, the draft's first proposal (draft id j) and the token the
target chose. For a draft id proposed often, the token the target most often chose there is the token its row
was trained for; a d2t that maps most such ids elsewhere is not the draft's mapping, whatever the wiring (a
wrong wiring or another target lowers how often the proposal is right, not which token a row stands for).
"""

from __future__ import annotations

from typing import TypeGuard

import torch

MIN_PROPOSALS = 3  # a draft id counts once the target chose one token at this many of its proposals
MIN_IDS = 8  # ... and the evidence once this many ids count
WRONG_SHARE = 0.5  # the mapping is called wrong when most counted ids' usual token is not the one it maps to
MIN_LIFT = 5.0  # ... and those usual tokens are specific to the id (median lift), not the text's common ones


def vocab_evidence(pairs: list[tuple[torch.Tensor, torch.Tensor]], hot: torch.Tensor) -> dict | None:
    """-> {ids, wrong, share_mapped, share_usual, lift, examples} or None without pairs. `wrong`: the share of
    counted draft ids whose usual target token is not hot[j]; `share_mapped` / `share_usual`: the share of their
    positions where the target chose hot[j] / the usual token."""
    if not pairs:
        return None
    j = torch.cat([a for a, _ in pairs]).long()
    y = torch.cat([b for _, b in pairs]).long()
    if j.numel() == 0:
        return None
    hot = hot.cpu().long()
    V = int(max(int(y.max()), int(hot.max()))) + 1
    key, cnt = torch.unique(j * V + y, return_counts=True)
    kj, ky = key // V, key % V
    total = torch.bincount(j, minlength=hot.numel())
    # per draft id: the most frequent target token (ties: the smaller id) and its count
    order = torch.argsort(kj * (cnt.max() + 1) + cnt, stable=True)
    kj, ky, cnt = kj[order], ky[order], cnt[order]
    last = torch.ones_like(kj, dtype=torch.bool)
    last[:-1] = kj[1:] != kj[:-1]
    ids, usual, top = kj[last], ky[last], cnt[last]
    # an id counts when it has a usual token: proposed MIN_PROPOSALS times or more, the target choosing one token
    # at least MIN_PROPOSALS times and at half of them (a trained row's token; an untrained row's proposals meet
    # whatever the text holds there)
    keep = (total[ids] >= MIN_PROPOSALS) & (top >= MIN_PROPOSALS) & (2 * top >= total[ids])
    ids, usual, top = ids[keep], usual[keep], top[keep]
    if ids.numel() < MIN_IDS:
        return {"ids": int(ids.numel()), "wrong": None, "positions": int(j.numel())}
    mapped = hot[ids]
    n = total[ids].sum().double()
    at_mapped = torch.tensor([int(((j == a) & (y == m)).sum()) for a, m in zip(ids.tolist(), mapped.tolist())])
    # how specific each id's usual token is: its share after the id over its share at all positions (an untrained
    # draft's ids "usually" meet the text's most frequent tokens, lift near 1; a trained row's token, far above)
    freq = torch.bincount(y, minlength=V).double() / y.numel()
    lift = (top.double() / total[ids].double()) / freq[usual].clamp(min=1e-12)
    wrong = usual != mapped
    ex = [
        {"draft_id": int(a), "proposed": int(total[a]), "target_chose": int(u), "times": int(t), "d2t_maps_to": int(m)}
        for a, u, t, m in zip(ids[wrong].tolist(), usual[wrong].tolist(), top[wrong].tolist(), mapped[wrong].tolist())
    ][:3]
    return {
        "ids": int(ids.numel()),
        "wrong": round(float(wrong.double().mean()), 4),
        "share_mapped": round(float(at_mapped.sum() / n), 4),
        "share_usual": round(float(top.sum() / n), 4),
        "lift": round(float(lift.median()), 2),
        "positions": int(j.numel()),
        "examples": ex,
    }


def mapping_is_wrong(ev: dict | None) -> TypeGuard[dict]:
    return bool(
        ev
        and ev.get("wrong") is not None
        and ev["wrong"] >= WRONG_SHARE
        and ev.get("lift", 0) >= MIN_LIFT
        and ev["share_usual"] >= 2 * ev["share_mapped"] + 0.05
    )
