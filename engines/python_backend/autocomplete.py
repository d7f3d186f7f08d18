"""The config object Triton hands ``TritonPythonModel.auto_complete_config``.

It wraps the model's config as a dict (protobuf field names, Triton's JSON); the model adds
inputs, outputs, a max batch size, dynamic batching or a transaction policy, and the
repository planner reads the dict back into the real config message.
"""

from __future__ import annotations

import copy
from typing import Any

from wattserve.engines.python_backend.pb_utils import TritonModelException


class ModelConfig:
    """Triton's ``pb_utils.ModelConfig``: what ``auto_complete_config`` may change."""

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._config = copy.deepcopy(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if not isinstance(max_batch_size, int) or max_batch_size < 0:
            raise TritonModelException(f"set_max_batch_size: {max_batch_size!r} is not an int >= 0")
        current = int(self._config.get("max_batch_size", 0) or 0)
        if current and current != max_batch_size:
            raise TritonModelException(
                f"set_max_batch_size: the config already sets max_batch_size {current}; auto-complete "
                f"cannot change it to {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Triton's rule: a config that already has another scheduler keeps it (one scheduler
        per model: ``sequence_batching`` is never silently replaced)."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if self._config.get(other):
                raise TritonModelException(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                    f"function for model '{self._config.get('name', '')}' tries to set scheduling_choice "
                    "as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            policy["decoupled"] = bool(transaction_policy_dict["decoupled"])

    def add_input(self, input: dict[str, Any]) -> None:  # Triton's name
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def add_parameter(self, key: str, value: str) -> None:
        self._config.setdefault("parameters", {})[key] = {"string_value": str(value)}

    def _add(self, what: str, tensor: dict[str, Any]) -> None:
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise TritonModelException(f"add_{what}: {tensor!r} has no {key!r}")
        tensors = self._config.setdefault(what, [])
        for existing in tensors:
            if existing.get("name") != tensor["name"]:
                continue
            if existing.get("data_type") != tensor["data_type"] or (
                [int(d) for d in existing.get("dims", [])] != [int(d) for d in tensor["dims"]]
            ):
                raise TritonModelException(f"add_{what}: {tensor['name']!r} is already in the config "
                                           f"with other properties ({existing!r})")  # fmt: skip
            return  # the config already has it (Triton: the config wins)
        tensors.append({k: v for k, v in tensor.items() if k in ("name", "data_type", "dims", "optional")})
