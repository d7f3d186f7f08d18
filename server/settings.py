"""Server settings: one field per knob, read by pydantic-settings.

Each field is a ``WATTSERVE_<NAME>`` environment variable and a ``wattserve serve --<name>``
flag (server/cli.py attaches pydantic-settings' CLI source to the ``serve`` subcommand).
Every knob has one meaning; ``wattserve settings`` prints docs/settings.md's table from these
fields' descriptions. The fields marked ``PER_MODEL`` may also be set per model by a
repository model's config.pbtxt ``parameters`` (``MODEL_PARAMETERS``).

Settings are the process's; no layer below server/ sees them. Each model's configuration is
built once from them (and its config.pbtxt) as a ``server.models.serving_config.ServingConfig``,
whose parts (the engine's ``EngineConfig``, the batcher's ``BatchingSpec``) are what the
engines and batchers receive; telemetry receives ``telemetry_config()``.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.registry import BatcherName, batcher_help
from wattserve.engines.catalog import BUILTIN_MODELS, EngineName
from wattserve.engines.config import EngineConfig
from wattserve.server.models.response_cache import parse_cache_config
from wattserve.telemetry.service import TelemetryConfig

# json_schema_extra of the fields a repository model's ``parameters`` may set for itself
PER_MODEL: dict[str, Any] = {"per_model": True}
if TYPE_CHECKING:
    from _typeshed import DataclassInstance
Part = TypeVar("Part", bound="DataclassInstance")  # a lower layer's config dataclass


def _int_list(value: object) -> object:
    """Accept "1,2,4" or "[1, 2, 4]" or a list from the environment."""
    if isinstance(value, str):
        text = value.strip().strip("[]")
        return [int(p) for p in text.replace(" ", "").split(",") if p]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="WATTSERVE_",
        extra="ignore",
        # How the fields look as `wattserve serve` flags; read only by a CLI source that the
        # caller passes in (cli_parse_args stays unset, so Settings() never reads sys.argv).
        cli_kebab_case=True,  # max_batch_size -> --max-batch-size
        cli_implicit_flags=True,  # bool fields: --strict / --no-strict
        cli_hide_none_type=True,  # optional fields show their type, not "{float,null}"
        cli_show_env_vars=True,  # --help names each flag's WATTSERVE_* variable
    )

    # --- network ---
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on.")
    grpc_port: int = Field(
        8001, ge=0, le=65535, description="KServe v2 gRPC port (Triton's default 8001); 0 = no gRPC."
    )
    grpc_host: str | None = Field(None, description="Address gRPC listens on; unset: the HTTP `host`.")
    log_level: str = Field("info", description="uvicorn/wattserve log level.")
    frontend_workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Front-end processes sharing the HTTP and gRPC ports (SO_REUSEPORT) over one "
        "engine core process that holds every model's queue, batcher and engines; 1 = one process "
        "serving everything (docs/architecture.md, 'Front ends across processes').",
    )
    frontend_slab_mib: int = Field(
        64,
        ge=1,
        le=65536,
        description="Shared memory per front end for request and answer tensors crossing to the "
        "engine core (MiB); a tensor that does not fit travels in the channel's frame instead.",
    )

    # --- model ---
    model: str = Field(
        "mobilenet_v2",
        description=f"Served model; also its KServe model name. One of {', '.join(BUILTIN_MODELS)}, "
        "or a local Hugging Face causal-LM folder (config.json, *.safetensors, tokenizer files), "
        "served under the folder's name.",
    )
    model_name: str | None = Field(
        None, description="The served name of a --model folder (default: the folder's name)."
    )
    model_repository: Path | None = Field(
        None,
        description="Triton-layout model repository (<dir>/<model>/config.pbtxt + <version>/); "
        "set: every model in it is served and `model` is unused.",
    )
    model_control_mode: Literal["none", "explicit", "poll"] = Field(
        "none",
        description="Triton's --model-control-mode. none (Triton's default): every model loads at "
        "start and load/unload requests are refused; explicit: only --load-model models load at "
        "start (none without it; '*' = all) and clients load/unload; poll: every model loads at "
        "start and the repository is rescanned every repository_poll_secs.",
    )
    load_model: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="explicit mode: a model to load at start (repeat the flag, or a,b in the "
        "variable); '*' alone: every model (Triton's --load-model).",
    )
    repository_poll_secs: float = Field(
        15.0,
        gt=0,
        description="poll mode: seconds between rescans of the model repository (Triton's default 15).",
    )
    disable_auto_complete_config: bool = Field(
        False,
        description="Do not complete a repository config from its model file (platform from the "
        "file name; a missing config.pbtxt, inputs, outputs and max_batch_size from model.onnx).",
    )
    strict: bool = Field(
        False,
        description="Exit at start-up if any repository model fails to load (Triton's "
        "--exit-on-error); without a repository the one model's failure is always fatal.",
    )
    allow_unsupported_config: bool = Field(
        False,
        description="Load a repository model whose config.pbtxt sets fields wattserve does not "
        "implement, without them (a warning names each); by default such a model fails to load "
        "naming the field and why.",
    )
    cache_config: str | None = Field(
        None,
        description="Triton's --cache-config: 'local,size=BYTES' makes one response cache of that "
        "many bytes, shared by the models whose config.pbtxt sets response_cache { enable: true } "
        "(a repeated request is answered without queue or engine; least recently used answers "
        "leave first). Unset: no cache, and models that enable it load without one. The flag may "
        "be repeated, one setting each (Triton's form); in the variable, repeats are joined by ';'.",
    )
    response_cache_byte_size: int | None = Field(
        None,
        gt=0,
        description="Triton's deprecated --response-cache-byte-size: the same as --cache-config "
        "local,size=BYTES (a warning says so); refused together with cache_config, as Triton refuses it.",
    )
    rate_limit: Literal["off", "execution_count"] = Field(
        "off",
        description="Triton's --rate-limit. execution_count: an instance runs a batch only when the "
        "resources its instance_group's rate_limiter names are free (taken before the batch, given "
        "back after; shared by every model's instances); priority weights which waiting instance "
        "goes first. off (Triton's default): rate_limiter configs are ignored.",
    )
    rate_limit_resource: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Triton's --rate-limit-resource <name>:<count>[:<device>] (repeat the flag, or "
        "a,b in the variable): how many units of a resource there are (per GPU device N, or on "
        "every device without one; a global resource's count without a device). Unset: the most "
        "that any instance asks.",
    )
    engine: EngineName = Field(
        "torch", description="Engine: torch, onnxruntime or tensorrt.", json_schema_extra=PER_MODEL
    )
    device: str = Field("auto", description="auto (CUDA if available, else CPU), cpu, cuda, cuda:N.")
    weights: str | None = Field(
        None,
        description="Path to a local state-dict/checkpoint, or 'pretrained' for torchvision's "
        "published weights (downloads; needs internet). Unset: random weights from `seed`.",
        json_schema_extra=PER_MODEL,
    )
    seed: int = Field(
        0, description="Seed for random weights, so two servers agree.", json_schema_extra=PER_MODEL
    )
    fp16: bool = Field(
        False, description="Half precision on CUDA (ignored on CPU).", json_schema_extra=PER_MODEL
    )
    channels_last: bool = Field(
        True, description="channels_last memory format for conv nets.", json_schema_extra=PER_MODEL
    )
    fuse_conv_bn: bool = Field(
        True,
        description="Fold each BatchNorm into the convolution before it when a torchvision model "
        "loads (inference only; outputs agree with the unfolded model to float rounding).",
    )
    flush_denormal: bool = Field(
        False,
        description="CPU engines (torch, TorchScript, ONNX Runtime): read and write subnormal floats "
        "as zero (FTZ/DAZ), which x86 CPUs compute on a slow path (microcode on Intel). Off: IEEE "
        "results, as Triton's backends compute them. No effect on CUDA/TensorRT kernels.",
        json_schema_extra=PER_MODEL,
    )
    identity_elements: int = Field(
        16, ge=1, description="Element count of the identity model.", json_schema_extra=PER_MODEL
    )
    identity_delay_ms: float = Field(
        0.0,
        ge=0,
        description="identity: compute time per batch (Triton's execute_delay_ms).",
        json_schema_extra=PER_MODEL,
    )
    identity_delay_per_item_ms: float = Field(
        0.0,
        ge=0,
        description="identity: compute time per request in a batch, added to identity_delay_ms "
        "(10 + 0.5/item gives a GPU-like cost curve).",
        json_schema_extra=PER_MODEL,
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads (CPU).", json_schema_extra=PER_MODEL
    )
    onnx_path: Path | None = Field(
        None,
        description="ONNX file for the onnxruntime/tensorrt engines (exported if unset).",
        json_schema_extra=PER_MODEL,
    )
    cache_dir: Path = Field(
        Path(".cache/wattserve"), description="Where exported ONNX files and TensorRT plans live."
    )
    trt_profiles: str = Field(
        "1:1:1,2:4:8,8:16:32",
        description="TensorRT optimization profiles, min:opt:max batch each, comma separated.",
        json_schema_extra=PER_MODEL,
    )
    cuda_graphs: bool = Field(
        False, description="Capture CUDA graphs per batch bucket (torch/CUDA).", json_schema_extra=PER_MODEL
    )
    engine_batch_sizes: Annotated[list[int] | None, NoDecode] = Field(
        None,
        description="Batch buckets the engine is built for (CUDA graphs); batches are padded up.",
        json_schema_extra=PER_MODEL,
    )
    diffusion_model: Path | None = Field(
        None,
        description="Local diffusers UNet2DModel folder (from_pretrained); unset: tiny UNet.",
        json_schema_extra=PER_MODEL,
    )
    diffusion_scheduler: Literal["ddim", "ddpm"] = Field(
        "ddim", description="Noise scheduler.", json_schema_extra=PER_MODEL
    )
    diffusion_default_steps: int = Field(
        20, ge=1, description="Steps when a request names none.", json_schema_extra=PER_MODEL
    )

    # --- language models (a Hugging Face folder; engines/lm_engine.py) ---
    lm_kv_blocks: int = Field(
        512,
        ge=1,
        description="KV cache blocks preallocated per engine instance.",
        json_schema_extra=PER_MODEL,
    )
    lm_block_size: int = Field(
        16, ge=1, le=1024, description="Tokens per KV cache block.", json_schema_extra=PER_MODEL
    )
    lm_token_budget: int = Field(
        512,
        ge=1,
        description="Tokens computed per step (prefill chunks + decodes); max_batch_size bounds the "
        "running sequences.",
        json_schema_extra=PER_MODEL,
    )
    lm_chunked_prefill: bool = Field(
        True, description="Split long prompts to fit the token budget.", json_schema_extra=PER_MODEL
    )
    lm_default_max_tokens: int = Field(
        16,
        ge=1,
        description="Tokens generated when a request names no max_tokens.",
        json_schema_extra=PER_MODEL,
    )
    lm_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32",
        description="Weights and KV cache dtype on CUDA (CPU: float32).",
        json_schema_extra=PER_MODEL,
    )

    # --- batching ---
    batcher: BatcherName = Field(
        "dynamic", description=batcher_help(), json_schema_extra=PER_MODEL
    )  # names from batchers/registry.py
    max_batch_size: int = Field(8, ge=1, le=1024, description="Largest batch formed (static: N).")
    max_queue_delay_ms: float = Field(
        5.0, ge=0, description="dynamic: longest the oldest request waits for a batch to fill."
    )
    preferred_batch_sizes: Annotated[list[int], NoDecode] = Field(
        default_factory=list,
        description="dynamic: sizes dispatched at once when they can be formed (e.g. 4,8).",
    )
    batch_sizes_only: bool = Field(
        False,
        description="dynamic: form only the engine's own batch sizes (its buckets/profiles).",
        json_schema_extra=PER_MODEL,
    )
    slo_ms: float = Field(
        100.0,
        gt=0,
        description="adaptive/aimd: the latency objective, request arrival to answer, in ms.",
        json_schema_extra=PER_MODEL,
    )
    slo_percentile: float = Field(
        99.0,
        gt=0,
        lt=100,
        description="adaptive/aimd: the objective holds for this percentile.",
        json_schema_extra=PER_MODEL,
    )
    slo_headroom_ms: float | None = Field(
        None,
        ge=0,
        description="adaptive: time outside the batcher (HTTP, network) kept out of the plan; "
        "unset: 10% of slo_ms.",
        json_schema_extra=PER_MODEL,
    )
    slo_reject: bool = Field(
        False,
        description="adaptive: answer 503 + Retry-After at once for requests that cannot meet "
        "slo_ms anyway (default: serve them late and count the miss).",
        json_schema_extra=PER_MODEL,
    )
    slo_late_last: bool = Field(
        True,
        description="adaptive: the fewest oldest queued requests whose going first would make "
        "others miss slo_ms run after the rest (as Triton's timeout_action DELAY), so a burst's "
        "backlog makes fewer requests late; false: first come, first served.",
        json_schema_extra=PER_MODEL,
    )
    adaptive_unit: Literal["auto", "joules", "seconds"] = Field(
        "auto",
        description="adaptive: the unit each batch minimizes per request. auto/joules: joules "
        "(idle included) once the energy meter measured 8 batches, engine-seconds before; "
        "seconds: engine-seconds always (the thesis study's baseline).",
        json_schema_extra=PER_MODEL,
    )
    max_queue_size: int = Field(
        256, ge=1, description="Queued requests at most; beyond it 503 + Retry-After."
    )
    default_timeout_ms: float | None = Field(
        None, gt=0, description="Deadline for requests that set none (504 when passed)."
    )
    priority_levels: int = Field(1, ge=1, description="Priority levels; 1 is highest.")
    default_priority_level: int = Field(0, ge=0, description="Level of priority-0 requests (0: lowest).")
    instances: int = Field(1, ge=1, description="Engine instances (worker threads), like instance groups.")
    allow_timeout_override: bool = Field(
        True,
        description="Requests may set their own timeout (Triton's queue policy field); false: the "
        "default timeout applies to every request.",
    )
    timeout_action: Literal["reject", "delay"] = Field(
        "reject",
        description="What a request's expired timeout does while it is queued (Triton's queue "
        "policy timeout_action): reject answers it now, never computed; delay moves it behind "
        "every request of its priority level that has not timed out, and it runs then.",
    )
    python_model_isolation: Literal["process", "thread"] = Field(
        "process",
        description="Where a Python-backend model (model.py) runs. process: each instance in "
        "its own worker process, as Triton's stub (tensors cross in shared memory; a crash or "
        "an execute past python_execute_timeout_s fails only that batch's requests and the "
        "process is restarted); thread: on its instance's engine thread in the server process "
        "(no copies, but a pure-Python model holds the GIL every other model needs).",
        json_schema_extra=PER_MODEL,
    )
    python_execute_timeout_s: float | None = Field(
        None,
        gt=0,
        description="process isolation: an execute call still running after this many seconds "
        "fails its requests (INTERNAL) and the instance's process is killed and restarted. "
        "Unset: no bound (Triton waits on a live stub as long as execute takes).",
        json_schema_extra=PER_MODEL,
    )
    python_stub_timeout_s: float = Field(
        30.0,
        gt=0,
        description="process isolation: longest wait for a Python model's worker process to "
        "start (Triton's python backend setting stub-timeout-seconds), and for its finalize "
        "at unload.",
    )
    check_values: bool = Field(
        False,
        description="Reject (400) NaN/Inf in float inputs. Off by default, like Triton; a model's "
        "config can turn it on with parameters key check_values.",
        json_schema_extra=PER_MODEL,
    )

    # --- limits and lifecycle ---
    max_body_bytes: int = Field(64 * 1024 * 1024, description="Largest request body (413 beyond).")
    max_inflight_body_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1,
        description="Request-body bytes being read or parsed at once, all requests together; "
        "beyond it new requests get 503 + Retry-After before their body is read.",
    )
    max_queue_wait_s: float = Field(
        3.0,
        ge=0,
        description="Refuse (503 + Retry-After) a request when the queue already holds more "
        "than this many seconds of work at the rate it measurably drains; a queued request that "
        "has waited this long anyway is answered the same way, not computed; "
        "0 = count bound only. A repository model gets 0 (Triton's queue semantics: only its "
        "queue policy's timeouts bound a wait) unless this is set, for the process or in its "
        "parameters.",
        json_schema_extra=PER_MODEL,
    )
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="Largest request header (431 beyond).")
    header_timeout_s: float = Field(
        5.0, gt=0, description="A connection must send a complete request header within this (else closed)."
    )
    keep_alive_s: int = Field(
        75,
        ge=1,
        description="Idle keep-alive connections close after this (longer than clients' pools keep "
        "them, e.g. aiohttp's 15 s, so a client never reuses one the server is closing).",
    )
    max_connections: int = Field(
        4096, ge=1, description="Open connections at most (also capped by the open-file limit); 503 beyond."
    )
    max_image_pixels: int = Field(
        25_000_000, ge=1, description="Largest decoded image (width x height) the image route accepts."
    )
    idle_trim_s: float = Field(
        5.0,
        ge=0,
        description="With tune_malloc, give freed memory back to the OS after this long without "
        "a batch (0 = never).",
    )

    # --- security ---
    api_token: str | None = Field(
        None,
        description="If set, inference routes need 'Authorization: Bearer <token>' (401 otherwise).",
    )
    restricted_api: str | None = Field(
        None,
        description="Triton's --http-restricted-api: 'API[,API...]:HEADER=VALUE', several separated "
        "by ';'. APIs: health, metadata, inference, model-config, model-repository, statistics, "
        "shared-memory, trace, logging. Requests to a restricted API need that header (403 otherwise).",
    )
    allow_client_shm: bool = Field(
        False,
        description="Triton's --allow-client-shm: let clients register shared-memory regions "
        "(system: any /dev/shm object this server's user may open). Off: register and "
        "unregister answer Triton's 'Client shared memory is disabled'; status answers.",
    )
    retry_after_s: int = Field(1, ge=0, description="Retry-After value sent with 503s.")
    drain_timeout_s: float = Field(30.0, ge=0, description="On SIGTERM, longest wait for accepted work.")
    drain_grace_s: float = Field(
        0.0,
        ge=0,
        description="On SIGTERM, report not ready at once but keep accepting requests this long "
        "before draining, so a load balancer's health check stops sending first (e.g. 2-3 checks).",
    )
    warmup: bool = Field(
        True, description="Run every batch size once before reporting ready.", json_schema_extra=PER_MODEL
    )
    gil_switch_interval_ms: float = Field(
        0.5,
        gt=0,
        description="sys.setswitchinterval: how soon an engine thread gets the GIL from a busy "
        "event loop (Python's 5 ms default adds up to 5 ms per batch hand-off).",
    )
    tune_malloc: bool = Field(
        True, description="Raise glibc's mmap/trim thresholds so big batches do not page-fault."
    )

    # --- telemetry ---
    telemetry: bool = Field(True, description="Sample GPU (NVML) and CPU (RAPL) energy when present.")
    telemetry_interval_ms: float = Field(100.0, gt=0, description="Sampling interval.")
    gpus: Annotated[list[int] | None, NoDecode] = Field(None, description="GPU indices to sample.")
    rapl_root: Path = Field(Path("/sys/class/powercap"), description="Linux powercap tree.")
    simulated_gpu: str | None = Field(
        None,
        description="Simulate a GPU instead of reading NVML: 'default', 'superlinear' or a .toml/.json "
        "power model (docs/telemetry.md). Every engine is metered on it; every figure says "
        "source=simulated.",
    )

    @field_validator("cache_config")
    @classmethod
    def _check_cache_config(cls, value: str | None) -> str | None:
        if value is not None:
            parse_cache_config(value)  # a bad value fails at start, naming what is wrong
        return value

    @field_validator("simulated_gpu")
    @classmethod
    def _check_power_model(cls, value: str | None) -> str | None:
        """A bad power model fails at start, naming what is wrong."""
        if value:
            from wattserve.telemetry.simulated_gpu import load_power_model

            load_power_model(value)
        return value or None

    _split_lists = field_validator("preferred_batch_sizes", "engine_batch_sizes", "gpus", mode="before")(
        _int_list
    )

    @field_validator("rate_limit_resource")
    @classmethod
    def _check_resources(cls, value: list[str]) -> list[str]:
        from wattserve.batchers.rate_limiter import parse_resource_flag

        for text in value:
            parse_resource_flag(text)  # a bad value fails at start, naming it
        return value

    @field_validator("load_model", "rate_limit_resource", mode="before")
    @classmethod
    def _split_names(cls, value: object) -> object:
        """ "a,b" from the environment; a list (repeated flags) as is."""
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value

    @model_validator(mode="after")
    def _check_model_control(self) -> Settings:
        if self.load_model and self.model_control_mode != "explicit":
            raise ValueError(
                "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
            )
        if "*" in self.load_model and len(self.load_model) > 1:
            raise ValueError("--load-model=* must be the only --load-model argument")
        return self

    @model_validator(mode="after")
    def _check_cache_flags(self) -> Settings:
        if self.response_cache_byte_size is not None and self.cache_config is not None:  # Triton's words
            raise ValueError("Incompatible flags --response-cache-byte-size and --cache-config both "
                             "provided. Please provide one or the other.")  # fmt: skip
        return self

    @property
    def cache_bytes(self) -> int | None:
        """The response cache's size from either flag, or None: no cache."""
        if self.response_cache_byte_size is not None:
            return self.response_cache_byte_size
        return parse_cache_config(self.cache_config) if self.cache_config else None

    @model_validator(mode="after")
    def _check_batching(self) -> Settings:
        too_big = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
        if too_big:
            raise ValueError(f"preferred_batch_sizes {too_big} outside 1..max_batch_size")
        if self.default_priority_level > self.priority_levels:
            raise ValueError("default_priority_level must be <= priority_levels")
        return self

    @property
    def lm_model(self) -> Path | None:
        """``model`` when it names a Hugging Face model folder (its config.json), else None."""
        path = Path(self.model).expanduser()
        return path if (path / "config.json").is_file() else None

    @property
    def served_model(self) -> str:
        """The name ``model`` is served under: ``model_name``, a folder's name, or ``model``."""
        if self.model_name:
            return self.model_name
        lm = self.lm_model
        return lm.resolve().name if lm is not None else self.model

    @property
    def effective_default_priority(self) -> int:
        """Triton: level 0 means 'the default level', which defaults to the lowest."""
        return self.default_priority_level or self.priority_levels

    # ------------------------------------------------------------------ the typed parts
    def part(self, cls: type[Part]) -> Part:
        """The dataclass ``cls`` (a lower layer's configuration) filled from the fields of the
        same names, lists as tuples: each layer gets its own part, never these settings."""
        values = {f.name: getattr(self, f.name) for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def engine_config(self) -> EngineConfig:
        return self.part(EngineConfig)

    def batching_spec(self) -> BatchingSpec:
        return self.part(BatchingSpec)

    def telemetry_config(self) -> TelemetryConfig:
        return self.part(TelemetryConfig)


# Settings a repository model's parameters may set for that model alone (string values, as
# in the environment): the fields marked PER_MODEL above.
MODEL_PARAMETERS = frozenset(
    name for name, field in Settings.model_fields.items() if field.json_schema_extra == PER_MODEL
)
