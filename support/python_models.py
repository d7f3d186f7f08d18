"""Triton Python backend models (``model.py`` + ``config.pbtxt``) for tests and benchmarks.

Written after the shapes of Triton's python_backend examples (add_sub, identity, a string
model, the decoupled "repeat"), plus models that make batching, BLS and failures visible.
``write_python_model(repo, name)`` writes one into a repository folder.
"""

from __future__ import annotations

from pathlib import Path

ADD_SUB_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
        {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""

ADD_SUB = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        self.args = args
        out0 = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        out1 = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(out0["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(out1["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out_0 = pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.output0_dtype))
            out_1 = pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(self.output1_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_0, out_1]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_sub: finalize")
"""

# Identity that also says how many requests its execute call got (BATCH) and how many kinds
# of request id ("ext-..." from clients, "bls-..." from a BLS model) shared the call (KINDS).
IDENTITY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "KINDS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
"""

IDENTITY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        kinds = len({r.request_id().partition("-")[0] for r in requests})
        time.sleep(0.005)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            rows = len(x)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("BATCH", np.full((rows, 1), len(requests), np.int32)),
                pb_utils.Tensor("KINDS", np.full((rows, 1), kinds, np.int32)),
            ]))
        return responses
"""

STRING_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] }},
         {{ name: "LENGTH" data_type: TYPE_INT32 dims: [ -1 ] }} ]
"""

STRING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            words = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            upper = np.array([w.decode().upper().encode() for w in words.flat], dtype=object)
            lengths = np.array([len(w) for w in words.flat], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", upper.reshape(words.shape)),
                pb_utils.Tensor("LENGTH", lengths.reshape(words.shape)),
            ]))
        return responses
"""

# Decoupled: one response per element of IN (OUT = the element, IDX = its index), sent from
# a thread the model starts (as Triton's repeat example does), then the final flag alone.
REPEAT_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }} ]
"""

REPEAT = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.respond, args=(sender, values))
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, sender, values):
        for i, value in enumerate(values):
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([i], np.uint32)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""

# BLS: calls "{callee}" (the identity above) with its input and returns what the callee said.
BLS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "KINDS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 4 kind: KIND_CPU }} ]
"""

BLS = """
import triton_python_backend_utils as pb_utils

CALLEE = "{callee}"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name=CALLEE,
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")],
                requested_output_names=["OUTPUT0", "BATCH", "KINDS"],
                request_id="bls-" + request.request_id(),
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(answer.output_tensors()))
        return responses
"""

# Fails on purpose: a negative input raises in execute (the whole batch fails), a zero is
# answered with an INVALID_ARG TritonError in its response (that request alone fails).
FAILING_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""

FAILING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                raise pb_utils.TritonModelException("negative input, cannot go on")
            if (x == 0).any():
                error = pb_utils.TritonError("zero is not a valid input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
"""

BROKEN_INIT = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException("weights file missing: /nowhere/weights.bin")

    def execute(self, requests):
        return []
"""

# auto_complete_config fills the whole config (no input/output in config.pbtxt).
AUTOCOMPLETE_CONFIG = """
name: "{name}"
backend: "python"
"""

AUTOCOMPLETE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_INT64", "dims": [2]})
        auto_complete_model_config.add_output({"name": "Y", "data_type": "TYPE_INT64", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 10)]) for r in requests]
"""

# Spends ``{busy_ms}`` ms of pure-Python CPU per execute call (holds the GIL): for the isolation
# benchmark.
BUSY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
dynamic_batching {{ }}
"""

BUSY = """
import time
import triton_python_backend_utils as pb_utils

BUSY_S = {busy_ms} / 1000.0


class TritonPythonModel:
    def execute(self, requests):
        end = time.perf_counter() + BUSY_S
        n = 0
        while time.perf_counter() < end:  # pure Python: holds the GIL but for the switch interval
            n += 1
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""

# The same occupancy without holding the GIL (time.sleep): the isolation benchmark's control.
SLEEPY = BUSY.replace(
    """        n = 0
        while time.perf_counter() < end:  # pure Python: holds the GIL but for the switch interval
            n += 1
""",
    """        time.sleep(max(0.0, end - time.perf_counter()))  # releases the GIL
""",
)

# Triton's custom metrics API (python_backend README "Custom Metrics"): a counter, a gauge and
# a histogram, labelled with the model's name and version, updated once per request.
METRICS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
"""

METRICS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        family = pb_utils.MetricFamily
        requests = family("pbm_requests", "Requests this model executed", family.COUNTER)
        last = family("pbm_last_input_sum", "Sum of the last request's input", family.GAUGE)
        sums = family("pbm_input_sum", "Sums of requests' inputs", family.HISTOGRAM)
        self.families = (requests, last, sums)
        self.requests = requests.Metric(labels=labels)
        self.last = last.Metric(labels=labels)
        self.sums = sums.Metric(labels=labels, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            total = float(x.sum())
            self.requests.increment(1)
            self.last.set(total)
            self.sums.observe(total)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

# Triton's request cancellation (README "Request Cancellation Handling", qa/python_models/
# execute_cancel): WAIT 0 answers at once; otherwise the model loops until its request (or,
# decoupled, its response sender) says it is cancelled, counting what it saw in metrics:
# pbm_looping (a gauge: requests in the loop now) and pbm_cancel_seen (a counter, by what
# reported it). A loop that is never cancelled gives up after 60 s and answers -1.
CANCEL_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "WAIT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{policy}
"""

CANCEL = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

GIVE_UP_S = 60.0


def out(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        import json

        config = json.loads(args["model_config"])
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
        family = pb_utils.MetricFamily
        self.looping_family = family("pbm_looping", "Requests looping until cancelled", family.GAUGE)
        self.looping = self.looping_family.Metric(labels={"model": args["model_name"]})
        self.seen_family = family("pbm_cancel_seen", "Cancellations a model saw", family.COUNTER)
        self.seen = {how: self.seen_family.Metric(labels={"how": how}) for how in ("request", "sender")}

    def _loop(self, cancelled):
        self.looping.increment(1)
        try:
            end = time.monotonic() + GIVE_UP_S
            while time.monotonic() < end:
                if cancelled():
                    return True
                time.sleep(0.005)
            return False
        finally:
            self.looping.increment(-1)

    def _answer(self, request, was_cancelled, how):
        if was_cancelled:
            self.seen[how].increment(1)
            error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            return pb_utils.InferenceResponse(error=error)
        return out(-1)

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                threading.Thread(target=self._stream, args=(request,), daemon=True).start()
            return None
        responses = []
        for request in requests:
            wait = int(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()[0])
            if wait == 0:
                responses.append(out(0))
                continue
            responses.append(self._answer(request, self._loop(request.is_cancelled), "request"))
        return responses

    def _stream(self, request):
        sender = request.get_response_sender()
        wait = int(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()[0])
        if wait == 0:
            sender.send(out(0), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        sender.send(out(1))
        response = self._answer(request, self._loop(sender.is_cancelled), "sender")
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Misbehaves on purpose, for process isolation: an input of -1 makes execute call os._exit,
# -2 makes the process kill itself with SIGSEGV, -3 makes execute hang (it first creates the
# file "hanging" in the model's folder, so a test knows it is stuck). Otherwise OUTPUT0 is
# twice the input, and PID the process that computed it.
UNSTABLE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }},
         {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
{parameters}
"""

UNSTABLE = """
import os
import signal
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        if any((x == -1).any() for x in xs):
            os._exit(3)
        if any((x == -2).any() for x in xs):
            os.kill(os.getpid(), signal.SIGSEGV)
        if any((x == -3).any() for x in xs):
            open(os.path.join(self.folder, "hanging"), "w").close()
            threading.Event().wait()  # only the execute timeout ends this
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUTPUT0", x * 2),
            pb_utils.Tensor("PID", np.full((len(x), 1), os.getpid(), np.int64)),
        ]) for x in xs]
"""

# Decoupled: a request with IN >= 0 gets one response (OUT = IN) from a thread the model
# starts, which then waits; a request with IN < 0 releases every waiting thread, and the
# first to wake ends the process (streams left open by a worker that dies).
DIES_STREAMING_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

DIES_STREAMING = """
import os
import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.go = threading.Event()

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            if value[0] < 0:
                self.go.set()
                continue
            sender = request.get_response_sender()
            threading.Thread(target=self.respond, args=(sender, value)).start()
        return None

    def respond(self, sender, value):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        self.go.wait()
        os._exit(4)
"""


MODELS: dict[str, tuple[str, str]] = {
    "add_sub": (ADD_SUB_CONFIG, ADD_SUB),
    "identity": (IDENTITY_CONFIG, IDENTITY),
    "string": (STRING_CONFIG, STRING),
    "repeat": (REPEAT_CONFIG, REPEAT),
    "bls": (BLS_CONFIG, BLS),
    "failing": (FAILING_CONFIG, FAILING),
    "broken_init": (ADD_SUB_CONFIG, BROKEN_INIT),
    "autocomplete": (AUTOCOMPLETE_CONFIG, AUTOCOMPLETE),
    "busy": (BUSY_CONFIG, BUSY),
    "sleepy": (BUSY_CONFIG, SLEEPY),
    "custom_metrics": (METRICS_CONFIG, METRICS),
    "cancel": (CANCEL_CONFIG, CANCEL),
    "unstable": (UNSTABLE_CONFIG, UNSTABLE),
    "dies_streaming": (DIES_STREAMING_CONFIG, DIES_STREAMING),
}


def write_python_model(repo: Path, kind: str, name: str | None = None, **values: object) -> Path:
    """``<repo>/<name>/config.pbtxt`` and ``<repo>/<name>/1/model.py`` of model ``kind``;
    ``values`` fill its placeholders (``callee`` for bls, ``busy_ms`` for busy)."""
    name = name or kind
    config, source = MODELS[kind]
    folder = Path(repo) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config.format(name=name, **values))
    filled = source
    for key, value in values.items():
        filled = filled.replace("{" + key + "}", str(value))
    (folder / "1" / "model.py").write_text(filled)
    return folder
