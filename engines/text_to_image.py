"""Text-to-image Stable Diffusion as a StepEngine: text encoder, conditional UNet with
classifier-free guidance, VAE decoder, each batched across requests.

One request = one image. Inputs (each one element; all but ``prompt`` optional, filled in
by ``prepare`` before the request is queued):

- ``prompt`` BYTES (UTF-8), ``negative_prompt`` BYTES (default empty, diffusers' own default);
- ``seed`` INT64 (>= 0, default 0), ``steps`` INT32 (0: the configured default);
- ``guidance_scale`` FP32 (0..100, default 7.5; <= 1 runs no unconditional half, as diffusers);
- ``height``, ``width`` INT32 (0: the UNet's own size; multiples of 8 within the UNet's range).

Output ``image``: UINT8 [H, W, 3], diffusers' ``(x / 2 + 0.5).clamp(0, 1)`` then
``round(x * 255)`` (what its PIL output holds).

How one ``step(states)`` runs, whatever mix of requests the batcher hands it:

1. the states that have no text embedding yet (admitted since the last call) are encoded
   in one text-encoder call, conditional and unconditional prompts together;
2. per latent size (requests of different sizes never share a UNet call), one UNet call
   holds every state at its own timestep: the unconditional and conditional halves of each
   guided request side by side, one row for an unguided one; each request's noise
   prediction is combined with its own guidance scale, then the per-sample DDIM/DDPM update
   of ``engines.schedulers`` moves each to its own next timestep;
3. the states that finished on this step are decoded by the VAE together (per size).

States change only once the whole call succeeded, so a batcher may retry them one by one.
The request-level ``infer`` (static and dynamic batchers) runs the very same ``step`` over
its batch until every request is done, so the three batchers serve one pipeline.

Determinism: each request's latents come from its own CPU generator seeded with its seed,
drawn as ``StableDiffusionPipeline`` draws them, and every later draw from the same
generator; the guidance and scheduler math are per request. A lone request equals
diffusers' pipeline output under the same seed, steps and guidance to float tolerance
(``tests/test_text_to_image_engine.py``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import monotonic
from typing import Any

import numpy as np
import torch
from wattserve.engines.base import EngineError, StepObserver, TensorSpec
from wattserve.engines.request_values import read_number, read_scalar, read_text
from wattserve.engines.schedulers import PerSampleScheduler, Schedule, make_scheduler
from wattserve.engines.torch_engine import resolve_device

log = logging.getLogger("wattserve.engine.text_to_image")

PIPELINE_CLASS = "StableDiffusionPipeline"
# model_index.json entries this engine loads, and the classes it loads them as
COMPONENTS = {
    "text_encoder": ("CLIPTextModel",),
    "tokenizer": ("CLIPTokenizer", "CLIPTokenizerFast"),
    "unet": ("UNet2DConditionModel",),
    "vae": ("AutoencoderKL",),
}
DEFAULT_GUIDANCE = 7.5
MAX_GUIDANCE = 100.0
MAX_PROMPT_BYTES = 16384  # the tokenizer truncates to its model_max_length anyway
ALIGN = 8  # diffusers' check_inputs: height and width divisible by 8

INPUTS = (
    TensorSpec("prompt", (1,), "BYTES"),
    TensorSpec("negative_prompt", (1,), "BYTES", optional=True),
    TensorSpec("seed", (1,), "INT64", optional=True),
    TensorSpec("steps", (1,), "INT32", optional=True),
    TensorSpec("guidance_scale", (1,), "FP32", optional=True),
    TensorSpec("height", (1,), "INT32", optional=True),
    TensorSpec("width", (1,), "INT32", optional=True),
)
OUTPUT = TensorSpec("image", (-1, -1, 3), "UINT8")


@dataclass(frozen=True)
class TextRequest:
    """One request's checked values."""

    prompt: str
    negative_prompt: str
    seed: int
    steps: int
    guidance_scale: float
    height: int
    width: int

    @property
    def guided(self) -> bool:
        """diffusers' do_classifier_free_guidance (for a UNet without time_cond_proj_dim)."""
        return self.guidance_scale > 1.0


@dataclass(eq=False)
class TextToImageState:
    """One request in flight: its token ids, embeddings once encoded, latents, generator."""

    request: TextRequest
    schedule: Schedule
    token_ids: torch.Tensor  # [1 or 2, L]: (unconditional,) conditional
    latents: torch.Tensor  # [1, C, h, w], float32, on the engine's device
    generator: torch.Generator
    embeds: torch.Tensor | None = None  # [1 or 2, L, D], set by the first step
    index: int = 0  # steps done so far
    image: np.ndarray | None = None  # UINT8 [H, W, 3] once decoded

    @property
    def steps(self) -> int:
        return self.request.steps


def read_pipeline_index(path: Path) -> dict[str, Any]:
    """``model_index.json`` of a Stable Diffusion folder, or EngineError naming what is there."""
    path = Path(path)
    index_file = path / "model_index.json"
    if not path.is_dir():
        raise EngineError(f"text-to-image model folder {path} does not exist")
    if not index_file.is_file():
        found = sorted(p.name for p in path.iterdir())[:8]
        raise EngineError(f"{path} has no model_index.json (a diffusers pipeline folder); found {found}")
    index = json.loads(index_file.read_text())
    cls = index.get("_class_name")
    found_parts = {name: (index.get(name) or [None, None])[1] for name in COMPONENTS}
    if cls != PIPELINE_CLASS:
        raise EngineError(
            f"{path} holds a {cls} (components {found_parts}); wattserve serves "
            f"{PIPELINE_CLASS} folders (CLIP text encoder, UNet2DConditionModel, AutoencoderKL)"
        )
    wrong = {name: got for name, got in found_parts.items() if got not in COMPONENTS[name]}
    if wrong:
        raise EngineError(
            f"{path}: {PIPELINE_CLASS} with unsupported components {wrong}; expected {COMPONENTS}"
        )
    return index


class TextToImageEngine:
    """Stable Diffusion text-to-image, batched per step. Blocking; one caller thread."""

    platform = "diffusers"

    def __init__(
        self,
        name: str,
        model_path: Path | str,
        *,
        scheduler: str = "ddim",
        eta: float = 0.0,
        device: str = "auto",
        fp16: bool = False,
        max_batch_size: int = 8,
        default_steps: int = 20,
        max_steps: int = 1000,
        threads: int | None = None,
    ) -> None:
        from diffusers import AutoencoderKL, UNet2DConditionModel
        from transformers import CLIPTextModel, CLIPTokenizer

        self.name = name
        self._device = resolve_device(device)
        self.device = str(self._device)
        if threads is not None and self._device.type == "cpu":
            torch.set_num_threads(threads)
        path = Path(model_path)
        read_pipeline_index(path)
        self._dtype = torch.float16 if fp16 and self._device.type == "cuda" else torch.float32
        local: dict[str, Any] = {"local_files_only": True}
        self.tokenizer = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer", **local)
        local["torch_dtype"] = self._dtype  # the models' weights, loaded in the dtype they run in
        text_encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder", **local)
        unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet", **local)
        vae = AutoencoderKL.from_pretrained(path, subfolder="vae", **local)
        del local["torch_dtype"]
        cfg = unet.config
        if cfg.time_cond_proj_dim is not None or cfg.addition_embed_type is not None:
            raise EngineError(
                f"{path}: the UNet takes extra conditioning (time_cond_proj_dim="
                f"{cfg.time_cond_proj_dim}, addition_embed_type={cfg.addition_embed_type!r}); "
                "only plain Stable Diffusion UNets are served"
            )
        if cfg.in_channels != vae.config.latent_channels:
            raise EngineError(
                f"{path}: UNet takes {cfg.in_channels} channels, VAE makes {vae.config.latent_channels}"
            )
        sched_config = type(make_scheduler(scheduler)).load_config(path, subfolder="scheduler", **local)
        self.scheduler = PerSampleScheduler(make_scheduler(scheduler, sched_config), eta=eta)
        self.text_encoder = text_encoder.eval().to(self._device)
        self.unet = unet.eval().to(self._device)
        self.vae = vae.eval().to(self._device)

        self.vae_scale = 2 ** (len(vae.config.block_out_channels) - 1)
        size = cfg.sample_size
        lh, lw = (size, size) if isinstance(size, int) else tuple(size)
        self.default_size = (int(lh) * self.vae_scale, int(lw) * self.vae_scale)
        # The smallest latent the UNet's down path keeps at least one cell of; the largest:
        # twice the size it was built for.
        smallest = self.vae_scale * 2 ** (len(cfg.block_out_channels) - 1)
        self.min_size = max(ALIGN, smallest)
        self.max_size = 2 * max(self.default_size)
        self.latent_channels = int(cfg.in_channels)
        self.text_length = int(self.tokenizer.model_max_length)

        self.inputs = list(INPUTS)
        self.outputs = [OUTPUT]
        self.max_batch_size = max_batch_size
        self.batch_sizes: list[int] | None = None
        self.default_steps = default_steps
        self.max_steps = min(max_steps, self.scheduler.num_train_timesteps)
        if not 1 <= default_steps <= self.max_steps:
            raise ValueError(f"default_steps must be in 1..{self.max_steps}")
        self.step_observer: StepObserver | None = None

    # ------------------------------------------------------------------ request checks
    def parse(self, inputs: Mapping[str, np.ndarray]) -> TextRequest:
        """One request's values (no batch axis), or ValueError naming the field at fault."""
        prompt = read_text(inputs, "prompt", MAX_PROMPT_BYTES, required=True)
        negative = read_text(inputs, "negative_prompt", MAX_PROMPT_BYTES)
        seed = read_number(inputs, "seed", 0)
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        steps = read_number(inputs, "steps", 0) or self.default_steps
        if not 1 <= steps <= self.max_steps:
            raise ValueError(
                f"steps must be in 1..{self.max_steps} (0: default {self.default_steps}), got {steps}"
            )
        guidance = float(read_scalar(inputs, "guidance_scale", DEFAULT_GUIDANCE))
        if not (math.isfinite(guidance) and 0.0 <= guidance <= MAX_GUIDANCE):
            raise ValueError(f"guidance_scale must be within 0..{MAX_GUIDANCE:g}, got {guidance}")
        height = self._size(inputs, "height", 0)
        width = self._size(inputs, "width", 1)
        return TextRequest(prompt, negative, seed, int(steps), guidance, height, width)

    def _size(self, inputs: Mapping[str, np.ndarray], name: str, axis: int) -> int:
        value = read_number(inputs, name, 0) or self.default_size[axis]
        align = max(ALIGN, self.vae_scale)
        if not (self.min_size <= value <= self.max_size and value % align == 0):
            raise ValueError(
                f"{name} must be a multiple of {align} within {self.min_size}..{self.max_size} "
                f"(0: default {self.default_size[axis]}), got {value}"
            )
        return int(value)

    def prepare(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], tuple]:
        """A whole request (batch axis first, one row) checked, every optional input filled
        in with its default, and its batch key: the latent size (only requests of one size
        share a request-level batch). ValueError (the client's 400) names the field."""
        rows = {len(v) for v in inputs.values()}
        if rows != {1}:
            raise ValueError(f"one image per request: every input needs one row, got {sorted(rows)}")
        req = self.parse({name: value[0] for name, value in inputs.items()})
        filled = {
            "prompt": np.array([[req.prompt.encode()]], dtype=object),
            "negative_prompt": np.array([[req.negative_prompt.encode()]], dtype=object),
            "seed": np.array([[req.seed]], np.int64),
            "steps": np.array([[req.steps]], np.int32),
            "guidance_scale": np.array([[req.guidance_scale]], np.float32),
            "height": np.array([[req.height]], np.int32),
            "width": np.array([[req.width]], np.int32),
        }
        return filled, self.latent_shape(req)[1:]

    def latent_shape(self, req: TextRequest) -> tuple[int, int, int]:
        return (self.latent_channels, req.height // self.vae_scale, req.width // self.vae_scale)

    # ------------------------------------------------------------------ step contract
    def start(self, item: Mapping[str, np.ndarray]) -> TextToImageState:
        """A request's state: token ids, schedule and initial latents (its own generator).

        The text encoder runs in the next ``step``, batched with every request admitted
        with this one."""
        from diffusers.utils.torch_utils import randn_tensor

        req = self.parse(item)
        texts = [req.negative_prompt, req.prompt] if req.guided else [req.prompt]
        ids = self.tokenizer(
            texts, padding="max_length", max_length=self.text_length, truncation=True, return_tensors="pt"
        ).input_ids
        generator = torch.Generator(device="cpu").manual_seed(req.seed)
        shape = (1, *self.latent_shape(req))
        latents = randn_tensor(shape, generator=generator, device=self._device, dtype=torch.float32)
        latents = latents * self.scheduler.init_noise_sigma
        return TextToImageState(req, self.scheduler.schedule(req.steps), ids, latents, generator)

    def step(self, states: Sequence[TextToImageState]) -> None:
        """Encode the new, one UNet call per latent size for all, decode the finished."""
        if not states:
            return
        for s in states:
            if s.index >= s.steps:
                raise EngineError("step() called on a finished state")
        began = monotonic()
        with torch.inference_mode():
            embeds = self._encode([s for s in states if s.embeds is None])
            new: dict[int, torch.Tensor] = {}
            for group in _by_size(states):
                for s, latents in zip(group, self._denoise(group, embeds), strict=True):
                    new[id(s)] = latents
            done = [s for s in states if s.index + 1 >= s.steps]
            images: dict[int, np.ndarray] = {}
            for group in _by_size(done):
                for s, image in zip(group, self._decode([new[id(s)] for s in group]), strict=True):
                    images[id(s)] = image
        for s in states:  # the whole call succeeded: now the states move
            if s.embeds is None:
                s.embeds = embeds[id(s)]
            s.latents = new[id(s)]
            s.index += 1
            if id(s) in images:
                s.image = images[id(s)]
        if self.step_observer is not None:
            self.step_observer(len(states), monotonic() - began)

    def _encode(self, states: Sequence[TextToImageState]) -> dict[int, torch.Tensor]:
        """One text-encoder call for every state's prompts: id(state) -> [1 or 2, L, D]."""
        if not states:
            return {}
        ids = torch.cat([s.token_ids for s in states]).to(self._device)
        hidden = self.text_encoder(ids)[0]
        out: dict[int, torch.Tensor] = {}
        row = 0
        for s in states:
            n = len(s.token_ids)
            out[id(s)] = hidden[row : row + n]
            row += n
        return out

    def _denoise(
        self, group: Sequence[TextToImageState], new_embeds: dict[int, torch.Tensor]
    ) -> list[torch.Tensor]:
        """One UNet call for states of one latent size; each one's next latents [1, C, h, w]."""
        rows, conds, times = [], [], []
        for s in group:
            embeds = s.embeds if s.embeds is not None else new_embeds[id(s)]
            n = len(embeds)  # 2: [unconditional, conditional], as diffusers orders them
            rows += [s.latents] * n
            conds.append(embeds)
            times += [s.schedule.timesteps[s.index]] * n
        x = torch.cat(rows).to(self._dtype)
        t_vec = torch.tensor(times, dtype=torch.long, device=self._device)
        pred = self.unet(x, t_vec, encoder_hidden_states=torch.cat(conds)).sample.float()
        eps, row = [], 0
        for s in group:
            if s.request.guided:
                uncond, cond = pred[row : row + 1], pred[row + 1 : row + 2]
                eps.append(uncond + s.request.guidance_scale * (cond - uncond))
                row += 2
            else:
                eps.append(pred[row : row + 1])
                row += 1
        t = [s.schedule.timesteps[s.index] for s in group]
        prev = [s.schedule.prev_timesteps[s.index] for s in group]
        latents = torch.cat([s.latents for s in group])
        gens = [s.generator for s in group] if self.scheduler.stochastic else None
        out = self.scheduler.step(torch.cat(eps), t, prev, latents, gens)
        return [out[i : i + 1] for i in range(len(group))]

    def _decode(self, latents: Sequence[torch.Tensor]) -> list[np.ndarray]:
        """One VAE call for finished latents of one size: UINT8 [H, W, 3] each."""
        z = torch.cat(list(latents)) / self.vae.config.scaling_factor
        image = self.vae.decode(z.to(self._dtype)).sample.float()
        image = (image / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
        pixels = (image * 255).round().astype(np.uint8)
        return list(pixels)

    def finished(self, state: TextToImageState) -> bool:
        return state.index >= state.steps

    def result(self, state: TextToImageState) -> dict[str, np.ndarray]:
        if state.image is None:
            raise EngineError(f"result() asked after {state.index} of {state.steps} steps")
        return {"image": state.image}

    # ------------------------------------------------------------------ request contract
    def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run every item to completion together (one size: the batch key sees to it)."""
        n = len(batch["prompt"])
        states = [self.start({name: value[i] for name, value in batch.items()}) for i in range(n)]
        active = list(states)
        while active:
            self.step(active)
            active = [s for s in active if not self.finished(s)]
        return {"image": np.stack([self.result(s)["image"] for s in states])}

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """One one-step request per batch slot: text encoder, UNet and VAE at each size."""
        item = {"prompt": np.array([b"warm-up"], dtype=object), "steps": np.ones(1, np.int32)}
        observer, self.step_observer = self.step_observer, None  # warm-up is not traffic
        try:
            for n in batch_sizes:
                self.step([self.start(item) for _ in range(n)])
        finally:
            self.step_observer = observer

    def close(self) -> None:
        self.unet = self.vae = self.text_encoder = None
        if self._device.type == "cuda":
            torch.cuda.empty_cache()


def _by_size(states: Sequence[TextToImageState]) -> list[list[TextToImageState]]:
    """States grouped by latent size, in first-seen order."""
    groups: dict[tuple[int, ...], list[TextToImageState]] = {}
    for s in states:
        groups.setdefault(tuple(s.latents.shape), []).append(s)
    return list(groups.values())
