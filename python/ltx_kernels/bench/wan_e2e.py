"""End-to-end Wan benchmark: one transformer forward at full size, random weights.

    python -m ltx_kernels.bench.wan_e2e --json wan.json --markdown wan.md

``wan21-14b``: Wan 2.1 T2V 14B's ``WanTransformer3DModel`` (40 blocks, D = 5120, 40 heads of
128, FFN 13824), at 480p (832x480) and 81 frames: 21 x 60 x 104 VAE latents, 32,760 video
tokens, cross-attention to 512 umT5 tokens. bf16, batch 1: Wan's pipelines run the conditional
and the unconditional forward of a CFG step as two calls, so a step is two of these forwards.
The modules diffusers keeps in fp32 when it loads the model in bf16 (``_keep_in_fp32_modules``:
the time embedder, the norms, the modulation tables) are kept in fp32 here too. The modes of the
FLUX benchmark (:mod:`ltx_kernels.bench.flux_e2e`), timed the same way.
"""

from __future__ import annotations

import argparse

import torch

from ltx_kernels.bench import harness
from ltx_kernels.bench.flux_e2e import add_run_arguments, markdown, run
from ltx_kernels.bench.ltx_e2e import available_modes

# name -> (config, (frames, height, width) default, text tokens)
CONFIGS = {
    "wan21-14b": (dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                       out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                       cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
                  (81, 480, 832), 512),
    "wan-tiny": (dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24, in_channels=4,
                      out_channels=4, text_dim=16, freq_dim=32, ffn_dim=96, num_layers=2, cross_attn_norm=True,
                      qk_norm="rms_norm_across_heads", rope_max_seq_len=32),
                 (9, 64, 80), 7),
}


def random_transformer(config: str, dtype: torch.dtype, device):
    """WanTransformer3DModel with random weights in ``dtype`` on ``device``, its
    ``_keep_in_fp32_modules`` in fp32 as ``from_pretrained(torch_dtype=dtype)`` leaves them."""
    from diffusers import WanTransformer3DModel

    model = harness.random_model(WanTransformer3DModel, CONFIGS[config][0], dtype, device)
    keep = set(model._keep_in_fp32_modules or ())
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in keep:
            module.float()
    for name, p in model.named_parameters():
        if name.rsplit(".", 1)[-1] in keep:
            p.data = p.data.float()
    return model


def latent_shape(frames: int, height: int, width: int) -> tuple[int, int, int]:
    """Wan's VAE latents for a video: 4x in time (plus the first frame), 8x in space."""
    return (frames - 1) // 4 + 1, height // 8, width // 8


def step_inputs(model, frames: int, height: int, width: int, text_tokens: int, device) -> dict:
    """One forward's inputs (batch 1), seeded: the latents, a timestep, the text states."""
    g = torch.Generator(device=device).manual_seed(0)
    cfg, dtype = model.config, harness.model_dtype(model)
    return dict(hidden_states=torch.randn(1, cfg.in_channels, *latent_shape(frames, height, width), generator=g,
                                          device=device, dtype=dtype),
                timestep=torch.tensor([500.0], device=device),
                encoder_hidden_states=torch.randn(1, text_tokens, cfg.text_dim, generator=g, device=device,
                                                  dtype=dtype),
                return_dict=False)


def tokens(config: str, frames: int, height: int, width: int) -> int:
    """Video tokens: the latents in (1, 2, 2) patches."""
    t, h, w = latent_shape(frames, height, width)
    pt, ph, pw = CONFIGS[config][0]["patch_size"]
    return (t // pt) * (h // ph) * (w // pw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.wan_e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="wan21-14b", choices=sorted(CONFIGS))
    parser.add_argument("--frames", type=int, help="video frames (default: the config's)")
    parser.add_argument("--height", type=int, help="pixels (default: the config's)")
    parser.add_argument("--width", type=int, help="pixels (default: the config's)")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the Wan end-to-end benchmark")
    config, defaults, text = CONFIGS[args.config]
    frames, height, width = (given or default for given, default in zip((args.frames, args.height, args.width),
                                                                          defaults))
    meta = dict(harness.device_meta(None), config=args.config, frames=frames, height=height, width=width)
    modes = available_modes(args.modes)

    def fresh():
        return random_transformer(args.config, torch.bfloat16, "cuda")

    rows = run(fresh, lambda model: step_inputs(model, frames, height, width, text, "cuda"), modes,
               args.reps, tokens(args.config, frames, height, width))
    title = (f"WanTransformer3DModel ({args.config}), random weights, bf16 (fp32 where diffusers keeps it), batch 1 "
             f"(one of a CFG step's two forwards), {frames} frames {width}x{height}, {text} text tokens")
    harness.write_report(markdown(rows, meta, title, args.reps), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
