"""What aioloader changes in vLLM so that ``--load-format aioloader`` takes an
object-storage model (``s3://``, ``gs://``, ``az://``) as runai's streamer does.

For such a model vLLM fetches the config and tokenizer into a local folder with
runai's streamer and keeps the URL as ``model_weights`` (which vllm.py's loader
streams), but only for runai's load format, and that fetch's errors name neither
the model nor what to check. ``register`` (vllm.py) applies both patches, once
each; each leaves every other load format and every other error as it was.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RUNAI_CLIENTS",
    "explain_object_storage_fetch",
    "let_object_storage_through",
    "object_storage_fetch_note",
]


def let_object_storage_through(load_format: str) -> None:
    """Let ``--load-format <load_format>`` load an ``s3://``, ``gs://`` or ``az://`` model.

    For such a model vLLM fetches the config and tokenizer into a local folder
    (``ModelConfig.maybe_pull_model_tokenizer_for_runai``) and keeps the URL as
    ``model_weights``, which this loader streams; but ``VllmConfig`` then refuses
    every load format but runai's. Its check sees runai's name while ours is
    checked, and nothing else changes: other formats go through as they were.
    """
    from vllm.config import VllmConfig

    check = VllmConfig.try_verify_and_update_config
    if getattr(check, "_aioloader", False):
        return

    def try_verify_and_update_config(self: Any) -> Any:
        load = self.load_config
        if load is None or load.load_format != load_format:
            return check(self)
        load.load_format = "runai_streamer"
        try:
            return check(self)
        finally:
            load.load_format = load_format

    try_verify_and_update_config._aioloader = True  # type: ignore[attr-defined]
    VllmConfig.try_verify_and_update_config = try_verify_and_update_config


# vLLM fetches an object-storage model's config and tokenizer with runai's streamer, whose
# client for each scheme is a package of its own: scheme -> (package, where the client
# finds the store and its credentials).
RUNAI_CLIENTS: dict[str, tuple[str, str]] = {
    "s3://": ("runai-model-streamer-s3", "the AWS credential chain; AWS_ENDPOINT_URL for "
              "an S3-compatible store"),
    "gs://": ("runai-model-streamer-gcs", "Google's application default credentials, or "
              "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS=1 for a public bucket; "
              "STORAGE_EMULATOR_HOST for an emulator"),
    "az://": ("runai-model-streamer-azure", "AZURE_STORAGE_CONNECTION_STRING, or "
              "AZURE_STORAGE_ACCOUNT_NAME with a key, a SAS token or DefaultAzureCredential"),
}  # fmt: skip


def object_storage_fetch_note(model: str) -> str | None:
    """What to check when vLLM could not fetch ``model``'s config; None for other models."""
    for scheme, (package, credentials) in RUNAI_CLIENTS.items():
        if model.lower().startswith(scheme):
            return (
                f"vLLM fetches the config and tokenizer of {model} with runai's streamer "
                f"before any weights load: check that the bucket or container and the "
                f"prefix exist, that {package} is installed (pip install {package}) and "
                f"that its client finds the store ({credentials})"
            )
    return None


def explain_object_storage_fetch() -> None:
    """Add a note to an error of vLLM's config fetch for an object-storage model.

    That fetch (``ModelConfig.maybe_pull_model_tokenizer_for_runai``) runs before
    any loader, and its errors name neither the model path nor what to do (Azure's
    "The specified container does not exist.", runai's "GCS files module not
    found"). The exception is re-raised as it was, with a note that says both.
    """
    from vllm.config import ModelConfig

    pull = ModelConfig.maybe_pull_model_tokenizer_for_runai
    if getattr(pull, "_aioloader", False):
        return

    def maybe_pull_model_tokenizer_for_runai(self: Any, model: str, tokenizer: str) -> Any:
        try:
            return pull(self, model, tokenizer)
        except Exception as exc:
            note = object_storage_fetch_note(str(model)) or object_storage_fetch_note(
                str(tokenizer)
            )
            if note is not None:
                exc.add_note(note)
            raise

    maybe_pull_model_tokenizer_for_runai._aioloader = True  # type: ignore[attr-defined]
    ModelConfig.maybe_pull_model_tokenizer_for_runai = maybe_pull_model_tokenizer_for_runai
