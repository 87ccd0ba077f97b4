"""eaglekit's DeepSeek decoder on one GPU at the DeepSeek-V2-Lite shape, random bf16 weights built on the GPU.

    python benchmarks/lab/deepseek_h200.py            # one H200, < 8 minutes; JSON to $OUT (default ./out)
    python benchmarks/lab/deepseek_h200.py --tiny     # the same stages on a CPU with a tiny config (a smoke test)

Shape: 27 layers (the first dense), hidden 2048, MLA with kv_lora 512, no q_lora, qk_nope 128, qk_rope 64, v 128,
16 heads, 64 routed experts top-6 + 2 shared (moe_intermediate 1408), dense intermediate 10944, vocab 102400,
YaRN as V2-Lite's config (factor 40, mscale 0.707). No files, no network.

Stages (each prints its progress; a stage that fails records its error and the next one runs):
  copy_bandwidth     a 2 GiB device-to-device copy: bytes read + written per second
  build              the model on the GPU, random bf16 weights (norms 1, the router float32)
  roofline           the bytes one decode token touches: attention, the dense layer, per MoE layer the router,
                     6 routed + 2 shared experts, the final norm and lm_head, the latent cache at the context;
                     tokens/s at the measured copy bandwidth; per cycle shape, the bytes its verify touches
                     (each expert any of its rows chose, once) over a step's: what a verify costs in steps where both
                     run at copy bandwidth
  step_eager_graph   the recorded greedy decode step (CUDA graph) without torch.compile
  step_compiled      the same with the layers compiled (the path `generate` takes on a GPU): tokens/s, its fraction
                     of the roofline; with --experts auto,triton also step_compiled_triton (the routed experts
                     through eaglekit.kernels.moe_gemv; grouped: torch._grouped_mm, models.moe.Experts.grouped),
                     and with --profile-step each one's kernels by device time
  cycles             the EAGLE-3 cycle with a random draft (hidden 2048, 16 heads, draft vocab 32000) for chains
                     (3,1,4) and (5,1,6), a CUDA graph a phase as the Decoder replays them, over the compiled step
                     (both with the first --experts mode).
                     The random draft's proposals are rejected, so each cycle accepts its root only; a chain's
                     cycle costs the same whatever it accepts (its cache update moves nothing), so the figure is
                     the cycle's cost at any accept length (the method of benchmarks/cases/h200.py)
  prefill            a --context-token prompt's prefill (the target's, no draft), eager and through the prompt
                     graphs (--prompt-graphs: compile_prompts(), the routed experts grouped or dense), their compile
                     outside the timing (median of 10 after 2 warm-up calls at other lengths)
  transformers       transformers' DeepseekV2ForCausalLM.generate on the same weights: 64 new tokens after a
                     128-token prompt, greedy, prefill included (tok/s)

Timing: CUDA events around each call, the median over many calls after warm-up; the committed length is put back
before each call, outside the timed span.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

T0 = time.time()
DEADLINE_S = 7 * 60  # stages not started by then are skipped (the integrator's limit is 8 minutes)


def _prompt(t, ids: torch.Tensor):
    """The prompt `ids` into the target's own sequence (what tests/sequence.py's prefill does: forward_rows on the
    target's cache as one row) -> (logits, None)."""
    from eaglekit.kernels.compiling import prompt_calls
    from eaglekit.models.mla import RowLatent

    T = ids.numel()
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril_()
    kv = RowLatent.over(t.cache)
    with torch.inference_mode(), prompt_calls():
        logits, _ = t.forward_rows(kv, ids[None], torch.arange(T, device=ids.device)[None], causal[None], t.span)
        kv.length += T
    return logits[0], None


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def v2_lite_raw(tiny: bool) -> dict:
    raw = dict(model_type="deepseek_v2", vocab_size=102400, hidden_size=2048, intermediate_size=10944,
               moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
               q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
               n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1,
               topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
               rms_norm_eps=1e-6, max_position_embeddings=163840, hidden_act="silu", attention_bias=False,
               tie_word_embeddings=False, bos_token_id=100000, eos_token_id=100001,
               rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 0.707,
                                "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                                "beta_fast": 32.0, "beta_slow": 1.0})
    if tiny:
        raw.update(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                   num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
                   qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, n_shared_experts=1,
                   num_experts_per_tok=2, bos_token_id=1, eos_token_id=2)
    return raw


class Bench:
    def __init__(self, args):
        self.args = args
        self.tiny = args.tiny
        self.dev = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
        self.cuda = self.dev == "cuda"
        self.dtype = torch.float32 if self.tiny else torch.bfloat16
        self.out = {"shape": "tiny" if self.tiny else "DeepSeek-V2-Lite", "device": self.dev, "stages": {},
                    "errors": {}, "env": {"torch": torch.__version__}}
        self.ctx: dict = {}

    # --- helpers ---------------------------------------------------------------------------------
    def ms(self, fn, reps: int, warm: int = 3, before=None) -> list[float]:
        for _ in range(warm):
            if before:
                before()
            fn()
        if self.cuda:
            torch.cuda.synchronize()
        out = []
        for _ in range(reps):
            if before:
                before()
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                out.append(a.elapsed_time(b))
            else:
                t = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t) * 1e3)
        return out

    def stage(self, name, fn):
        if time.time() - T0 > DEADLINE_S:
            self.out["errors"][name] = "skipped: past the time limit"
            log(f"{name}: skipped (time)")
            return
        log(f"{name} ...")
        t = time.time()
        try:
            res = fn()
            self.out["stages"][name] = {**(res or {}), "stage_s": round(time.time() - t, 1)}
            log(f"{name}: {json.dumps(self.out['stages'][name])[:400]}")
        except Exception as e:  # noqa: BLE001 (a benchmark stage: record, go on)
            self.out["errors"][name] = f"{type(e).__name__}: {e}"[:2000]
            self.out["errors"][name + "_traceback"] = traceback.format_exc()[-4000:]
            log(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}")
        self.write()

    def write(self):
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "deepseek_h200.json.tmp"
        tmp.write_text(json.dumps(self.out, indent=1, default=str))
        tmp.replace(out / "deepseek_h200.json")

    # --- stages ----------------------------------------------------------------------------------
    def env(self):
        import transformers

        self.out["env"]["transformers"] = transformers.__version__
        if self.cuda:
            self.out["env"]["gpu"] = torch.cuda.get_device_name()
        return {}

    def copy_bandwidth(self):
        n = (2 * 2**30) if self.cuda else 64 * 2**20
        x = torch.empty(n, dtype=torch.uint8, device=self.dev)
        y = torch.empty_like(x)
        ms = self.ms(lambda: y.copy_(x), reps=20)
        tbs = sorted(2 * n / (m / 1e3) / 1e12 for m in ms)
        self.ctx["copy_tb_s"] = tbs[len(tbs) // 2]
        del x, y
        return {"copy_tb_s": round(self.ctx["copy_tb_s"], 3)}

    def build(self):
        from eaglekit.models.deepseek import DeepSeekModel, DeepSeekTarget
        from eaglekit.models.deepseek_config import parse_deepseek_config

        raw = v2_lite_raw(self.tiny)
        cfg = parse_deepseek_config(raw, "benchmark config")
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.dev):
                net = DeepSeekModel(cfg)
        finally:
            torch.set_default_dtype(torch.float32)
        g = torch.Generator(device=self.dev).manual_seed(0)
        with torch.no_grad():
            for name, p in net.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0, 0.02, generator=g)  # never time zeros
        t = DeepSeekTarget(net, self.dev, self.dtype)
        t.fuse()
        self.ctx.update(raw=raw, cfg=cfg, target=t)
        n = sum(p.numel() for p in net.parameters())
        return {"parameters": n, "router_dtype": str(net.model.layers[-1].mlp.gate.weight.dtype)}

    def roofline(self):
        t, c = self.ctx["target"], self.ctx["cfg"]
        net = t.net
        esz = torch.finfo(self.dtype).bits // 8

        def nbytes(m):
            return sum(p.numel() * p.element_size() for p in m.parameters())

        total, moe_layers = 0, 0
        expert = 3 * c.moe_intermediate_size * c.hidden_size * esz
        for i, layer in enumerate(net.model.layers):
            total += nbytes(layer.self_attn) + nbytes(layer.input_layernorm) + nbytes(layer.post_attention_layernorm)
            if c.is_moe(i):
                moe = layer.mlp
                total += nbytes(moe.gate) + (nbytes(moe.shared_experts) if moe.shared_experts is not None else 0)
                total += c.num_experts_per_tok * expert
                moe_layers += 1
            else:
                total += nbytes(layer.mlp)
        total += nbytes(net.model.norm) + nbytes(net.lm_head)
        cache = c.num_layers * c.latent_width * esz * self.args.context
        self.ctx["token_bytes"] = total + cache
        bw = self.ctx.get("copy_tb_s", 4.25) * 1e12
        self.ctx["roofline_tok_s"] = bw / self.ctx["token_bytes"]
        # A verify of n rows reads each expert any of them chose once (grouped experts). Random weights route each
        # row's top-k near uniformly over E experts, so n rows choose E (1 - (1 - k/E)^n) distinct ones on average
        # (a real model's neighbouring tokens share experts more often: fewer). The verify cannot cost less than its
        # bytes over the step's, and a cycle costs at least its verify: for an MoE target at one row this bound, not
        # a dense target's cycle over step, is what a cycle is judged against.
        E, k = c.n_routed_experts, c.num_experts_per_tok
        verify = {}
        for shape in self.args.shapes.split(";"):
            n = int(shape.split(",")[2])
            distinct = E * (1 - (1 - k / E) ** n) if E else 0.0
            vb = self.ctx["token_bytes"] + moe_layers * (distinct - k) * expert
            verify[shape.replace(",", "_")] = {"rows": n, "distinct_experts": round(distinct, 1), "bytes": int(vb),
                                               "over_step": round(vb / self.ctx["token_bytes"], 3),
                                               "ms_at_copy_bandwidth": round(vb / bw * 1e3, 4)}
        self.ctx["verify_roofline"] = verify
        return {"weight_bytes_per_token": total, "latent_cache_bytes_at_context": cache,
                "parameters_per_token": round(total / esz / 1e9, 3),
                "roofline_tok_s": round(self.ctx["roofline_tok_s"], 1), "at_copy_tb_s": round(bw / 1e12, 3),
                "verify_roofline": verify}

    def _prefill(self, t):
        g = torch.Generator(device="cpu").manual_seed(1)
        prompt = torch.randint(0, self.ctx["cfg"].vocab_size - 1, (self.args.context,), generator=g).to(self.dev)
        t.reset(self.args.context + 256)
        logits, _ = _prompt(t, prompt)
        return prompt, logits

    def prefill(self):
        t = self.ctx["target"]
        sync = torch.cuda.synchronize if self.cuda else (lambda: None)

        def timed() -> float:
            out = []
            for _ in range(10):
                sync()
                t0 = time.perf_counter()
                self._prefill(t)
                sync()
                out.append(1e3 * (time.perf_counter() - t0))
            return round(statistics.median(out), 3)

        res = {"prompt_tokens": self.args.context}
        self._prefill(t)
        res["eager_ms"] = timed()
        t.compile_prompts()
        tc = time.time()
        for n in (2, 65):  # both sides of any branch on the length (the engine's own warm-up lengths)
            t.reset(self.args.context + 256)
            _prompt(t, torch.arange(n, device=self.dev))
        res["prompt_graphs_compile_s"] = round(time.time() - tc, 1)
        res["prompt_graphs_ms"] = timed()
        t.compile_prompts(False)
        return res

    def _step(self, compiled: bool):
        from benchmarks.timing import OneRow
        from eaglekit.decoding.tree import TreeShape

        t = self.ctx["target"]
        if compiled:
            t.compile(None if self.args.tuned else {})
        else:
            t.net.compiled_layer = None
        prompt, _ = self._prefill(t)
        tc = time.time()
        one = OneRow(t, None, TreeShape.make(), prompt, graphs=self.cuda)  # the one engine's plain step, one row
        record_s = time.time() - tc if self.cuda else 0.0
        run, before = one.step, one.restore
        ms = self.ms(run, reps=self.args.reps, warm=5, before=before)
        med = statistics.median(ms)
        res = {"step_ms_median": round(med, 4), "step_ms_p10_p90": [round(sorted(ms)[len(ms) // 10], 4),
                                                                    round(sorted(ms)[len(ms) * 9 // 10], 4)],
               "tokens_per_s": round(1e3 / med, 1), "reps": len(ms), "record_or_compile_s": round(record_s, 1)}
        if "roofline_tok_s" in self.ctx:
            res["roofline_fraction"] = round(1e3 / med / self.ctx["roofline_tok_s"], 4)
        if compiled:
            self.ctx.setdefault("step_ms", med)  # what the cycles are over: the first experts mode's step
            if self.cuda and self.args.profile_step:
                res["kernels"] = self._kernels(run, before)
        return res

    def _kernels(self, run, before, reps: int = 20) -> str:
        """The compiled step's kernels by device time over `reps` replays (--profile-step): the table is written
        beside the JSON (deepseek_step_kernels.txt); returns its file name."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                before()
                run()
            torch.cuda.synchronize()
        mode = self.ctx.get("experts", "auto")
        name = "deepseek_step_kernels.txt" if mode == "auto" else f"deepseek_step_kernels_{mode}.txt"
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=110)
        Path(self.args.out).mkdir(parents=True, exist_ok=True)
        (Path(self.args.out) / name).write_text(f"{reps} replays of the compiled step\n{table}")
        return name

    def cycles(self):
        from benchmarks.timing import OneRow
        from eaglekit.capture import CaptureSpec
        from eaglekit.decoding.tree import TreeShape
        from eaglekit.draft.model import DraftConfig, Eagle3Draft

        t, c = self.ctx["target"], self.ctx["cfg"]
        if t.net.compiled_layer is None and self.cuda:
            t.compile(None if self.args.tuned else {})
        spec = CaptureSpec.default(c.num_layers)
        dv = min(32000, c.vocab_size // 2)
        heads = c.num_heads
        cfg = DraftConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_heads=heads,
                          num_kv_heads=heads, vocab_size=c.vocab_size, draft_vocab_size=dv, capture=spec,
                          max_position_embeddings=c.max_position_embeddings)
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.dev):
                d = Eagle3Draft(cfg)
        finally:
            torch.set_default_dtype(torch.float32)
        g = torch.Generator(device=self.dev).manual_seed(2)
        with torch.no_grad():
            for w in d.parameters():
                w.normal_(0, 0.02, generator=g)
            d.embed_tokens.weight.copy_(t.embed_weight())
            ar = torch.arange(dv, device=self.dev)
            d.d2t.copy_(ar * 2 - ar)  # offsets: draft id i -> target id 2i
        d.fuse()
        if self.cuda:
            d.compile()
        step = self.ctx.get("step_ms")
        res, phases = {}, {}
        for s in self.args.shapes.split(";"):
            shape = TreeShape(*(int(x) for x in s.split(",")))
            key = s.replace(",", "_")
            prompt, _ = self._prefill(t)
            tc = time.time()
            cyc = OneRow(t, d, shape, prompt, graphs=self.cuda, capture=spec)  # the one engine at one row
            reset, by_phase, PHASES = cyc.restore, cyc.cycle, cyc.PHASES
            ms = self.ms(by_phase, reps=self.args.reps // 2, warm=3, before=reset)
            med = statistics.median(ms)
            res[f"cycle_ms_{key}"] = round(med, 4)
            res[f"record_s_{key}"] = round(time.time() - tc, 1)
            phases[key] = {ph: round(statistics.median(self.ms(lambda: cyc.run(ph), reps=10, warm=1,  # noqa: B023
                                                                before=reset)), 4) for ph in PHASES}
            if step:
                res[f"cycle_over_step_{key}"] = round(med / step, 3)
            bound = self.ctx.get("verify_roofline", {}).get(key)
            if bound:  # the verify's bytes alone at copy bandwidth, over the cycle's time
                res[f"verify_roofline_over_cycle_{key}"] = round(bound["ms_at_copy_bandwidth"] / med, 3)
            log(f"  cycle {s}: {med:.3f} ms" + (f" = {med / step:.3f} steps" if step else ""))
        res["phases_ms"] = phases
        return res

    def transformers_generate(self):
        from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

        raw = dict(self.ctx["raw"])
        raw.pop("model_type")
        hcfg = DeepseekV2Config(**raw)
        ours = self.ctx["target"].net.state_dict()
        # our graphs and the draft hold memory: drop what is not needed before a second copy of the weights
        if self.cuda:
            torch.cuda.empty_cache()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.dev):
                model = DeepseekV2ForCausalLM(hcfg)
        finally:
            torch.set_default_dtype(torch.float32)
        model.eval()
        sd = model.state_dict()
        copied, missing = 0, []
        with torch.no_grad():
            for k, v in sd.items():
                src = ours.get(k)
                m = None if src is not None else _per_expert(k, ours)
                if src is None and m is not None:
                    src = m
                if src is None or tuple(src.shape) != tuple(v.shape):
                    missing.append(k)
                    continue
                v.copy_(src)
                copied += 1
        g = torch.Generator(device="cpu").manual_seed(1)
        ids = torch.randint(0, hcfg.vocab_size - 1, (1, self.args.context), generator=g).to(self.dev)
        att = torch.ones_like(ids)
        kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=att)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=4, **kw)  # warm-up
            if self.cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(ids, max_new_tokens=self.args.hf_new_tokens, min_new_tokens=self.args.hf_new_tokens,
                                 **kw)
            if self.cuda:
                torch.cuda.synchronize()
            el = time.perf_counter() - t
        n = out.shape[1] - ids.shape[1]
        res = {"new_tokens": n, "seconds": round(el, 3), "tokens_per_s": round(n / el, 2),
               "weights_copied": copied, "weights_not_copied": missing[:10], "n_not_copied": len(missing),
               "experts_implementation": str(getattr(hcfg, "_experts_implementation", None)),
               "attn_implementation": str(getattr(hcfg, "_attn_implementation", None))}
        # our greedy tokens for the same prompt (the same weights): agreement is a sanity check in bf16, not a test
        try:
            from eaglekit.decoding.decoder import Decoder

            ourtok = Decoder(self.ctx["target"]).generate(ids[0].tolist(), 16, eos_ids=()).token_ids
            res["first_16_tokens_agree"] = sum(a == b for a, b in zip(ourtok, out[0, ids.shape[1]:].tolist()))
        except Exception as e:  # noqa: BLE001
            res["agree_error"] = str(e)[:300]
        del model
        return res

    def run(self):
        self.stage("env", self.env)
        self.stage("copy_bandwidth", self.copy_bandwidth)
        self.stage("build", self.build)
        if "target" not in self.ctx:
            return self.out
        self.stage("roofline", self.roofline)
        self.stage("prefill", self.prefill)
        self.stage("step_eager_graph", lambda: self._step(False))
        if self.cuda or self.args.compile_on_cpu:
            modes = self.args.experts.split(",")
            for mode in modes:
                # "auto": the experts' per-call choice (moe.Experts); another mode names its stage
                self.ctx["target"].set_experts(None if mode == "auto" else mode)
                self.ctx["experts"] = mode
                self.stage("step_compiled" + ("" if mode == "auto" else f"_{mode}"), lambda: self._step(True))
            self.ctx["experts"] = modes[0]  # the cycles run with the first mode, over its step
            self.ctx["target"].set_experts(None if modes[0] == "auto" else modes[0])
            if len(modes) > 1:  # a fresh compile for the cycles' mode (the last stage compiled another)
                self.ctx["target"].compile(None if self.args.tuned else {})
            self.out["cycles_experts"] = modes[0]
        if not self.args.skip_cycles:
            self.stage("cycles", self.cycles)
        if not self.args.skip_hf:
            self.stage("transformers", self.transformers_generate)
        s = self.out["stages"]
        first = self.args.experts.split(",")[0]
        best = (s.get("step_compiled" + ("" if first == "auto" else f"_{first}")) or s.get("step_eager_graph")
                or {})
        self.out["summary"] = {
            "tokens_per_s": best.get("tokens_per_s"), "roofline_tok_s": s.get("roofline", {}).get("roofline_tok_s"),
            "roofline_fraction": best.get("roofline_fraction"),
            "cycle_over_step": {k: v for k, v in s.get("cycles", {}).items() if k.startswith("cycle_over_step")},
            "verify_bytes_over_step": {k: v["over_step"] for k, v in
                                       s.get("roofline", {}).get("verify_roofline", {}).items()},
            "verify_roofline_over_cycle": {k: v for k, v in s.get("cycles", {}).items()
                                           if k.startswith("verify_roofline_over_cycle")},
            "transformers_tokens_per_s": s.get("transformers", {}).get("tokens_per_s"),
            "total_s": round(time.time() - T0, 1)}
        self.write()
        log(f"summary: {json.dumps(self.out['summary'])}")
        return self.out


def _per_expert(key: str, ours: dict):
    """transformers versions that keep experts as a ModuleList: mlp.experts.<e>.<gate|up|down>_proj.weight from our
    stacked weights."""
    import re

    m = re.match(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", key)
    if not m:
        return None
    e = int(m.group(2))
    if m.group(3) == "down_proj":
        return ours[f"{m.group(1)}.down_proj"][e]
    gu = ours[f"{m.group(1)}.gate_up_proj"][e]
    half = gu.shape[0] // 2
    return gu[:half] if m.group(3) == "gate_proj" else gu[half:]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a tiny config on the CPU (checks the script end to end)")
    p.add_argument("--out", default=os.environ.get("OUT", "./out"), help="folder for deepseek_h200.json")
    p.add_argument("--reps", type=int, default=None, help="timed calls per figure (default 200; tiny 6)")
    p.add_argument("--context", type=int, default=None, help="prompt tokens before decoding (default 128; tiny 16)")
    p.add_argument("--shapes", default="3,1,4;5,1,6", help="cycle shapes steps,topk,draft_tokens; separated")
    p.add_argument("--hf-new-tokens", type=int, default=None, help="transformers' generate length (default 64)")
    p.add_argument("--skip-hf", action="store_true", help="leave out transformers' generate")
    p.add_argument("--skip-cycles", action="store_true", help="leave out the EAGLE-3 cycles")
    p.add_argument("--experts", default="auto", help="the compiled step once per experts mode, comma-separated "
                   "(auto: per call; triton: eaglekit.kernels.moe_gemv; grouped: torch._grouped_mm); the cycles "
                   "and the summary take the first")
    p.add_argument("--profile-step", action="store_true", help="the compiled step's kernels by device time, to "
                   "deepseek_step_kernels.txt beside the JSON")
    p.add_argument("--tuned", action="store_true", help="compile with eaglekit's tuned inductor options (slower "
                   "to compile) instead of inductor's defaults")
    p.add_argument("--compile-on-cpu", action="store_true", help="(--tiny) compile the layers on the CPU too")
    args = p.parse_args(argv)
    args.reps = args.reps or (4 if args.tiny else 200)
    args.context = args.context or (16 if args.tiny else 128)
    args.hf_new_tokens = args.hf_new_tokens or (4 if args.tiny else 64)
    out = Bench(args).run()
    return 0 if out["stages"] else 1


if __name__ == "__main__":
    sys.exit(main())
