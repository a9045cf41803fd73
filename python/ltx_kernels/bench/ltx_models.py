"""LTX-Video transformers with random weights and synthetic text embeddings: the offline
setup shared by examples/generate_video.py, the end-to-end benchmark and the model tests.

The configs are those of Lightricks' checkpoints (2B: LTX-Video 0.9.x, D = 2048, 28 layers;
13B: LTX-Video 0.9.7, D = 4096, 48 layers) plus a tiny one for CPU tests.
"""

from __future__ import annotations

import torch

from ltx_kernels.bench import harness

CONFIGS = {
    "tiny": dict(
        in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=10,
        cross_attention_dim=40, num_layers=2, caption_channels=16,
    ),
    "2b": dict(
        in_channels=128, out_channels=128, num_attention_heads=32, attention_head_dim=64,
        cross_attention_dim=2048, num_layers=28, caption_channels=4096,
    ),
    "13b": dict(
        in_channels=128, out_channels=128, num_attention_heads=32, attention_head_dim=128,
        cross_attention_dim=4096, num_layers=48, caption_channels=4096,
    ),
}

# Lightricks/LTX-Video scheduler_config.json (FlowMatchEulerDiscreteScheduler).
SCHEDULER_CONFIG = dict(
    base_image_seq_len=1024, base_shift=0.95, max_image_seq_len=4096, max_shift=2.05,
    num_train_timesteps=1000, shift=1.0, shift_terminal=0.1, use_dynamic_shifting=True,
)

# The pipelines' latent geometry: the VAE compresses 8x in time and 32x in space.
TEMPORAL_COMPRESSION = 8
SPATIAL_COMPRESSION = 32
TEXT_TOKENS = 128


def text_mask(batch: int) -> torch.Tensor:
    """[batch, 128] attention mask of the synthetic prompts: the last quarter is padding."""
    mask = torch.ones(batch, TEXT_TOKENS, dtype=torch.long)
    mask[:, 3 * TEXT_TOKENS // 4:] = 0
    return mask


def random_transformer(config: str, dtype: torch.dtype, device, seed: int = 0):
    """An ``LTXVideoTransformer3DModel`` of ``config`` with random weights, built on ``device``
    (initialising 2B parameters on the CPU takes a minute; on the GPU, a second)."""
    from diffusers import LTXVideoTransformer3DModel

    return harness.random_model(LTXVideoTransformer3DModel, CONFIGS[config], dtype, device, seed)


def latent_grid(num_frames: int, height: int, width: int) -> tuple[int, int, int]:
    """(frames, height, width) of the transformer's token grid for a video of that size."""
    return (
        (num_frames - 1) // TEMPORAL_COMPRESSION + 1,
        height // SPATIAL_COMPRESSION,
        width // SPATIAL_COMPRESSION,
    )


def step_inputs(model, batch: int, num_frames: int, height: int, width: int, frame_rate: float = 25.0,
                timestep: float = 500.0, seed: int = 0) -> dict:
    """Keyword arguments of one transformer forward as LTXPipeline passes them: noise latents,
    synthetic text embeddings (128 tokens, the last quarter masked out as padding), one
    timestep per sample, and the pipeline's rope_interpolation_scale."""
    f, h, w = latent_grid(num_frames, height, width)
    cfg = model.config
    param = next(model.parameters())
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=param.device, dtype=param.dtype)

    mask = text_mask(batch).to(param.device)
    return dict(
        hidden_states=randn(batch, f * h * w, cfg.in_channels),
        encoder_hidden_states=randn(batch, TEXT_TOKENS, cfg.caption_channels),
        timestep=torch.full((batch,), timestep, device=param.device),
        encoder_attention_mask=mask,
        num_frames=f,
        height=h,
        width=w,
        rope_interpolation_scale=(TEMPORAL_COMPRESSION / frame_rate, SPATIAL_COMPRESSION, SPATIAL_COMPRESSION),
        return_dict=False,
    )


def random_pipeline(transformer):
    """An ``LTXPipeline`` around ``transformer`` with no text encoder, tokenizer or VAE: it
    runs from prompt embeddings to latents (``output_type="latent"``)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTXPipeline

    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    return LTXPipeline(scheduler=scheduler, vae=None, text_encoder=None, tokenizer=None, transformer=transformer)


def prompt_embeds(transformer, batch: int, seed: int = 1, device=None) -> dict:
    """Synthetic (negative) prompt embeddings and masks for ``random_pipeline``, on ``device``
    (default: the transformer's; give it when the weights are offloaded)."""
    cfg = transformer.config
    param = next(transformer.parameters())
    device = param.device if device is None else device
    g = torch.Generator(device="cpu").manual_seed(seed)
    mask = text_mask(batch)

    def embeds():
        return torch.randn(batch, TEXT_TOKENS, cfg.caption_channels, generator=g).to(device, param.dtype)

    return dict(
        prompt_embeds=embeds(),
        prompt_attention_mask=mask.to(device),
        negative_prompt_embeds=embeds(),
        negative_prompt_attention_mask=mask.to(device),
    )
