"""The churn model on two battle-tested servers: NVIDIA Triton (the ``tritonserver`` binary) and Seldon's MLServer.

Both run from their own virtual environment, ``.venv-serving`` (``make serving-extras`` builds it from
``config/requirements-serving.txt``): their pins conflict with the course's lock (``nvidia-pytriton``
needs numpy < 2, ``mlserver`` pins fastapi 0.115). Each is started the course's one way: under the
process guard (``course_lib.core.guard``, ``--group``) in a process group of its own, so it and its
workers stop with the process that started it; bound to 127.0.0.1 only; ready once
``GET /v2/health/ready`` answers 200. Both speak the KServe V2 inference protocol over HTTP.

* :func:`write_triton_repository` writes a standard Triton model repository: the ONNX graph of the
  course and a Python-backend ``model.py`` that runs it in ONNX Runtime (one thread) on the batch
  Triton's dynamic batcher hands it; ``config.pbtxt`` is :func:`~course_lib.offline.triton_repository.onnx_config`'s
  (the 19 inputs, ``max_batch_size``, ``dynamic_batching { max_queue_delay_microseconds,
  preferred_batch_size }``) with ``backend: "python"`` instead of the ONNX Runtime platform, which the
  PyPI binary does not carry. :func:`start_triton` runs the ``tritonserver`` binary that the
  ``nvidia-pytriton`` wheel ships, directly, not PyTriton's bind API: the bind API puts a ZeroMQ hop to
  the calling Python process between Triton's batcher and the model, while the binary serves the same
  repository layout (and the same ``config.pbtxt``) a full Triton install serves.
* :func:`write_mlserver_settings` writes ``settings.json`` (127.0.0.1, the HTTP, gRPC and metrics
  ports, inference in the server's process) and a model folder for MLServer's XGBoost runtime: the
  course's booster as ``model.json`` with adaptive batching (``max_batch_size``, ``max_batch_time``).
  It takes the 40 encoded columns (``pipeline[:-1].transform``) as one FP32 tensor ``features``.

References
----------
Triton Inference Server documentation: "Model Repository", "Model Configuration" (dynamic batcher),
the Python backend README (``TritonPythonModel.execute`` receives a list of requests), the HTTP/REST
protocol (``/v2/health/ready``, ``/v2/models/<m>/stats``). MLServer documentation: "MLServer Settings",
"Model Settings" (``max_batch_size``, ``max_batch_time``), "Adaptive Batching", the XGBoost runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import onnx
from google.protobuf import text_format

from course_lib.core.checks import integer, number, positive_number
from course_lib.core.files import atomic_write_bytes, atomic_write_text, course_workspace
from course_lib.core.guard import guard_command
from course_lib.core.process import LOOPBACK_HOST, ChildProcess, free_port, start_child
from course_lib.core.waiting import wait_until
from course_lib.offline.triton_repository import onnx_config

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

__all__ = [
    "SERVING_VENV",
    "InferenceServer",
    "serving_unavailable_reason",
    "start_mlserver",
    "start_triton",
    "write_mlserver_settings",
    "write_triton_repository",
]

#: The servers' virtual environment (ignored by git), made by ``make serving-extras``.
SERVING_VENV = course_workspace() / ".venv-serving"
_INSTALL = "run `make serving-extras` (it builds .venv-serving from config/requirements-serving.txt)"

#: The Python-backend model: the course's ONNX graph in ONNX Runtime, one run per batch Triton hands it.
_TRITON_MODEL_PY = """\
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            os.path.join(folder, "model.onnx"), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self.strings = {i.name for i in self.session.get_inputs() if i.type == "tensor(string)"}
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o["name"] for o in config["output"]]

    def _column(self, request, name):
        values = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
        return np.char.decode(values.astype(np.bytes_), "utf-8") if name in self.strings else values

    def execute(self, requests):
        columns = [[self._column(r, name) for r in requests] for name in self.inputs]
        sizes = [len(c) for c in columns[0]]
        feeds = {name: np.concatenate(parts) for name, parts in zip(self.inputs, columns)}
        results = self.session.run(self.outputs, feeds)
        ends = np.cumsum(sizes)[:-1]
        pieces = [np.split(result, ends) for result in results]
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor(n, p[i]) for n, p in zip(self.outputs, pieces)]
            )
            for i in range(len(requests))
        ]
"""


def serving_unavailable_reason(venv: str | Path = SERVING_VENV) -> str | None:
    """Why Triton and MLServer cannot run from ``venv`` here, or None when both executables are there."""
    root = Path(venv)
    if not (root / "bin" / "python").exists():
        return f"{root} does not exist: {_INSTALL}"
    for program in (_triton_binary(root), root / "bin" / "mlserver"):
        if not program.exists():
            return f"{program} is missing: {_INSTALL}"
    return None


def _triton_binary(venv: Path) -> Path:
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return venv / "lib" / version / "site-packages" / "pytriton" / "tritonserver" / "bin" / "tritonserver"


def write_triton_repository(
    repository: str | Path,
    onnx_model: onnx.ModelProto,
    *,
    name: str = "churn",
    max_batch_size: int = 64,
    preferred_batch_sizes: Sequence[int] = (16, 32),
    max_queue_delay_us: int = 2000,
    instance_count: int = 1,
) -> Path:
    """Write ``<repository>/<name>/`` (``config.pbtxt``, ``1/model.py``, ``1/model.onnx``); its config path.

    The knobs are Lesson 3's, in Triton's names (``max_queue_delay_us`` is
    ``max_queue_delay_microseconds``); :func:`onnx_config` checks them (``ValueError`` out of range).
    The model answers ``probabilities`` (FP32, ``[2]`` per row: no churn, churn).
    """
    config = onnx_config(
        onnx_model,
        name=name,
        max_batch_size=max_batch_size,
        preferred_batch_sizes=preferred_batch_sizes,
        max_queue_delay_us=max_queue_delay_us,
        instance_count=instance_count,
    )
    config.ClearField("platform")
    config.backend = "python"
    del config.parameters["intra_op_thread_count"]  # model.py pins ONNX Runtime's threads itself
    keep = [out for out in config.output if out.name == "probabilities"]
    del config.output[:]
    config.output.extend(keep)
    folder = Path(repository) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / "1" / "model.onnx", onnx_model.SerializeToString())
    atomic_write_text(folder / "1" / "model.py", _TRITON_MODEL_PY)
    return atomic_write_text(folder / "config.pbtxt", text_format.MessageToString(config))


def write_mlserver_settings(
    folder: str | Path,
    pipeline: Pipeline,
    *,
    name: str = "churn",
    max_batch_size: int = 16,
    max_batch_time_s: float = 0.002,
) -> Path:
    """Write MLServer's model folder ``<folder>/<name>/`` for the XGBoost runtime; return ``folder``.

    ``max_batch_size`` (>= 1; 1 turns adaptive batching off) and ``max_batch_time_s`` (>= 0 seconds)
    are MLServer's adaptive-batching knobs. The server-wide ``settings.json`` is written by
    :func:`start_mlserver` (it holds the ports).
    """
    max_batch_size = integer("max_batch_size", max_batch_size, min=1)
    max_batch_time_s = number("max_batch_time_s", max_batch_time_s, min=0)
    model = Path(folder) / name
    model.mkdir(parents=True, exist_ok=True)
    pipeline[-1].save_model(str(model / "model.json"))
    settings = {
        "name": name,
        "implementation": "mlserver_xgboost.XGBoostModel",
        "max_batch_size": max_batch_size,
        "max_batch_time": max_batch_time_s,
        "parameters": {"uri": "./model.json"},
    }
    atomic_write_text(model / "model-settings.json", json.dumps(settings, indent=2))
    return Path(folder)


@dataclass
class InferenceServer:
    """A running V2-protocol server: its child (the guard), ``url`` (``http://127.0.0.1:PORT``), ``model``.

    A context manager: leaving the block stops it (:meth:`stop`).
    """

    child: ChildProcess
    url: str
    model: str
    name: str

    def infer_url(self) -> str:
        """``POST`` here to score: ``<url>/v2/models/<model>/infer``."""
        return f"{self.url}/v2/models/{self.model}/infer"

    def version(self) -> str:
        """The server's own name and version from ``GET /v2`` (e.g. ``"triton 2.51.0"``), for a record."""
        meta = httpx.get(f"{self.url}/v2", timeout=10.0).json()
        return f"{meta['name']} {meta['version']}"

    def stop(self) -> int:
        """Stop the server and its workers (the guard stops the whole group); the guard's exit code."""
        return self.child.stop(timeout_s=15.0)

    def __enter__(self) -> InferenceServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _ready(child: ChildProcess, url: str) -> bool:
    child.check_running()
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


def _start(argv: list[str], *, name: str, model: str, port: int, remove: Sequence[str], env: dict[str, str],
           cwd: str | None, timeout_s: float) -> InferenceServer:  # fmt: skip
    child = start_child(
        guard_command(argv, remove=remove, group=True, stop_timeout_s=10.0), name=name, env=env, cwd=cwd
    )
    url = f"http://{LOOPBACK_HOST}:{port}"
    try:
        wait_until(
            lambda: _ready(child, url), timeout_s=timeout_s, interval_s=0.1, what=f"{name} ready at {url}"
        )
    except BaseException:
        child.stop()
        raise
    return InferenceServer(child, url, model, name)


def _interpreter_paths(python: Path) -> tuple[str, str, str]:
    """The serving Python's LIBDIR (its own libpython), its site-packages and its ``X.Y`` version."""
    code = (
        "import sys, sysconfig; print(sysconfig.get_config_var('LIBDIR')); "
        "print(sysconfig.get_paths()['purelib']); print('%d.%d' % sys.version_info[:2])"
    )
    out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout
    libdir, purelib, version = out.split()
    return libdir, purelib, version


def start_triton(
    repository: str | Path, *, model: str = "churn", venv: str | Path = SERVING_VENV, timeout_s: float = 120.0
) -> InferenceServer:
    """Start ``tritonserver`` on ``repository`` (HTTP only, 127.0.0.1, a free port); return it when ready.

    The Python backend's stub is the one built for the serving Python's version; it embeds that
    Python, so ``LD_LIBRARY_PATH`` names the interpreter's own ``LIBDIR`` (else the stub may load
    another ``libpython`` and fail at model load: ``'_thread.RLock' object has no attribute
    '_recursion_count'``), and ``PATH`` starts with the environment's ``bin``: the stub runs Python in
    isolated mode (``PYTHONPATH`` ignored) and finds its ``sys.executable`` on ``PATH``, so it is the
    environment's ``python3`` whose ``pyvenv.cfg`` puts that environment's site-packages (numpy,
    ONNX Runtime) on ``sys.path``.

    Raises
    ------
    FileNotFoundError
        Without the serving environment (``make serving-extras``).
    RuntimeError, TimeoutError
        If the server exits or is not ready within ``timeout_s`` seconds (the message has its log).
    """
    timeout_s = positive_number("timeout_s", timeout_s, unit="s")
    root = Path(venv)
    reason = serving_unavailable_reason(root)
    if reason is not None:
        raise FileNotFoundError(reason)
    libdir, purelib, version = _interpreter_paths(root / "bin" / "python")
    triton = Path(purelib) / "pytriton" / "tritonserver"
    backends = Path(tempfile.mkdtemp(prefix="course-triton-backends-"))
    (backends / "python").mkdir()
    for source in (*(triton / "backends" / "python").glob("*.*"),
                   triton / "python_backend_stubs" / version / "triton_python_backend_stub"):  # fmt: skip
        (backends / "python" / source.name).symlink_to(source)
    port = free_port()
    argv = [str(triton / "bin" / "tritonserver"), f"--model-repository={Path(repository).resolve()}",
            f"--backend-directory={backends}", f"--http-address={LOOPBACK_HOST}", f"--http-port={port}",
            "--allow-grpc=false", "--allow-metrics=false", "--allow-gpu-metrics=false", "--log-verbose=0"]  # fmt: skip
    env = {
        "LD_LIBRARY_PATH": libdir,
        "PATH": f"{root.resolve() / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return _start(argv, name="tritonserver", model=model, port=port, remove=[str(backends)], env=env, cwd=None,
                  timeout_s=timeout_s)  # fmt: skip


def start_mlserver(
    folder: str | Path, *, model: str = "churn", venv: str | Path = SERVING_VENV, timeout_s: float = 120.0
) -> InferenceServer:
    """Write ``<folder>/settings.json`` and start ``mlserver start <folder>``; return it when ready.

    Every port MLServer opens (HTTP, gRPC, metrics) is a free one on 127.0.0.1 (its default host is
    0.0.0.0); ``parallel_workers`` is 0, so inference runs in the server's process (no worker pool
    beside it on a 2-core laptop). Raises as :func:`start_triton`.
    """
    timeout_s = positive_number("timeout_s", timeout_s, unit="s")
    root = Path(venv)
    reason = serving_unavailable_reason(root)
    if reason is not None:
        raise FileNotFoundError(reason)
    port = free_port()
    settings = {"host": LOOPBACK_HOST, "http_port": port, "grpc_port": free_port(), "metrics_port": free_port(),
                "parallel_workers": 0, "debug": False, "load_models_at_startup": True}  # fmt: skip
    atomic_write_text(Path(folder) / "settings.json", json.dumps(settings, indent=2))
    argv = [str(root / "bin" / "mlserver"), "start", str(Path(folder).resolve())]
    return _start(argv, name="mlserver", model=model, port=port, remove=[], env={}, cwd=str(folder),
                  timeout_s=timeout_s)  # fmt: skip
