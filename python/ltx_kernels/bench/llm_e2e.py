"""End-to-end LLM benchmark: prefill and decode of an 8B-class decoder, stock vs ours.

    python -m ltx_kernels.bench.llm_e2e --layers 4 --prefill 8192 --json llm.json --markdown llm.md

``--model llama3-8b`` (default): Llama-3-8B dimensions (hidden 4096, MLP 14336, 32 query / 8 kv
heads of 128, Llama-3 rope scaling, vocab 128256); ``--model falcon-7b``: Falcon-7B's (hidden
4544, MLP 18176, 71 query heads of 64 sharing one kv head, rotary, attention and MLP in
parallel after one LayerNorm, vocab 65024). ``--layers`` decoder layers, random bf16 weights, sdpa
attention. Modes, on the same model one after another: stock eager, stock +
``torch.compile(fullgraph=True)``, ours (``ltx_kernels.transformers.apply``), ours + compile.

- prefill: one forward over ``--prefill`` tokens (batch 1, logits of the last token only, as
  ``generate`` asks for);
- decode: one token per sequence for ``--decode-batch`` sequences against a StaticCache
  holding ``--prefill`` tokens (each timed call appends one more).

Per mode and phase: the median of ``--reps`` CUDA-event-timed calls after warm-up, the
profiler's kernel split (GEMM / attention / other) with the share of GPU time in "other"
(norms, rotary, activations, residual adds, copies), and the error of the last logits
against stock eager.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from ltx_kernels.bench import harness

MODES = ["eager", "compile", "ours", "ours+compile"]

LLAMA3_8B = dict(
    hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, vocab_size=128256, rms_norm_eps=1e-5, hidden_act="silu", max_position_embeddings=131072,
    rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=8192),
    tie_word_embeddings=False,
)  # fmt: skip


FALCON_7B = dict(
    hidden_size=4544, ffn_hidden_size=18176, num_attention_heads=71, multi_query=True, new_decoder_architecture=False,
    parallel_attn=True, alibi=False, bias=False, vocab_size=65024, layer_norm_epsilon=1e-5,
    max_position_embeddings=32768, tie_word_embeddings=True,
)  # fmt: skip

# --model: (transformers model_type, config), the title of its report.
MODELS = {
    "llama3-8b": ("llama", LLAMA3_8B, "Llama-3-8B"),
    "falcon-7b": ("falcon", FALCON_7B, "Falcon-7B"),
}


def random_model(name: str, layers: int, dtype=torch.bfloat16, device="cuda"):
    """A ``--model`` decoder with ``layers`` layers and random weights, sdpa attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, dims, _ = MODELS[name]
    config = AutoConfig.for_model(model_type, num_hidden_layers=layers, **dims)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def _set_mode(model, mode: str):
    import ltx_kernels.transformers as lt

    lt.remove(model)
    torch._dynamo.reset()
    if mode.startswith("ours"):
        lt.apply(model)
    return torch.compile(model, fullgraph=True) if mode.endswith("compile") else model


def run(model, modes, prefill: int, decode_batch: int, reps: int) -> list[dict]:
    from transformers import StaticCache

    generator = torch.Generator(device="cuda").manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, prefill), device="cuda", generator=generator)
    # Room for every decode call of a mode (warm-up, timing, profiling); the cache is rewound
    # to `prefill` tokens before each mode, so each decodes at context prefill .. prefill + reps + 5.
    cache = StaticCache(config=model.config, max_cache_len=prefill + reps + 16)
    with torch.no_grad():  # fill the cache once (stock eager)
        model(input_ids=prompt.expand(decode_batch, -1), past_key_values=cache, logits_to_keep=1)
    token = torch.randint(0, vocab, (decode_batch, 1), device="cuda", generator=generator)
    phases = {
        "prefill": dict(input_ids=prompt, use_cache=False, logits_to_keep=1),
        "decode": dict(input_ids=token, past_key_values=cache, logits_to_keep=1),
    }
    reference: dict[str, torch.Tensor] = {}
    rows = []
    for mode in modes:
        forward = _set_mode(model, mode)
        for layer in cache.layers:
            layer.cumulative_length.fill_(prefill)
        for phase, kwargs in phases.items():
            row = {"phase": phase, "mode": mode}

            def step(kwargs=kwargs):
                return forward(**kwargs).logits

            with torch.no_grad():
                t0 = time.perf_counter()
                out = step()
                torch.cuda.synchronize()
                row["first_call_s"] = time.perf_counter() - t0
                for _ in range(3):
                    out = step()
                reference.setdefault(phase, out.float().clone())  # eager runs first
                row["err_vs_eager"] = harness.rel_err(out, reference[phase])
                row["ms"] = harness.time_ms(step, reps)
                row["kernels_ms"] = harness.kernel_split_ms(step)
            rows.append(row)
            print(_row_line(row), flush=True)
    _set_mode(model, "eager")
    return rows


def _other_share(r: dict) -> float:
    k = r["kernels_ms"]
    return k["other"] / max(k["gemm"] + k["attention"] + k["other"], 1e-9)


def _row_line(r: dict) -> str:
    return (f"| {r['phase']} | {r['mode']} | {r['ms']:.2f} | {harness.split_text(r['kernels_ms'], 2)} | "
            f"{100 * _other_share(r):.1f}% | {r['err_vs_eager']:.2e} | {r['first_call_s']:.1f} |")


def markdown(rows: list[dict], meta: dict, args) -> str:
    head = (f"{MODELS[args.model][2]} dimensions, {args.layers} decoder layers, random weights, bf16, sdpa; "
            f"prefill: 1 x {args.prefill} tokens; decode: {args.decode_batch} x 1 token against a "
            f"StaticCache of {args.prefill}. {meta['gpu']}, torch {meta['torch']}, transformers "
            f"{meta['transformers']}. Median of {args.reps} CUDA-event-timed calls; kernel split from "
            "the profiler (GPU ms); 'other' = share of GPU time outside GEMM and attention.\n\n")
    lines = ["| phase | mode | ms | GEMM / attention / other / idle ms | other | err vs eager | first call s |",
             "|---|---|---|---|---|---|---|"]
    lines += [_row_line(r) for r in rows]
    speedups = []
    for phase in ("prefill", "decode"):
        by = {r["mode"]: r["ms"] for r in rows if r["phase"] == phase}
        pairs = [("ours", "eager"), ("compile", "eager"), ("ours+compile", "compile")]
        speedups += [f"{phase}: {a} vs {b} {by[b] / by[a]:.2f}x" for a, b in pairs if a in by and b in by]
    return head + "\n".join(lines) + "\n\nSpeed-ups: " + "; ".join(speedups) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.llm_e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prefill", type=int, default=8192)
    parser.add_argument("--decode-batch", type=int, default=1)
    parser.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the LLM end-to-end benchmark")
    import transformers

    meta = dict(harness.device_meta(None), transformers=transformers.__version__, layers=args.layers,
                model=args.model)
    model = random_model(args.model, args.layers)
    rows = run(model, args.modes, args.prefill, args.decode_batch, args.reps)
    harness.write_report(markdown(rows, meta, args), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
