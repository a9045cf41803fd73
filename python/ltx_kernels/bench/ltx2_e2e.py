"""End-to-end LTX-2 benchmark: one transformer step at full size, random weights.

    python -m ltx_kernels.bench.ltx2_e2e --modes eager compile ours ours+compile --json a.json --markdown a.md
    python -m ltx_kernels.bench.ltx2_e2e --modes ours-fp8 torchao-fp8+compile --json b.json --markdown b.md

``ltx2-19b``: diffusers' ``LTX2VideoTransformer3DModel`` at its default config, LTX-2's 19 B
audio-video transformer (48 blocks; video: 32 heads of 128, audio: 32 heads of 64), at
``LTX2Pipeline``'s default size: 121 frames of 768x512 at 24 fps, i.e. 16 x 16 x 24 video
latents (6,144 tokens, VAE scale 8 in time and 32 in space) and 126 audio latents (5.04 s at
25 a second), 1024 text tokens for each stream, CFG batch 2. bf16. The modes of the FLUX
benchmark (:mod:`ltx_kernels.bench.flux_e2e`), timed the same way; the error column compares
the video output. At 19 B parameters (38 GB in bf16) a quantized mode's fresh copy does not fit
beside the stock model on an 80 GB GPU: run the FP8 modes in a call of their own (as above),
where no stock model is built. ``ours+ropetables`` / ``ours-fp8+ropetables``: ours with
diffusers' video RoPE tables (``inject(rope="stock")``) instead of the positions the video
self-attention's q/k kernel computes its angles from.
"""

from __future__ import annotations

import argparse

import torch

from ltx_kernels.bench import harness
from ltx_kernels.bench.flux_e2e import add_run_arguments, markdown, run
from ltx_kernels.bench.ltx_e2e import ROPE_TABLE_MODES, available_modes

# name -> (config, (frames, height, width, fps) default, text tokens)
CONFIGS = {
    "ltx2-19b": (dict(), (121, 512, 768, 24.0), 1024),
    "ltx2-tiny": (dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8,
                       cross_attention_dim=16, audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2,
                       audio_attention_head_dim=8, audio_cross_attention_dim=16, num_layers=2, caption_channels=16),
                  (9, 64, 96, 24.0), 7),
}


def random_transformer(config: str, dtype: torch.dtype, device):
    """LTX2VideoTransformer3DModel with random weights, built in ``dtype`` on ``device``."""
    from diffusers import LTX2VideoTransformer3DModel

    return harness.random_model(LTX2VideoTransformer3DModel, CONFIGS[config][0], dtype, device)


def latent_shape(model, frames: int, height: int, width: int, fps: float) -> tuple[int, int, int, int]:
    """(video frames, height, width, audio frames) of the latents, as LTX2Pipeline derives them."""
    cfg = model.config
    scale_t, scale_h, scale_w = cfg.vae_scale_factors
    audio_per_second = cfg.audio_sampling_rate / cfg.audio_hop_length / cfg.audio_scale_factor
    return ((frames - 1) // scale_t + 1, height // scale_h, width // scale_w,
            round(frames / fps * audio_per_second))  # fmt: skip


def step_inputs(model, frames: int, height: int, width: int, fps: float, text_tokens: int, device) -> dict:
    """One CFG step's inputs (batch 2), seeded: packed video and audio latents, the text states
    of each stream, one timestep (and sigma, for LTX-2.3) per sample."""
    g = torch.Generator(device=device).manual_seed(0)
    cfg, dtype = model.config, harness.model_dtype(model)
    f, h, w, audio = latent_shape(model, frames, height, width, fps)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    t = torch.full((2,), 0.5, device=device)
    return dict(hidden_states=randn(2, f * h * w, cfg.in_channels),
                audio_hidden_states=randn(2, audio, cfg.audio_in_channels),
                encoder_hidden_states=randn(2, text_tokens, cfg.caption_channels),
                audio_encoder_hidden_states=randn(2, text_tokens, cfg.caption_channels),
                timestep=t * 1000, sigma=t, num_frames=f, height=h, width=w, fps=fps, audio_num_frames=audio,
                return_dict=False)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ltx_kernels.bench.ltx2_e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="ltx2-19b", choices=sorted(CONFIGS))
    add_run_arguments(parser, ROPE_TABLE_MODES)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return harness.no_cuda("the LTX-2 end-to-end benchmark")
    config, (frames, height, width, fps), text = CONFIGS[args.config]
    meta = dict(harness.device_meta(None), config=args.config, frames=frames, height=height, width=width)
    modes = available_modes(args.modes)

    def fresh():
        return random_transformer(args.config, torch.bfloat16, "cuda")

    def inputs(model):
        return step_inputs(model, frames, height, width, fps, text, "cuda")

    rows = run(fresh, inputs, modes, args.reps)
    title = (f"LTX2VideoTransformer3DModel ({args.config}), random weights, bf16, CFG batch 2, {frames} frames "
             f"{width}x{height} at {fps:g} fps with audio, {text} text tokens per stream")
    harness.write_report(markdown(rows, meta, title, args.reps), meta, rows, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
